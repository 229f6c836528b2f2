"""The prompt model against published llama-bench prompt-processing sweeps (docs/design.md#prompt-
processing): the pageable copy's share of the host's staging bandwidth derived from the one
published same-machine A/B of pinned against pageable host experts, the scale on every card's
published prompt rate (cope_core/llamacpp/answer/prompt_rates.py) fitted on the sweeps, and every
point priced by a fit that left the point's source out, so each error is on data the fit did not
see.

    python scripts/published_pp.py [--write | --check]

The sweeps are ``data/published/llamacpp-pp-sweeps.json``, copied with their sources from
../shared/reference/published-pp-2026-12-07.csv; what a source does not state (CPU, PCIe, build)
is the part's default, said in the table. A sweep whose GPU is not stated counts for its ratios
only. ``--write`` puts the table into docs/results.md between its published-pp markers and
writes cope_core/llamacpp/data/prompt-fit.json (the fitted rates) and prompt-error.json (the
held-out errors the request rule and the intervals use); ``--check`` exits 1 when any is not
current (tests/test_llamacpp_prompt.py).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from doc_blocks import block_main  # beside this script, on sys.path when it runs
from scipy.optimize import least_squares

from cope_core.geometry import ModelGeometry
from cope_core.llamacpp import (
    PAGEABLE_PRIOR_SHARE,
    Build,
    PromptRun,
    card_efficiency,
    host_pinned,
    latest,
    prompt_time,
    selection_rates,
    staging_bandwidth,
    unpriced_reason,
)
from cope_core.machine import compose_machine
from cope_core.models import resolve_model
from cope_core.parts import gpu_part
from cope_core.platforms import DEFAULT_CPU, PlatformSpec
from cope_core.trace.synth_defaults import synthetic_inputs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "published" / "llamacpp-pp-sweeps.json"
FIT_FILE = ROOT / "cope_core" / "llamacpp" / "data" / "prompt-fit.json"
ERROR_FILE = ROOT / "cope_core" / "llamacpp" / "data" / "prompt-error.json"
START, END = "<!-- published-pp:start -->", "<!-- published-pp:end -->"
#: the fitted rates' bounds: the pageable copy's share of the staging bandwidth, the scale within
#: a factor of two of the cards' published prompt rates
SHARE_BOUNDS = (0.1, 1.0)
SCALE_BOUNDS = (0.5, 2.0)
PRIOR = (PAGEABLE_PRIOR_SHARE, 1.0)


@dataclass(frozen=True)
class Sweep:
    """A sweep ready to price: its record, model, each point's machine, build, router skew and
    threads, and why it is not priced (None: it is)."""

    rec: dict
    g: ModelGeometry
    specs: tuple[PlatformSpec, ...]
    build: Build
    rates: np.ndarray
    threads: int
    unpriced: str | None

    @property
    def group(self) -> str:
        """The source a held-out fit leaves out (records of one box by one author are one)."""
        return self.rec["group"]


@functools.cache
def sweeps() -> tuple[Sweep, ...]:
    out = []
    for s in json.loads(DATA.read_text())["sweeps"]:
        g = resolve_model(s["model"], s["quant"])
        machines = {}
        for p in s["points"]:
            mem = p.get("memory", s["memory"])
            if mem not in machines:
                machines[mem] = compose_machine(gpu=s["gpu"], cpu=s["cpu"] or DEFAULT_CPU,
                                                memory=mem, link=s["pcie"])
        m0 = next(iter(machines.values()))
        specs = tuple(machines[p.get("memory", s["memory"])].spec for p in s["points"])
        build = Build(s["build"], "the sweep's") if s["build"] else latest()
        # the router's skew: the model's synthetic trace, made as the shipped examples' are
        trace, _ = synthetic_inputs(g)
        out.append(Sweep(s, g, specs, build, selection_rates(trace.routed, g.n_experts),
                         s["threads"] or m0.threads,
                         unpriced_reason(g.name, gpu_part(s["gpu"]).vendor)))
    return tuple(out)


def price(sw: Sweep, params: tuple[float, float]) -> list[float]:
    """Each point's predicted tokens/s with the pageable share and the scale."""
    share, scale = params
    out = []
    for p, spec in zip(sw.rec["points"], sw.specs):
        spec = replace(spec, host_copy_bandwidth=share * staging_bandwidth(spec),
                       gpu_prompt_efficiency=card_efficiency(spec.gpu_name) * scale)
        host = sw.g.n_layers if p["n_cpu_moe"] == "all" \
            else max(p["n_cpu_moe"] - sw.g.dense_layers, 0)
        run = PromptRun(p["n_prompt"], p.get("depth", 0), p["ubatch"], p["batch"],
                        threads=sw.threads,
                        pinned=host_pinned(p.get("load_mode", sw.rec["load_mode"])))
        out.append(prompt_time(sw.g, spec, host, run, sw.build, sw.rates).tokens_per_s)
    return out


