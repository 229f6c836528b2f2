"""The model's measured error on absolute TPOT, and the held-out coverage of the intervals it
makes (docs/design.md#uncertainty): writes data/model-error.json, which the library reads
(cope_core.estimate.model_error), and its entry in data/manifest.json and data/README.md.

Every evaluation we can run is one *group*: the shipped measured example (cope evaluate on
data/examples/deepseek-v2-lite-4l-*), each setting of the controlled grid
(data/platforms/cpu-emulated-grid/), and each published llama-bench sweep
(data/published/, predicted as scripts/published_sweeps.py does). A point is one (cell,
candidate) — or one published N — with ``e = log(measured / predicted)`` of the prompt-mean
TPOT. Per estimator, ``sigma_log`` is the root mean square of ``e`` with every group weighted
alike (a group's bias counts as error: the model is not re-centred, so the interval stays
around the point). Coverage is scored **held out by group**: each group's points against
intervals whose ``sigma_log`` comes from the other groups only. "Before" is the draws' spread
alone (what the intervals were), "after" the same widened by the held-out model error
(:func:`cope_core.estimate.model_error.widen`).

    python scripts/model_error.py [--check]

The result does not depend on the file's current content (it reads the draws' interval, not the
calibrated one). ``--check`` exits 1 when the file is not current.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from cope_core import parquet_io as pio
from cope_core.estimate.evaluate import evaluation_pairs
from cope_core.estimate.model_error import (
    MODEL_ERROR_FILE,
    SCHEMA,
    ModelError,
    half_widths,
    widen,
    z_of,
)
from cope_core.estimate.noise import CELL, measured_cells
from cope_core.estimate.uncertainty import LEVEL
from cope_core.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import published_sweeps as ps  # noqa: E402
from make_data_readme import render  # noqa: E402

EX = "data/examples/deepseek-v2-lite-4l-"
GRID = "data/platforms/cpu-emulated-grid/"
MEASURED = {"measured-example": (EX + "trace.parquet", EX + "calibration.parquet",
                                 EX + "cpu-emulated-profile.parquet",
                                 EX + "cpu-emulated-measurements.parquet")}
MEASURED |= {f"grid-{s}": (GRID + "trace.parquet", GRID + "calibration.parquet",
                           GRID + f"profile-{s}.parquet", GRID + f"measurements-{s}.parquet")
             for s in ("link-1-slow-1", "link-4-slow-2", "link-unpaced-slow-4")}
ESTIMATORS = ("cope", "atomic", "hrm")
COMMAND = "python scripts/model_error.py"


def measured_group(files: tuple[str, ...]) -> dict[str, pd.DataFrame]:
    """Per estimator: one row per (cell, candidate) with the prediction, the draws' interval
    around it and the measurement."""
    trace, cal, prof, meas = files
    t, c, p, m = (pio.read_trace(ROOT / trace), pio.read_trace(ROOT / cal),
                  pio.read_profile(ROOT / prof), pio.read_measurements(ROOT / meas))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pairs = evaluation_pairs(t, p, m, c, estimators=ESTIMATORS)
    cells = measured_cells(m.table, draws=0).set_index(CELL + ["candidate"])["tpot_us"]
    out = {}
    for est, pr in pairs.items():
        g = pr.groupby(CELL + ["candidate"]).agg(
            predicted=("predicted_us", "mean"), lo=("predicted_draws_lo_us", "first"),
            hi=("predicted_draws_hi_us", "first"))
        out[est] = g.join(cells.rename("measured"), how="inner").reset_index()
    return out


def published_groups() -> dict[str, pd.DataFrame]:
    """Each published sweep: its points as (predicted, measured) TPOT; no draws (the plain
    placement's analytic price has none), so the interval before is the point itself."""
    out = {}
    for sweep in ps.load():
        pts = ps.predict(sweep)
        pred = np.array([1e6 / p.predicted_tps for p in pts])
        out[f"published-{sweep['id']}"] = pd.DataFrame({
            "K": [p.n_cpu_moe for p in pts], "predicted": pred, "lo": pred, "hi": pred,
            "measured": [1e6 / p.published_tps for p in pts]})
    return out


def _rms(groups: dict[str, pd.DataFrame]) -> float:
    return float(np.sqrt(np.mean([np.mean(np.log(g.measured / g.predicted) ** 2)
                                  for g in groups.values()])))


def _covered(g: pd.DataFrame, sigma: float) -> np.ndarray:
    h_lo, h_hi = half_widths(g.predicted.to_numpy(), g.lo.to_numpy(), g.hi.to_numpy())
    lo, hi = widen(g.predicted.to_numpy(), h_lo, h_hi, LEVEL, sigma)
    return (lo <= g.measured.to_numpy()) & (g.measured.to_numpy() <= hi)


def interval_sigma(groups: dict[str, pd.DataFrame]) -> tuple[float, float]:
    """The ``sigma_log`` intervals take from ``groups``, and its factor over their RMS.

    A new machine is a new group, and its error is predicted from few groups' RMS: the interval
    is a prediction interval with the variance estimated on ``g - 1`` degrees of freedom, so
    Student's t quantile stands in for the normal one (the library widens by ``z * sigma``;
    ``sigma`` carries ``t / z``, at the file's level)."""
    g = len(groups)
    factor = float(stats.t.ppf(0.5 + LEVEL / 2, g - 1) / z_of(LEVEL)) if g > 1 else 1.0
    return _rms(groups) * factor, factor


def held_out(groups: dict[str, pd.DataFrame]) -> dict:
    """Coverage of each group's points, before (the draws alone) and after (with the model error
    of the *other* groups, as :func:`interval_sigma` carries it)."""
    per, before, after = {}, [], []
    for gid, g in groups.items():
        sigma, _ = interval_sigma({k: v for k, v in groups.items() if k != gid})
        b, a = _covered(g, 0.0), _covered(g, sigma)
        per[gid] = {"sigma_log_of_the_others": round(sigma, 4), "points": len(g),
                    "coverage_before": round(float(b.mean()), 4),
                    "coverage_after": round(float(a.mean()), 4)}
        before.append(b)
        after.append(a)
    return {"per_group": per,
            "pooled_before": round(float(np.concatenate(before).mean()), 4),
            "pooled_after": round(float(np.concatenate(after).mean()), 4),
            "points": int(sum(len(b) for b in before))}


def _weighted_quantile(values: list[np.ndarray], q: float) -> float:
    """The ``q`` quantile of the pooled values, each group's values weighted 1/size."""
    v = np.concatenate(values)
    w = np.concatenate([np.full(len(x), 1.0 / len(x)) for x in values])
    order = np.argsort(v)
    cum = np.cumsum(w[order]) / w.sum()
    return float(v[order][np.searchsorted(cum, q)])


def ratio_errors(groups: dict[str, pd.DataFrame]) -> list[np.ndarray]:
    """Per group, |log| of predicted over measured ratios: every pair of candidates in a cell
    that the prediction tells apart, and every published N against the sweep's first."""
    out = []
    for gid, g in groups.items():
        e = np.log(g.measured / g.predicted).to_numpy()
        if gid.startswith("published-"):
            out.append(np.abs(e[1:] - e[0]))
            continue
        parts = []
        for _, cell in g.assign(e=e).groupby(CELL):
            ce, cp = cell.e.to_numpy(), cell.predicted.to_numpy()
            i, j = np.triu_indices(len(ce), 1)
            keep = cp[i] != cp[j]              # the same policy here is no ratio
            parts.append(np.abs(ce[i] - ce[j])[keep])
        out.append(np.concatenate(parts))
    return out


@contextlib.contextmanager
def _without_the_file() -> Iterator[None]:
    """The draws' interval this script reads does not depend on data/model-error.json; a zero
    error stands in for it, so that a missing or outdated file can be rebuilt. Restored on
    exit: run in-process (the tests call ``main``), the stand-in must not outlive the build."""
    zero = ModelError({}, 0.0, 0.0, "none (being rebuilt)")
    modules = [importlib.import_module(name) for name in
               ("cope_core.estimate.predict", "cope_core.estimate.uncertainty")]
    saved = [m.model_error for m in modules]
    for m in modules:
        m.model_error = lambda: zero
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.model_error = f


def build() -> dict:
    with _without_the_file():
        return _build()


def _build() -> dict:
    measured = {gid: measured_group(files) for gid, files in MEASURED.items()}
    published = published_groups()
    doc: dict = {"schema": SCHEMA, "level": LEVEL, "made_by": COMMAND,
                 "about": "The model's measured error on absolute TPOT: per estimator rms_log, "
                          "the root mean square of log(measured / predicted), every evaluated "
                          "group weighted alike, and sigma_log = rms_log * t_over_z (Student's t "
                          "on groups - 1 degrees of freedom over the normal quantile, at level: "
                          "a new machine is a new group); intervals on absolute speed widen the "
                          "draws' spread by z * sigma_log in quadrature "
                          "(docs/design.md#uncertainty). held_out: coverage "
                          "of 95 % intervals on each group's points with the other groups' "
                          "error, before (the draws alone) and after.",
                 "estimators": {}, "held_out": {}, "groups": {}}
    for est in ESTIMATORS:
        groups = {gid: m[est] for gid, m in measured.items()}
        if est == "cope":   # the published points are priced by cope's rows (analytic)
            groups |= published
        sigma, factor = interval_sigma(groups)
        doc["estimators"][est] = {"sigma_log": round(sigma, 4), "rms_log": round(_rms(groups), 4),
                                  "t_over_z": round(factor, 4), "groups": len(groups),
                                  "points": int(sum(len(g) for g in groups.values()))}
        doc["held_out"][est] = held_out(groups)
        for gid, g in groups.items():
            e = np.log(g.measured / g.predicted)
            doc["groups"].setdefault(gid, {"sources": list(MEASURED.get(gid, (str(
                ps.DATA.relative_to(ROOT)),))), "estimators": {}})
            doc["groups"][gid]["estimators"][est] = {
                "points": len(g), "mean_log": round(float(e.mean()), 4),
                "rms_log": round(float(np.sqrt((e ** 2).mean())), 4),
                "max_abs_log": round(float(e.abs().max()), 4)}
    cope_groups = {gid: m["cope"] for gid, m in measured.items()} | published
    ratios = ratio_errors(cope_groups)
    doc["ratio"] = {"median_pct": round(100 * (np.exp(_weighted_quantile(ratios, 0.5)) - 1), 2),
                    "p95_pct": round(100 * (np.exp(_weighted_quantile(ratios, 0.95)) - 1), 2),
                    "ratios": int(sum(len(r) for r in ratios)),
                    "about": "median and 95th percentile (groups weighted alike) of |predicted / "
                             "measured ratio - 1| of cope's ratios between candidates in a cell "
                             "and between a published sweep's N and its first; not held out"}
    return doc


MANIFEST_ENTRY = {
    "kind": "report",
    "what": "the model's measured error on absolute TPOT per estimator (root mean square of "
            "log(measured / predicted) over the measured example, the emulated grid and the "
            "published sweeps), the error of predicted ratios, and the held-out coverage of "
            "the 95 % intervals before and after adding it; read by "
            "cope_core.estimate.model_error",
    "commands": [COMMAND],
    "provenance": ["computed here from examples/deepseek-v2-lite-4l-*, "
                   "platforms/cpu-emulated-grid/ and published/llamacpp-ncmoe-sweeps.json"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    args = ap.parse_args(argv)
    text = json.dumps(build(), indent=1) + "\n"
    rel = str(MODEL_ERROR_FILE.relative_to(ROOT / "data"))
    if args.check:
        current = MODEL_ERROR_FILE.exists() and MODEL_ERROR_FILE.read_text() == text
        print("current" if current else f"not current: run {COMMAND}")
        return 0 if current else 1
    write_atomic(MODEL_ERROR_FILE, text, overwrite=True)
    manifest_path = ROOT / "data" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if manifest.get(rel) != MANIFEST_ENTRY:
        manifest[rel] = MANIFEST_ENTRY
        manifest = dict(sorted(manifest.items()))
        write_atomic(manifest_path, json.dumps(manifest, indent=1) + "\n", overwrite=True)
    write_atomic(ROOT / "data" / "README.md", render(manifest, ROOT / "data"), overwrite=True)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
