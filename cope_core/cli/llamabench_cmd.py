"""``cope evaluate --llama-bench FILE``: a prediction for a model file and machine scored against
llama-bench's results (:mod:`cope_core.llamacpp.bench.bench_eval`).

    cope evaluate --llama-bench bench.json --model M.gguf
                  (--profile P | --gpu GPU [--cpu CPU] [--memory MEM] [--pcie LINK])
                  [--threads N] [--gpu-share S] [--json]
"""
from __future__ import annotations

import argparse
import os

from .. import parquet_io
from ..errors import CopeInputError
from ..files import check_writable, print_json
from ..llamacpp import (
    BenchEvaluation,
    Cards,
    match_bench_rows,
    read_llama_bench,
    read_llama_model,
    refit_lines,
    refit_prompt,
    score_bench_rows,
    write_prompt_refit,
)
from ..platforms import DEFAULT_CPU
from .args import add_machine_options, machine_from_args, model_from_args, renamed


def add_options(s: argparse.ArgumentParser) -> None:
    """The machine options of ``--llama-bench`` beside ``--profile``: an analytic profile of a
    machine composed from parts (:func:`.args.machine_from_args`), spelled as every
    command spells a machine (``--threads`` is the operating point of :func:`_inputs`)."""
    add_machine_options(s, ("gpu", "cpu", "memory", "pcie"), helps={
        "gpu": "with --llama-bench, instead of --profile: price on an analytic profile of this "
               "GPU (`cope parts gpus`, a GPU part file, or 'this')"},
        notes={"cpu": f" (default {DEFAULT_CPU})"}, prefix="")
    renamed(s, "--analytic", "--gpu")
    s.add_argument("--refit", metavar="OUT.json",
                   help="with --llama-bench and --gpu: refit the prompt model's rates (the GPU's "
                        "prompt rate, the pageable copy) on the prompt rows and write them to "
                        "OUT.json, for --prompt-refit")


#: The machine flags that only --llama-bench reads
MACHINE_ONLY = ("gpu", "cpu", "memory", "pcie")


def cmd_llama_bench(args: argparse.Namespace) -> int:
    for flag in ("trace", "calibration", "spec"):
        if getattr(args, flag, None):
            raise CopeInputError("is not used with --llama-bench (the placements it measured "
                                 "need no routing trace)", field=f"--{flag}")
    if not args.model or not os.path.isfile(args.model):
        raise CopeInputError("--llama-bench needs the GGUF file it measured: --model FILE.gguf",
                             field="--model")
    rows = read_llama_bench(args.llama_bench)
    lm = read_llama_model(args.model)
    g = model_from_args(args)
    if (args.profile is None) == (args.gpu is None):
        raise CopeInputError("--llama-bench needs the machine: --profile FILE or --gpu GPU "
                             "(one of them)", field="--profile")
    spec = None                                   # prompt rows are priced from its peaks
    cards = None                                  # several cards: rows on several devices
    if args.profile is not None:
        profile = parquet_io.read_profile(args.profile)
        what = f"profile {args.profile}"
    else:
        from ..profile.analytic import analytic_profile
        # --threads is the operating point here, not the machine's
        m = machine_from_args(args, cpu=args.cpu or DEFAULT_CPU, threads=None)
        if m.spec is None:
            raise CopeInputError("an analytic profile needs a GPU: COPE prices offload "
                                 "placements", field="--gpu")
        threads = sorted({r.n_threads for r in rows if r.n_threads is not None}
                         | ({args.threads} if args.threads else set())) or [m.threads]
        profile, spec = analytic_profile(g, m.spec, cpu_threads=threads), m.spec
        cards = Cards.of(m) if len(m.cards) > 1 else None
        what = f"analytic profile of {m.spec.name} (not measured)"
    refit_out = getattr(args, "refit", None)
    if refit_out is not None:
        if spec is None:
            raise CopeInputError("refits the prompt model on a machine's peaks: give --gpu, not "
                                 "--profile", field="--refit")
        check_writable(refit_out)
    ev = score_bench_rows(match_bench_rows(rows, lm, g, profile, cpu_threads=args.threads,
                                           gpu_share=args.gpu_share, spec=spec, cards=cards))
    refit = None
    if refit_out is not None:
        assert spec is not None
        refit = refit_prompt(ev.matches, g, spec)
        write_prompt_refit(refit_out, refit, spec, os.fspath(args.llama_bench))
    if args.json:
        print_json({"llama_bench": os.fspath(args.llama_bench), "model": args.model,
                    "profile": what, **ev.to_dict(),
                    **({} if refit is None else {"prompt_refit": {
                        "path": refit_out, **refit.to_dict()}})})
        return 0
    print(f"llama-bench {args.llama_bench}: {len(rows)} rows | model {args.model} | {what}")
    print("\n".join(text_lines(ev)))
    if refit is not None and refit_out is not None:
        print("\n".join(refit_lines(refit, refit_out)))
    return 0


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def text_lines(ev: BenchEvaluation) -> list[str]:
    """The rows as a table (matched ones with their prediction, the others with why) and the
    scores over the matched rows."""
    head = ("line", "test", "ngl", "ncmoe", "ot", "threads", "measured t/s", "predicted",
            "error")
    table = [head]
    why = []
    for x in ev.matches:
        r = x.row
        table.append((str(r.line), r.test, _num(r.n_gpu_layers, "d"), str(r.n_cpu_moe), r.ot,
                      _num(r.n_threads, "d"), f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}",
                      _num(x.predicted_ts, ".2f"),
                      "unmatched" if not x.matched else f"{x.error_pct:+.1f} %"))
        if not x.matched:
            why.append(f"  line {r.line}: {x.reason}")
    w = [max(len(t[i]) for t in table) for i in range(len(head))]
    out = ["  ".join(c.ljust(w[i]) for i, c in enumerate(t)).rstrip() for t in table]
    if why:
        out += ["unmatched rows (not guessed):", *why]
    if not ev.matched:
        out.append("no row matched a configuration COPE prices: nothing scored")
        return out
    n_pp = 0 if ev.prompt is None else ev.prompt.matched
    kinds = [(len(ev.matched) - n_pp, "matched rows", ev.mean_abs_error_pct, ev.spearman,
              ev.pick, ev.best, ev.regret_pct)]
    if ev.prompt is not None:
        p = ev.prompt
        kinds.append((n_pp, "matched prompt rows", p.mean_abs_error_pct, p.spearman, p.pick,
                      p.best, p.regret_pct))
    for n, what, mae, rho, pick_i, best_i, regret in kinds:
        if not n:
            continue
        pick, best = ev.matches[pick_i or 0].row, ev.matches[best_i or 0].row
        out.append(f"{n} {what}: mean absolute error {mae:.1f} %, Spearman "
                   + ("-" if rho is None else f"{rho:.3f}")
                   + f"; COPE's pick (line {pick.line}) measured {pick.avg_ts:.2f} t/s, the "
                     f"fastest (line {best.line}) {best.avg_ts:.2f} t/s: regret {regret:.1f} %")
    return out