def _setting(p: dict, sw: Sweep) -> tuple:
    return (p["n_cpu_moe"], p["ubatch"], p["n_prompt"], p.get("memory", sw.rec["memory"]),
            p.get("load_mode", sw.rec["load_mode"]))


def pairs(sw: Sweep) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(point, reference) index pairs: a setting's ratio to the sweep's first point at the same
    depth, and a depth's ratio to the same setting at its shallowest depth."""
    pts = sw.rec["points"]
    settings, depths = [], []
    for i, p in enumerate(pts):
        d = p.get("depth", 0)
        first = next(j for j, q in enumerate(pts) if q.get("depth", 0) == d)
        if first != i:
            settings.append((i, first))
        twins = [j for j, q in enumerate(pts) if _setting(q, sw) == _setting(p, sw)]
        shallow = min(twins, key=lambda j: pts[j].get("depth", 0))
        if shallow != i:
            depths.append((i, shallow))
    return settings, depths


def residuals(params: tuple[float, float], use: list[Sweep]) -> np.ndarray:
    """log(predicted / measured) of every point; a sweep whose GPU is not stated counts for its
    shape only (its mean residual removed)."""
    res = []
    for sw in use:
        r = np.log(np.array(price(sw, params))
                   / np.array([p["tokens_per_s"] for p in sw.rec["points"]]))
        res.append(r if sw.rec["gpu_stated"] else r - r.mean())
    return np.concatenate(res)


@functools.cache
def pageable_share() -> tuple[float, str]:
    """The pageable copy's share of the staging bandwidth, from the one published same-machine
    A/B of pinned against pageable host experts (the sweep marked ``derive``): the share at which
    the model gives its measured pinned / pageable ratios (the scale at its prior, 1), and that
    sweep's source."""
    sw = next(s for s in sweeps() if s.rec.get("derive") == "pageable_share")
    m = [p["tokens_per_s"] for p in sw.rec["points"]]
    pins = [i for i, p in enumerate(sw.rec["points"]) if p.get("load_mode") == "none"]
    twin = {i: next(j for j, q in enumerate(sw.rec["points"]) if j not in pins
                    and _setting(q, sw)[:3] == _setting(sw.rec["points"][i], sw)[:3])
            for i in pins}

    def res(x: np.ndarray) -> np.ndarray:
        q = price(sw, (float(np.exp(x[0])), PRIOR[1]))
        return np.array([math.log((q[i] / q[j]) / (m[i] / m[j])) for i, j in twin.items()])
    r = least_squares(res, [math.log(PRIOR[0])], bounds=(math.log(SHARE_BOUNDS[0]),
                                                           math.log(SHARE_BOUNDS[1])))
    return float(np.exp(r.x[0])), sw.rec["source"]


def fit(use: list[Sweep]) -> tuple[float, float]:
    """The scale that fits ``use`` best within its bounds, with the derived pageable share."""
    share = pageable_share()[0]
    r = least_squares(lambda x: residuals((share, float(np.exp(x[0]))), use), [0.0],
                      bounds=(math.log(SCALE_BOUNDS[0]), math.log(SCALE_BOUNDS[1])),
                      diff_step=1e-3)
    return share, float(np.exp(r.x[0]))


