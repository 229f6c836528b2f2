"""The prompt model against published llama-bench prompt-processing sweeps (docs/design.md#prompt-
processing): each point priced by :func:`cope_core.llamacpp.prompt_time` on the machine's
published peaks and the router's skew of the model's synthetic trace (nothing fitted to these
points), absolute tokens/s and the ratio to the sweep's
first point (which cancels most machine constants).

    python scripts/published_pp.py [--write | --check]

The sweeps are ``data/published/llamacpp-pp-sweeps.json``, copied with their sources from
../shared/reference/published-pp-2026-12-07.csv; what a source does not state (CPU, PCIe, build)
is the part's default, said in the table. ``--write`` puts the table into docs/results.md between
its published-pp markers; ``--check`` exits 1 when it is not current
(tests/test_llamacpp_prompt.py).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from doc_blocks import block_main  # beside this script, on sys.path when it runs

from cope_core.llamacpp import Build, PromptRun, latest, prompt_time, selection_rates
from cope_core.machine import compose_machine
from cope_core.models import resolve_model
from cope_core.platforms import DEFAULT_CPU
from cope_core.trace.synth_defaults import synthetic_inputs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "published" / "llamacpp-pp-sweeps.json"
START, END = "<!-- published-pp:start -->", "<!-- published-pp:end -->"


def priced(sweep: dict) -> list[tuple[dict, float]]:
    """Each point with its predicted tokens/s."""
    g = resolve_model(sweep["model"], sweep["quant"])
    m = compose_machine(gpu=sweep["gpu"], cpu=sweep["cpu"] or DEFAULT_CPU,
                        link=sweep["pcie"])
    assert m.spec is not None
    build = Build(sweep["build"], "the sweep's") if sweep["build"] else latest()
    # the router's skew: the model's synthetic trace, made as the shipped examples' are
    trace, _ = synthetic_inputs(g)
    rates = selection_rates(trace.routed, g.n_experts)
    threads = sweep["threads"] or m.threads
    out = []
    for p in sweep["points"]:
        host = g.n_layers if p["n_cpu_moe"] == "all" else max(p["n_cpu_moe"] - g.dense_layers, 0)
        run = PromptRun(p["n_prompt"], 0, p["ubatch"], p["batch"], threads=threads)
        out.append((p, prompt_time(g, m.spec, host, run, build, rates).tokens_per_s))
    return out


@functools.cache
def table() -> tuple[str, list[float], list[float]]:
    """The Markdown table and every point's absolute and ratio error (%)."""
    data = json.loads(DATA.read_text())
    lines = ["| sweep | --n-cpu-moe | -ub | test | measured t/s | predicted t/s | error | "
             "ratio to the first, measured | predicted | ratio error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    errs, ratio_errs, notes, per = [], [], [], []
    for s in data["sweeps"]:
        pts = priced(s)
        start = len(errs)
        (p0, q0) = pts[0]
        for p, q in pts:
            err = 100 * (q / p["tokens_per_s"] - 1)
            rm, rp = p["tokens_per_s"] / p0["tokens_per_s"], q / q0
            rerr = 100 * (rp / rm - 1)
            errs.append(abs(err))
            if p is not p0:
                ratio_errs.append(abs(rerr))
            lines.append(f"| {s['name']} | {p['n_cpu_moe']} | {p['ubatch']} | pp{p['n_prompt']} "
                         f"| {p['tokens_per_s']:.1f} | {q:.1f} | {err:+.1f} % | {rm:.2f} | "
                         f"{rp:.2f} | " + ("" if p is p0 else f"{rerr:+.1f} %") + " |")
        mine = errs[start:]
        per.append(f"`{s['name']}` {sum(mine) / len(mine):.1f} %")
        notes.append(f"* `{s['name']}`: {s['what']} ([source]({s['source']})).")
    mean = sum(errs) / len(errs)
    rmean = sum(ratio_errs) / len(ratio_errs)
    text = "\n".join(lines + ["", f"Mean absolute error {mean:.1f} % over {len(errs)} points "
                              f"(target 15 %); ratio error {rmean:.1f} % over "
                              f"{len(ratio_errs)} ratios (target 10 %). Mean absolute error "
                              "per sweep: " + ", ".join(per) + ".", ""] + notes)
    return text, errs, ratio_errs


def error_file(ratio_errs: list[float], write: bool) -> list[str]:
    """cope_core/llamacpp/data/prompt-error.json: the mean ratio error the request's rule gives
    every time to first token (cope_core.llamacpp.answer.request.PROMPT_RATIO_ERROR); the names
    of the
    files not current (rewritten when ``write``)."""
    path = ROOT / "cope_core" / "llamacpp" / "data" / "prompt-error.json"
    text = json.dumps({"ratio_error": round(sum(ratio_errs) / len(ratio_errs) / 100, 3),
                       "ratios": len(ratio_errs),
                       "what": "mean |predicted / measured - 1| of the ratio between settings "
                               "of one machine to its sweep's first, over the published pp "
                               "sweeps of docs/results.md",
                       "written_by": "python scripts/published_pp.py --write"}, indent=1) + "\n"
    if path.exists() and path.read_text() == text:
        return []
    if write:
        partial = path.with_suffix(".json.partial")
        partial.write_text(text)
        partial.replace(path)
    return [str(path.relative_to(ROOT))]


def main() -> int:
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "results.md", START, END,
                      lambda: table()[0], also=lambda write: error_file(table()[2], write))


if __name__ == "__main__":
    raise SystemExit(main())
