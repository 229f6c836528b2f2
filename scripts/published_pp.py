"""The prompt model against published llama-bench prompt-processing sweeps (docs/design.md#prompt-
processing): its two fitted rates (the host's pageable copy, the scale on every card's published
prompt rate: cope_core/llamacpp/answer/prompt_rates.py) fitted on the sweeps, and every point
priced by a fit that left the point's source out, so each error is on data the fit did not see.

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
    PAGEABLE_COPIES,
    PAGEABLE_PRIOR_GBS,
    Build,
    PromptRun,
    card_efficiency,
    host_pinned,
    latest,
    prompt_time,
    selection_rates,
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
#: the fitted rates' bounds: the pageable copy within the published pageable copies' range; the
#: scale within a factor of two of the cards' published prompt rates
PAGEABLE_BOUNDS = (min(m.value for m in PAGEABLE_COPIES), max(m.value for m in PAGEABLE_COPIES))
SCALE_BOUNDS = (0.5, 2.0)
PRIOR = (PAGEABLE_PRIOR_GBS, 1.0)


@dataclass(frozen=True)
class Sweep:
    """A sweep ready to price: its record, model, machine, build, router skew and threads."""

    rec: dict
    g: ModelGeometry
    spec: PlatformSpec
    build: Build
    rates: np.ndarray
    threads: int
    unpriced: str | None

    @property
    def source(self) -> str:
        return self.rec["source"].split(" (")[0]


@functools.cache
def sweeps() -> tuple[Sweep, ...]:
    out = []
    for s in json.loads(DATA.read_text())["sweeps"]:
        g = resolve_model(s["model"], s["quant"])
        m = compose_machine(gpu=s["gpu"], cpu=s["cpu"] or DEFAULT_CPU, link=s["pcie"])
        assert m.spec is not None
        build = Build(s["build"], "the sweep's") if s["build"] else latest()
        # the router's skew: the model's synthetic trace, made as the shipped examples' are
        trace, _ = synthetic_inputs(g)
        out.append(Sweep(s, g, m.spec, build, selection_rates(trace.routed, g.n_experts),
                         s["threads"] or m.threads,
                         unpriced_reason(g.name, gpu_part(s["gpu"]).vendor)))
    return tuple(out)


def price(sw: Sweep, params: tuple[float, float]) -> list[float]:
    """Each point's predicted tokens/s with the pageable copy (GB/s) and the scale."""
    pageable, scale = params
    spec = replace(sw.spec, host_copy_bandwidth=pageable * 1e9,
                   gpu_prompt_efficiency=card_efficiency(sw.spec.gpu_name) * scale)
    pinned = host_pinned(sw.rec["load_mode"])
    out = []
    for p in sw.rec["points"]:
        host = sw.g.n_layers if p["n_cpu_moe"] == "all" \
            else max(p["n_cpu_moe"] - sw.g.dense_layers, 0)
        run = PromptRun(p["n_prompt"], p.get("depth", 0), p["ubatch"], p["batch"],
                        threads=sw.threads, pinned=pinned)
        out.append(prompt_time(sw.g, spec, host, run, sw.build, sw.rates).tokens_per_s)
    return out


def residuals(params: tuple[float, float], use: list[Sweep]) -> np.ndarray:
    """log(predicted / measured) of every point; a sweep whose GPU is not stated counts for its
    shape only (its mean residual removed)."""
    res = []
    for sw in use:
        r = np.log(np.array(price(sw, params))
                   / np.array([p["tokens_per_s"] for p in sw.rec["points"]]))
        res.append(r if sw.rec["gpu_stated"] else r - r.mean())
    return np.concatenate(res)


def fit(use: list[Sweep]) -> tuple[float, float]:
    """The pageable copy (GB/s) and the scale that fit ``use`` best, within their bounds."""
    lo = np.log([PAGEABLE_BOUNDS[0], SCALE_BOUNDS[0]])
    hi = np.log([PAGEABLE_BOUNDS[1], SCALE_BOUNDS[1]])
    r = least_squares(lambda x: residuals(tuple(np.exp(x)), use), np.log(PRIOR),
                      bounds=(lo, hi), diff_step=1e-3)
    a, b = np.exp(r.x)
    return float(a), float(b)


@functools.cache
def evaluation() -> dict:
    """The fit on every priced sweep, the fit without each source, and every point priced by
    the fit that left its source out."""
    priced = [s for s in sweeps() if s.unpriced is None]
    sources = sorted({s.source for s in priced})
    full = fit(priced)
    held = {src: fit([s for s in priced if s.source != src]) for src in sources}
    return {"full": full, "held": held}