@functools.cache
def evaluation() -> dict:
    """The fit on every priced sweep, the fit without each source, and every point priced by
    the fit that left its source out."""
    priced = [s for s in sweeps() if s.unpriced is None]
    groups = sorted({s.group for s in priced})
    full = fit(priced)
    held = {grp: fit([s for s in priced if s.group != grp]) for grp in groups}
    return {"full": full, "held": held}


def _errors(by: dict[str, tuple[float, float]]
            ) -> tuple[list[float], list[float], list[float]]:
    """Absolute, ratio (settings) and depth-ratio errors (%) of the priced sweeps, each sweep
    priced with the parameters ``by[group]``."""
    errs, ratios, depths = [], [], []
    for sw in sweeps():
        if sw.unpriced is not None:
            continue
        q = price(sw, by[sw.group])
        m = [p["tokens_per_s"] for p in sw.rec["points"]]
        if sw.rec["gpu_stated"]:
            errs += [abs(100 * (a / b - 1)) for a, b in zip(q, m)]
        sets, deps = pairs(sw)
        ratios += [abs(100 * ((q[i] / q[j]) / (m[i] / m[j]) - 1)) for i, j in sets]
        depths += [abs(100 * ((q[i] / q[j]) / (m[i] / m[j]) - 1)) for i, j in deps]
    return errs, ratios, depths


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _cell(q: list[float], m: list[float], i: int, j: int | None) -> list[str]:
    if j is None:
        return ["", "", ""]
    rm, rp = m[i] / m[j], q[i] / q[j]
    return [f"{rm:.2f}", f"{rp:.2f}", f"{100 * (rp / rm - 1):+.1f} %"]


