"""``cope measure`` (the reference executor), and what it shares with the measured form of
``cope profile`` (:mod:`cope_core.cli.profile_cmd`): the emulated platform's options and the
OpenMP wait policy.

Both run real torch work. On the emulated accelerator the host's CPU experts and the
accelerator's worker share the machine's cores, so OpenMP threads that wait should sleep rather
than spin: unless the user set ``OMP_WAIT_POLICY``, these commands set it to ``PASSIVE`` before
torch is first imported (a spinning OpenMP team member can hold a core that the team's other
thread needs for a whole scheduler time slice, turning a 50 us operation into 30 ms).
"""
from __future__ import annotations

import argparse
import os
import sys

from .. import parquet_io
from ..errors import CopeInputError
from ..estimate.evaluate import measured_winners
from ..estimate.quality import check_lines, measurement_checks
from ..estimate.speed import speed
from .args import add_input_options, add_machine_options, candidate_list, check_output, ints


def prepare_threads(device: str) -> None:
    """Let waiting OpenMP threads sleep on the emulated accelerator (see the module doc)."""
    if device == "cpu" and "OMP_WAIT_POLICY" not in os.environ and "torch" not in sys.modules:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("measure", help="run every candidate for real (reference executor) and "
                                       "write measured TPOT")
    add_input_options(s, ("trace", "calibration"), required=("trace",),
                      helps={"trace": "routing trace to replay (sets the geometry)"},
                      notes={"calibration": " (default: the trace itself)"})
    s.add_argument("--experts-per-layer", "-K", type=ints, required=True, dest="k",
                   help="cache size(s) K, e.g. 8 or 8,16,32")
    add_machine_options(s, ("threads",), threads_type=ints,
                        helps={"threads": "host threads for CPU experts, e.g. 1,2 "
                                                     "(default: every core)"})
    s.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda, or cpu for the emulated accelerator (default)")
    s.add_argument("--accel-threads", type=int, default=1,
                   help="torch threads of the emulated accelerator (default 1)")
    emulation_arguments(s)
    s.add_argument("--trials", type=int, default=3, help="runs per (candidate, prompt)")
    s.add_argument("--warmup-tokens", type=int, default=2,
                   help="tokens decoded and discarded per candidate before measuring (default 2)")
    s.add_argument("--no-warmup-prompts", action="store_true",
                   help="skip the untimed first pass over every prompt (it keeps one-time "
                        "kernel preparation for new shapes out of the measurements)")
    s.add_argument("--candidates", type=candidate_list,
                   help="comma list of candidate ids (default: all 13)")
    s.add_argument("--profile", help="profile whose cost_selected split to use (default: "
                                     "measure the split first)")
    s.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="weight dtype (default: bfloat16 for 2-byte models)")
    s.add_argument("--fill-by-id", action="store_true",
                   help="fill residency by expert id instead of popularity")
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.add_argument("-o", "--output", required=True,
                   help="Parquet file to write (cope.measurements/1)")
    s.add_argument("--force", action="store_true", help="overwrite an existing output file")
    s.add_argument("--resume", action="store_true",
                   help="continue the interrupted run whose file is --output (every finished "
                        "cell is written there as it ends); same inputs and settings")
    s.set_defaults(func=cmd_measure)


def cmd_measure(args: argparse.Namespace) -> int:
    prepare_threads(args.device)
    from ..executor.run import ExecutorSettings, measure
    from ..mechanisms.accelerator import cpu_cores
    resume = None
    if args.force and args.resume:
        raise CopeInputError("give one of --resume and --force", field="--resume")
    if args.resume and os.path.exists(args.output):
        resume = parquet_io.read_measurements(args.output)
        if resume.complete:
            print(f"{args.output}: the run is complete; nothing to resume")
            return 0
        print(f"cope measure: resuming {args.output} ({len(resume.progress['cells_done'])} "
              f"cells done)", file=sys.stderr)
    else:
        check_output(args.output, args.force)
    for name in ("trials", "accel_threads"):
        if getattr(args, name) < 1:
            raise CopeInputError(f"expected >= 1, got {getattr(args, name)}",
                                 field=f"--{name.replace('_', '-')}")
    if args.warmup_tokens < 0:
        raise CopeInputError(f"expected >= 0, got {args.warmup_tokens}", field="--warmup-tokens")
    trace = parquet_io.read_trace(args.trace)
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    profile = parquet_io.read_profile(args.profile) if args.profile else None
    settings = ExecutorSettings(device=args.device, accel_threads=args.accel_threads,
                                link_gbps=args.link_gbps, cpu_slowdown=args.cpu_slowdown,
                                trials=args.trials, warmup_tokens=args.warmup_tokens,
                                warmup_prompts=not args.no_warmup_prompts, dtype=args.dtype,
                                seed=args.seed)
    m = measure(trace, args.k, calibration=cal, cpu_threads=args.threads or [cpu_cores()],
                candidates=args.candidates, profile=profile, settings=settings,
                progress=not args.no_progress, fill_by_id=args.fill_by_id, resume=resume,
                checkpoint=lambda part: parquet_io.write_measurements(part, args.output,
                                                                      overwrite=True))
    parquet_io.write_measurements(m, args.output, overwrite=True)
    t = m.table
    print(f"wrote {args.output}: MEASURED TPOT of {t['candidate'].nunique()} candidates x "
          f"{t['prompt'].nunique()} prompts x {args.trials} trials at K={sorted(set(t['K']))}, "
          f"cpu_threads={sorted(set(t['cpu_threads']))} on the {m.platform['accelerator']} "
          f"accelerator ({m.platform['gpu']})")
    for w in measured_winners(t).itertuples(index=False):
        print(f"  K={w.K} threads={w.cpu_threads}: measured winner {w.candidate} at "
              f"{speed(w.tpot_us)}")
    for line in check_lines(measurement_checks(m)):
        print(line)
    return 0


def emulation_arguments(s: argparse.ArgumentParser, prefix: str = "") -> None:
    """The emulated platform's knobs, shared by ``cope profile`` and ``cope measure``."""
    s.add_argument("--link-gbps", type=float, default=None, metavar="X",
                   help=prefix + "emulated accelerator only: pace weight copies to X GB/s, the "
                                 "copy worker sleeping between chunks as a copy engine leaves "
                                 "the CPU free (default: host-memory speed)")
    s.add_argument("--cpu-slowdown", type=float, default=1.0, metavar="F",
                   help=prefix + "emulated accelerator only: every CPU-side expert computation "
                                 "takes F >= 1 times its real duration (default 1)")
