"""``cope verify``: race the predicted contenders on this machine and name the verified winner
(docs/design.md#verifying-a-pick).

    cope verify --trace T --calibration C --profile P (-K 8,16 | --vram-gib G)
                [--threads 1,2] [--tolerance PCT] [--budget-min M] [--json] [-o OUT]
    cope verify --llama-bench PATH --model FILE.gguf [machine flags] (llamabench_verify_cmd)

The two races share the options of :data:`RACE_OPTIONS`, and each fills one left out from its
own settings record: :class:`~cope_core.verify.VerifySettings` here, ``BenchSettings`` with
--llama-bench; the help reads both records' defaults.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import TYPE_CHECKING

from .. import parquet_io
from ..errors import CopeInputError
from ..estimate.speed import tokens_per_s
from ..llamacpp import BenchSettings
from ..verify import VerifyRecord, verify_json, write_verify
from .args import (
    add_input_options,
    add_machine_options,
    check_output,
    ints,
    settings_from_args,
    share,
)
from .llamabench_verify_cmd import BENCH_FIELDS, add_arguments, cmd_verify_llamabench
from .measure_cmd import emulation_arguments, prepare_threads

if TYPE_CHECKING:   # at run time only when a race runs or its help is printed (torch beside it)
    from ..verify import VerifySettings

#: The race's options, by dest: type and words (their defaults are the records'). Each is None
#: when left out and takes VerifySettings' field of the same name, or with --llama-bench
#: BenchSettings' (llamabench_verify_cmd.BENCH_FIELDS), where it has one.
RACE_OPTIONS: dict[str, tuple[type, str]] = {
    "tolerance": (float, "stop when the candidates left are within this many percent of the "
                         "leader"),
    "budget_min": (float, "time budget in minutes for the whole run"),
    "min_rounds": (int, "rounds before the first verdict"),
    "max_rounds": (int, "rounds at most"),
    "full_trials": (int, "trials of the full measurement the savings are counted against"),
    "draws": (int, "bootstrap resamples"),
    "seed": (int, "seed of the tests and the run order"),
}
#: Why a default is what it is, after the number.
_WHY = {"max_rounds": ", twice the full measurement's trials", "full_trials": ", cope measure's"}
#: Options in percent (their fields are fractions).
_PERCENT = ("tolerance",)


def _defaults(dest: str) -> str:
    """``(default 2; with --llama-bench 3)``: the option's default in each mode, read from the
    records (none said where the record's default is None)."""
    from ..verify import VerifySettings
    scale = 100 if dest in _PERCENT else 1
    mine = getattr(VerifySettings(), dest)
    if mine is None:
        return ""
    text = f" (default {scale * mine:g}{_WHY.get(dest, '')}"
    if dest in BENCH_FIELDS:
        text += f"; with --llama-bench {scale * getattr(BenchSettings(), BENCH_FIELDS[dest]):g}"
    return text + ")"


class _RecordDefaults(argparse.HelpFormatter):
    """The race options' defaults put into the help when it is printed, not when the parser is
    built: VerifySettings lives beside the race's torch code (cope_core.verify.race), which
    building every command's parser must not import (a plain parse stays quick, and cope verify
    sets OpenMP's wait policy before torch loads)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        return text + _defaults(action.dest) if text and action.dest in RACE_OPTIONS else text


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("verify", help="measure only the candidates a prediction leaves open "
                                      "and name the verified winner",
                       description="Predict, then race the contenders (the predicted winner and "
                                   "every candidate that could still win) in rounds of paired "
                                   "trials on the reference executor, dropping each one a "
                                   "paired test puts behind the leader.",
                       formatter_class=_RecordDefaults)
    add_input_options(s, ("trace", "calibration", "profile"),
                      helps={"profile": "profile of this machine (cope.profile/*)"})
    g = s.add_mutually_exclusive_group()
    g.add_argument("--experts-per-layer", "-K", type=ints, dest="k", help="cache size(s) K")
    g.add_argument("--vram-gib", type=float, help="VRAM budget; K follows from the memory model")
    add_machine_options(s, ("threads",), threads_type=ints,
                        helps={"threads": "operating point(s), e.g. 1,2 (default: the "
                                           "profile's most threads); with --llama-bench one "
                                           "count, its CPU threads (default: the physical "
                                           "cores)"})
    s.add_argument("--gpu-share", type=share, help="GPU share of the prediction")
    for dest, (kind, text) in RACE_OPTIONS.items():
        s.add_argument(f"--{dest.replace('_', '-')}", type=kind, help=text)
    s.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda, or cpu for the emulated accelerator (default)")
    s.add_argument("--accel-threads", type=int, default=1,
                   help="torch threads of the emulated accelerator (default 1)")
    emulation_arguments(s)
    s.add_argument("--warmup-tokens", type=int, default=2,
                   help="tokens decoded and discarded per candidate first (default 2)")
    s.add_argument("--no-warmup-prompts", action="store_true",
                   help="skip the untimed first pass over every prompt")
    s.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    s.add_argument("--fill-by-id", action="store_true", help="fill residency by expert id")
    s.add_argument("--no-progress", action="store_true", help="no round lines on stderr")
    s.add_argument("--json", action="store_true", help="print the cope.verify/1 record as JSON")
    s.add_argument("-o", "--output", help="also write the record here (JSON)")
    s.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_arguments(s)
    s.set_defaults(func=cmd_verify)


def verify_settings(args: argparse.Namespace) -> VerifySettings:
    """The executor race's settings: VerifySettings with each option of :data:`RACE_OPTIONS`
    that was given."""
    from ..verify import VerifySettings
    return settings_from_args(VerifySettings, args, {d: d for d in RACE_OPTIONS},
                              percent=_PERCENT)


def cmd_verify(args: argparse.Namespace) -> int:
    if args.llama_bench is not None:
        return cmd_verify_llamabench(args)
    missing = [f for f, v in (("--trace", args.trace), ("--profile", args.profile),
                              ("--experts-per-layer/-K or --vram-gib",
                               args.k if args.k is not None else args.vram_gib)) if v is None]
    if missing:
        raise CopeInputError(f"cope verify: missing {', '.join(missing)} (or --llama-bench "
                             "PATH --model FILE.gguf)")
    prepare_threads(args.device)
    from ..executor.cell import ExecutorSettings
    from ..verify import verify
    if args.output:
        check_output(args.output, args.force)
    if args.warmup_tokens < 0:
        raise CopeInputError(f"expected >= 0, got {args.warmup_tokens}", field="--warmup-tokens")
    if args.accel_threads < 1:
        raise CopeInputError(f"expected >= 1, got {args.accel_threads}", field="--accel-threads")
    trace = parquet_io.read_trace(args.trace)
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    profile = parquet_io.read_profile(args.profile)
    settings = verify_settings(args)
    executor = ExecutorSettings(device=args.device, accel_threads=args.accel_threads,
                                link_gbps=args.link_gbps, cpu_slowdown=args.cpu_slowdown,
                                warmup_tokens=args.warmup_tokens,
                                warmup_prompts=not args.no_warmup_prompts, dtype=args.dtype,
                                seed=settings.seed)
    record = verify(trace, profile, cal, experts_per_layer=args.k, vram_gib=args.vram_gib,
                    cpu_threads=args.threads, gpu_share=args.gpu_share, settings=settings,
                    executor=executor, fill_by_id=args.fill_by_id,
                    progress=not args.no_progress)
    if args.output:
        record = dataclasses.replace(record, inputs=_relative(record.inputs, args.output))
        write_verify(record, args.output, overwrite=args.force)
    if args.json:
        sys.stdout.write(verify_json(record))
    else:
        print("\n".join(report_lines(record)))
        if args.output:
            print(f"wrote {args.output}")
    return 0


def _relative(inputs: dict, output: str) -> dict:
    """Input paths relative to the record's folder, so the record and its inputs move together
    (``cope export --from-verify`` resolves them from there)."""
    base = os.path.dirname(os.path.abspath(output))
    out = {}
    for role, info in inputs.items():
        if info and info.get("path"):
            info = {**info, "path": os.path.relpath(os.path.abspath(info["path"]), base)}
        out[role] = info
    return out


def report_lines(r: VerifyRecord) -> list[str]:
    """The text report of a verify record."""
    if "tolerance" in r.settings:
        tol = 100 * float(r.settings["tolerance"])
    else:   # a record written without it ran at the default
        from ..verify import VerifySettings
        tol = 100 * VerifySettings().tolerance
    out = [f"cope verify: {r.model.name} on the {r.platform.get('accelerator', '?')} "
           f"accelerator ({r.platform.get('gpu', '?')}); tolerance {tol:g} %"]
    for c in r.cells:
        iv = (f" [{c.measured_lo_us / 1e3:.3f}, {c.measured_hi_us / 1e3:.3f}]"
              if c.measured_lo_us is not None and c.measured_hi_us is not None else "")
        verdict = ("the prediction" if c.verified_winner == c.predicted_winner else
                   f"predicted {c.predicted_winner}, " + ("within noise of it" if c.agrees
                                                          else "dropped"))
        out.append(f"K={c.K} threads={c.cpu_threads}: VERIFIED {c.verified_winner} at "
                   f"{c.measured_us / 1e3:.3f} ms/token{iv} · "
                   f"{tokens_per_s(c.measured_us):.1f} tokens/s ({verdict}; {c.stop} after "
                   f"{c.rounds} rounds)")
        probs = ", ".join(f"{x['candidate']}" + (f" (p={x['win_probability']:.2f})"
                                                  if x["win_probability"] is not None else "")
                          for x in c.contenders)
        out.append(f"  contenders: {probs}")
        if c.dropped:
            out.append("  dropped: " + ", ".join(f"{d['candidate']} after round {d['round']} "
                                                 f"({d['behind_pct']:+.1f} %)" for d in c.dropped))
        if len(c.remaining) > 1:
            out.append(f"  tied at the end: {', '.join(c.remaining)}")
        share_pct = 100 * c.candidate_trials / c.full_candidate_trials
        out.append(f"  measured {c.candidate_trials} candidate-trials of "
                   f"{c.full_candidate_trials} ({share_pct:.0f} %); {c.seconds:.0f} s of an "
                   f"estimated {c.full_seconds_estimate:.0f} s")
    t = r.totals()
    out.append(f"total: the prediction stood in {t['agree']}/{t['cells']} cells; "
               f"{t['candidate_trials']} candidate-trials of {t['full_candidate_trials']} "
               f"({100 * t['candidate_trials'] / t['full_candidate_trials']:.0f} %); "
               f"{t['seconds'] / 60:.1f} min of an estimated "
               f"{t['full_seconds_estimate'] / 60:.1f} min for a full measurement")
    return out
