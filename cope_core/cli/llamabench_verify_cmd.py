"""``cope verify --llama-bench``: race llama.cpp's configurations of a model file with
llama-bench on this machine (docs/cli.md#cope-verify---llama-bench).

    cope verify --llama-bench PATH --model FILE.gguf [--gpu G|none|this] [--cpu C|this]
                [--memory M|this] [--pcie L] [--threads N] [--reps N] [--n-gen N]
                [--max-rounds N] [--tolerance PCT] [--state FILE] [-o OUT [--force]] [--json]

The race runs at :class:`~cope_core.llamacpp.BenchSettings`: a flag left out keeps the record's
default (:func:`bench_settings`); the executor race's defaults never reach it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import CopeInputError
from ..llamacpp import BenchSettings
from .args import (
    add_machine_options,
    add_probe_option,
    check_output,
    machine_from_args,
    settings_from_args,
)

#: BenchSettings' fields the flags set, by the flag's dest (--tolerance in percent): the
#: options of this module and those it shares with ``cope verify`` (verify_cmd.RACE_OPTIONS).
BENCH_FIELDS: dict[str, str] = {
    "reps": "repetitions", "n_gen": "n_gen", "tolerance": "tolerance", "min_rounds": "min_rounds",
    "max_rounds": "max_rounds", "draws": "draws", "seed": "seed"}


def add_arguments(s: argparse.ArgumentParser) -> None:
    """The options of the llama-bench race (beside ``cope verify``'s own)."""
    d = BenchSettings()
    b = s.add_argument_group("with --llama-bench (llama.cpp's configurations)")
    # the path is optional to the parse so that `cope verify --llama-bench --help` is the help
    b.add_argument("--llama-bench", metavar="PATH", nargs="?", const="",
                   help="race llama.cpp's configurations of --model with this llama-bench")
    b.add_argument("--model", metavar="FILE.gguf", help="the GGUF file llama-bench loads")
    add_machine_options(b, ("gpu", "cpu", "memory", "pcie"),
                        defaults={"gpu": "none", "cpu": "this"},
                        notes={"gpu": " (default: none, CPU only)", "cpu": " (default: this)"})
    add_probe_option(b)
    b.add_argument("--reps", type=int, help=f"llama-bench -r per measurement (default "
                                            f"{d.repetitions})")
    b.add_argument("--n-gen", type=int, help=f"llama-bench -n (default {d.n_gen})")
    b.add_argument("--state", help="the race's state file, written after every round; a run "
                                   "given it again resumes (default: OUT.state.json)")
    b.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the llama-bench runs (e.g. GGML_VK_VISIBLE_DEVICES=0)")


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    """The race's settings: BenchSettings with each flag of :data:`BENCH_FIELDS` that was
    given."""
    return settings_from_args(BenchSettings, args, BENCH_FIELDS, percent=("tolerance",))


def cmd_verify_llamabench(args: argparse.Namespace) -> int:
    from ..llamacpp import (
        bench_race_record,
        plan_bench_race,
        probe_bench_build,
        run_bench_race,
        write_bench_record,
    )
    if not args.llama_bench:
        raise CopeInputError("needs the llama-bench to run: --llama-bench PATH",
                             field="--llama-bench")
    if not args.model:
        raise CopeInputError("needs --model FILE.gguf (the file llama-bench loads)",
                             field="--llama-bench")
    if not os.path.isfile(args.model):
        raise CopeInputError("no such file", source=args.model, field="--model")
    settings = bench_settings(args)
    for flag, v, lo in (("--reps", settings.repetitions, 1), ("--n-gen", settings.n_gen, 1),
                        ("--max-rounds", settings.max_rounds, 1),
                        ("--min-rounds", settings.min_rounds, 1)):
        if v < lo:
            raise CopeInputError(f"expected >= {lo}, got {v}", field=flag)
    if args.output:
        check_output(args.output, args.force)
    state = args.state or ((args.output + ".state.json") if args.output else None)
    if state is None:
        raise CopeInputError("give -o OUT or --state FILE (the race resumes from it)",
                             field="--state")
    env = {}
    for item in args.env:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise CopeInputError(f"expected NAME=VALUE, got {item!r}", field="--env")
        env[name] = value
    build = probe_bench_build(args.llama_bench, env)
    if args.threads and len(args.threads) > 1:
        raise CopeInputError(f"expected one thread count with --llama-bench, got {args.threads}",
                             field="--threads")
    machine = machine_from_args(args, threads=args.threads[0] if args.threads else None)
    p = plan_bench_race(args.model, machine, build, settings)
    log = (lambda s: None) if args.no_progress else (lambda s: print(s, file=sys.stderr))
    log("contenders: " + ", ".join(f"{c.name} ({1e6 / c.predicted_us:.1f} tok/s predicted)"
                                   for c in p.contenders))
    st = run_bench_race(p, build, args.model, settings, state, env=env, log=log)
    record = bench_race_record(p, st, build, machine, settings, args.model)
    if args.output:
        write_bench_record(record, args.output, overwrite=args.force)
    if args.json:
        sys.stdout.write(json.dumps(record, indent=1, allow_nan=False) + "\n")
    else:
        print("\n".join(report_lines(record)))
        if args.output:
            print(f"wrote {args.output}")
    return 0


def report_lines(r: dict) -> list[str]:
    """The text report of a ``cope.verify-llamabench/1`` record."""
    v = r["verified"]
    err = "" if v["error_pct"] is None else f", prediction {v['error_pct']:+.1f} %"
    out = [f"cope verify --llama-bench: {r['model']['path']} with {r['llama_bench']['path']} "
           f"({r['stop']} after {r['rounds']} rounds)",
           f"VERIFIED {v['name']} at {v['measured_ts']:.2f} tok/s (predicted "
           f"{v['predicted_ts']:.2f}{err}); "
           + ("the prediction's pick" if r["predicted_pick"] == v["name"] else
              f"predicted {r['predicted_pick']}, "
              + ("within noise of it" if r["agrees"] else "dropped"))]
    for c in r["contenders"]:
        m = "not measured" if c["measured_ts"] is None else f"{c['measured_ts']:.2f} tok/s"
        gone = (f", dropped after round {c['dropped_after_round']}"
                if c["dropped_after_round"] else "")
        out.append(f"  {c['name']}: predicted {c['predicted_ts']:.2f}, measured {m}{gone}")
    for s in r["skipped"]:
        out.append(f"  skipped {s['name']}: {s['why']}")
    f = r.get("refit")
    if f:
        knobs = ", ".join(f"{k['name']} x{k['factor']:.3f}" for k in f["knobs"])
        held = f["mae_held_out_before_pct"], f["mae_held_out_after_pct"]
        out.append(f"  refit: {knobs}; held-out error {held[0]:.1f} % -> {held[1]:.1f} %")
    out.append(f"  run it: {v['command']}")
    return out