@functools.cache
def table() -> tuple[str, dict]:
    """The Markdown block and the summary the data files carry."""
    ev = evaluation()
    held = ev["held"]
    lines = ["| sweep | --n-cpu-moe | -ub | test | setting | measured t/s | predicted t/s | "
             "error | ratio, measured | predicted | error | depth ratio, measured | predicted "
             "| error |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for sw in sweeps():
        pts = sw.rec["points"]
        m = [p["tokens_per_s"] for p in pts]
        q = [math.nan] * len(pts) if sw.unpriced else price(sw, held[sw.group])
        sets, deps = (dict(x) for x in pairs(sw))
        for i, p in enumerate(pts):
            test = f"pp{p['n_prompt']}" + (f" @ d{p['depth']}" if p.get("depth") else "")
            what = ", ".join(x for x in (p.get("memory"), {"none": "pinned"}.get(
                p.get("load_mode", ""))) if x) or ""
            if sw.unpriced:
                cells = ["not priced", "", "", "", "", "", "", ""]
            else:
                err = f"{100 * (q[i] / m[i] - 1):+.1f} %" if sw.rec["gpu_stated"] \
                    else "(GPU not stated)"
                cells = [f"{q[i]:.1f}", err, *_cell(q, m, i, sets.get(i)),
                         *_cell(q, m, i, deps.get(i))]
            lines.append(f"| {sw.rec['name']} | {p['n_cpu_moe']} | {p['ubatch']} | {test} | "
                         f"{what} | {m[i]:.1f} | " + " | ".join(cells) + " |")
        why = f" **Not priced**: {sw.unpriced}." if sw.unpriced else ""
        notes.append(f"* `{sw.rec['name']}` ({sw.rec['runtime']}, load mode "
                     f"{sw.rec['load_mode']}): {sw.rec['what']} ([source]({sw.rec['source']}))."
                     + why)
    skipped = [f"* {x['source']}: {x['why']}." for x in
               json.loads(DATA.read_text()).get("not_priced", [])]
    groups = sorted({s.group for s in sweeps() if s.unpriced is None})
    loso = _errors(held)
    inside = _errors({g: ev["full"] for g in groups})
    prior = _errors({g: PRIOR for g in groups})
    full = ev["full"]

    def summary(e: tuple[list[float], list[float], list[float]]) -> str:
        return (f"tokens/s {_mean(e[0]):.1f} % over {len(e[0])} points, ratios between "
                f"settings {_mean(e[1]):.1f} % over {len(e[1])}, depth ratios "
                f"{_mean(e[2]):.1f} % over {len(e[2])}")
    held_lines = [f"* without {g}: scale {held[g][1]:.3f}" for g in groups]
    share, share_source = pageable_share()
    text = "\n".join(lines + [
        "", "A setting's ratio is to the sweep's first point at the same depth; a depth's to the "
        "same setting at its shallowest depth. Each point is priced by the fit that left its "
        "source out. Mean absolute error, held out: " + summary(loso)
        + " (targets 15 %, 10 %, 10 %).",
        f"With every source in the fit: {summary(inside)}. With the sources' values alone "
        f"(pageable share {PRIOR[0]:.2f}, scale 1): {summary(prior)}.",
        "", f"The pageable copy runs at {share:.3f} of the host's staging bandwidth: the share at "
        "which the model gives the one published same-machine A/B of pinned against pageable "
        f"host experts ([source]({share_source}); its pinned / pageable ratios are therefore "
        "not held out of this constant). Fitted on every priced source: the cards' published "
        f"prompt rates scaled by {full[1]:.3f} (bounds {SCALE_BOUNDS[0]:g}-{SCALE_BOUNDS[1]:g});"
        " each source left out:", *held_lines,
        "", *notes, "", "Published rows not priced:", *skipped])
    data = {"full": full, "held": {g: held[g] for g in groups}, "loso": loso,
            "inside": inside, "prior": prior}
    return text, data


def data_files(write: bool) -> list[str]:
    """prompt-fit.json and prompt-error.json; the names of those not current (rewritten when
    ``write``)."""
    _, d = table()
    fit_text = json.dumps({
        "fitted": {
            "pageable_share": {"value": round(d["full"][0], 4), "prior": PRIOR[0],
                               "bounds": list(SHARE_BOUNDS),
                               "derived_from": pageable_share()[1],
                               "what": "a many-MiB host-to-device copy from pageable memory, "
                                       "as a share of the host's staging bandwidth "
                                       "(prompt_rates.staging_bandwidth): the share at which "
                                       "the model gives the published pinned / pageable "
                                       "ratios of one machine"},
            "gpu_rate_scale": {"value": round(d["full"][1], 4), "prior": PRIOR[1],
                               "bounds": list(SCALE_BOUNDS),
                               "held_out": {s: round(v[1], 4) for s, v in d["held"].items()},
                               "what": "factor on every card's published prompt efficiency"}},
        "written_by": "python scripts/published_pp.py --write"}, indent=1) + "\n"
    loso = d["loso"]
    err_text = json.dumps({
        "ratio_error": round(_mean(loso[1]) / 100, 3), "ratios": len(loso[1]),
        "abs_error": round(_mean(loso[0]) / 100, 3), "points": len(loso[0]),
        "depth_ratio_error": round(_mean(loso[2]) / 100, 3), "depth_ratios": len(loso[2]),
        "what": "mean |predicted / measured - 1| on the published pp sweeps of docs/results.md, "
                "each point priced by the fit that left its source out: tokens/s "
                "(abs_error), a setting's ratio to its sweep's first setting at the same depth "
                "(ratio_error), a depth's ratio to the same setting's shallowest "
                "(depth_ratio_error)",
        "written_by": "python scripts/published_pp.py --write"}, indent=1) + "\n"
    stale = []
    for path, text in ((FIT_FILE, fit_text), (ERROR_FILE, err_text)):
        if path.exists() and path.read_text() == text:
            continue
        if write:
            partial = path.with_suffix(".json.partial")
            partial.write_text(text)
            partial.replace(path)
        stale.append(str(path.relative_to(ROOT)))
    return stale


def main() -> int:
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "results.md", START, END,
                      lambda: table()[0], also=data_files)


if __name__ == "__main__":
    raise SystemExit(main())