def _errors(by: dict[str, list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Absolute, ratio (settings) and depth-ratio errors (%) of the priced sweeps, each sweep
    priced with the parameters ``by[source]``."""
    errs, ratios, depths = [], [], []
    for sw in sweeps():
        if sw.unpriced is not None:
            continue
        q = price(sw, by[sw.source])
        m = [p["tokens_per_s"] for p in sw.rec["points"]]
        if sw.rec["gpu_stated"]:
            errs += [abs(100 * (a / b - 1)) for a, b in zip(q, m)]
        r = [abs(100 * ((a / q[0]) / (b / m[0]) - 1)) for a, b in zip(q[1:], m[1:])]
        (depths if sw.rec["kind"] == "depth" else ratios).extend(r)
    return errs, ratios, depths


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


@functools.cache
def table() -> tuple[str, dict]:
    """The Markdown block and the summary the data files carry."""
    ev = evaluation()
    held = ev["held"]
    lines = ["| sweep | --n-cpu-moe | -ub | test | measured t/s | predicted t/s | error | "
             "ratio to the first, measured | predicted | ratio error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for sw in sweeps():
        pts = sw.rec["points"]
        q = [math.nan] * len(pts) if sw.unpriced else price(sw, held[sw.source])
        for i, (p, x) in enumerate(zip(pts, q)):
            test = f"pp{p['n_prompt']}" + (f" @ d{p['depth']}" if p.get("depth") else "")
            rm = p["tokens_per_s"] / pts[0]["tokens_per_s"]
            if sw.unpriced:
                cells = ["not priced", "", f"{rm:.2f}", "", ""]
            else:
                rp = x / q[0]
                err = f"{100 * (x / p['tokens_per_s'] - 1):+.1f} %" if sw.rec["gpu_stated"] \
                    else "(GPU not stated)"
                cells = [f"{x:.1f}", err, f"{rm:.2f}", f"{rp:.2f}",
                         "" if i == 0 else f"{100 * (rp / rm - 1):+.1f} %"]
            lines.append(f"| {sw.rec['name']} | {p['n_cpu_moe']} | {p['ubatch']} | {test} | "
                         f"{p['tokens_per_s']:.1f} | " + " | ".join(cells) + " |")
        why = f" **Not priced**: {sw.unpriced}." if sw.unpriced else ""
        notes.append(f"* `{sw.rec['name']}` ({sw.rec['runtime']}, load mode "
                     f"{sw.rec['load_mode']}): {sw.rec['what']} ([source]({sw.rec['source']}))."
                     + why)
    skipped = [f"* {x['source']}: {x['why']}." for x in
               json.loads(DATA.read_text()).get("not_priced", [])]
    srcs = sorted({s.source for s in sweeps() if s.unpriced is None})
    loso = _errors(held)
    inside = _errors({s: ev["full"] for s in srcs})
    prior = _errors({s: PRIOR for s in srcs})
    full = ev["full"]

    def summary(e: tuple[list[float], list[float], list[float]]) -> str:
        return (f"tokens/s {_mean(e[0]):.1f} % over {len(e[0])} points, ratios between "
                f"settings {_mean(e[1]):.1f} % over {len(e[1])}, depth ratios "
                f"{_mean(e[2]):.1f} % over {len(e[2])}")
    held_lines = [f"* without {src}: pageable copy {held[src][0]:.2f} GB/s, scale "
                  f"{held[src][1]:.3f}" for src in srcs]
    text = "\n".join(lines + [
        "", "Each point is priced by the fit that left its source out. Mean absolute error, "
        "held out: " + summary(loso) + " (targets 15 %, 10 %, 10 %).",
        f"With every source in the fit: {summary(inside)}. With the sources' values alone "
        f"(pageable copy {PRIOR[0]:.2f} GB/s, the median of the published pageable copies; "
        f"scale 1): {summary(prior)}.",
        "", f"Fitted on every priced source: pageable copy {full[0]:.2f} GB/s (bounds "
        f"{PAGEABLE_BOUNDS[0]:g}-{PAGEABLE_BOUNDS[1]:g}, the published pageable copies' range), "
        f"scale on the cards' published prompt rates {full[1]:.3f} (bounds "
        f"{SCALE_BOUNDS[0]:g}-{SCALE_BOUNDS[1]:g}); each source left out:", *held_lines,
        "", *notes, "", "Published rows not priced:", *skipped])
    data = {"full": full, "held": {s: held[s] for s in srcs}, "loso": loso, "inside": inside,
            "prior": prior}
    return text, data


def data_files(write: bool) -> list[str]:
    """prompt-fit.json and prompt-error.json; the names of those not current (rewritten when
    ``write``)."""
    _, d = table()
    fit_text = json.dumps({
        "fitted": {
            "pageable_gbs": {"value": round(d["full"][0], 3), "prior": round(PRIOR[0], 3),
                             "bounds": list(PAGEABLE_BOUNDS),
                             "held_out": {s: round(v[0], 3) for s, v in d["held"].items()},
                             "what": "bytes/s (1e9) of a many-MiB host-to-device copy from "
                                     "pageable memory"},
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
                "(abs_error), the ratio between settings of one machine to its sweep's first "
                "(ratio_error), the ratio between depths (depth_ratio_error)",
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
