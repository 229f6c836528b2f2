"""``cope measure`` (the reference executor) and the measured form of ``cope profile``.

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
from dataclasses import replace

from .. import parquet_io
from ..errors import CopeInputError
from ..estimate.evaluate import measured_winners
from ..files import json_text, write_atomic
from .args import check_output, ints


def prepare_threads(device: str) -> None:
    """Let waiting OpenMP threads sleep on the emulated accelerator (see the module doc)."""
    if device == "cpu" and "OMP_WAIT_POLICY" not in os.environ and "torch" not in sys.modules:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("measure", help="run every candidate for real (reference executor) and "
                                       "write measured TPOT")
    s.add_argument("--trace", required=True, help="routing trace to replay (sets the geometry)")
    s.add_argument("--calibration", help="trace whose popularity fills the cache (default: "
                                         "the trace itself)")
    s.add_argument("--experts-per-layer", "-K", type=ints, required=True, dest="k",
                   help="cache size(s) K, e.g. 8 or 8,16,32")
    s.add_argument("--cpu-threads", type=ints, help="host threads for CPU experts, e.g. 1,2 "
                                                     "(default: every core)")
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
    s.add_argument("--candidates", help="comma list of candidate ids (default: all 13)")
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
    s.set_defaults(func=cmd_measure)


def cmd_measure(args: argparse.Namespace) -> int:
    prepare_threads(args.device)
    from ..executor.run import ExecutorSettings, measure
    from ..mechanisms.accelerator import cpu_cores
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
    cands = [c.strip() for c in args.candidates.split(",")] if args.candidates else None
    settings = ExecutorSettings(device=args.device, accel_threads=args.accel_threads,
                                link_gbps=args.link_gbps, cpu_slowdown=args.cpu_slowdown,
                                trials=args.trials, warmup_tokens=args.warmup_tokens,
                                warmup_prompts=not args.no_warmup_prompts, dtype=args.dtype,
                                seed=args.seed)
    m = measure(trace, args.k, calibration=cal, cpu_threads=args.cpu_threads or [cpu_cores()],
                candidates=cands, profile=profile, settings=settings,
                progress=not args.no_progress, fill_by_id=args.fill_by_id)
    parquet_io.write_measurements(m, args.output, overwrite=args.force)
    t = m.table
    print(f"wrote {args.output}: MEASURED TPOT of {t['candidate'].nunique()} candidates x "
          f"{t['prompt'].nunique()} prompts x {args.trials} trials at K={sorted(set(t['K']))}, "
          f"cpu_threads={sorted(set(t['cpu_threads']))} on the {m.platform['accelerator']} "
          f"accelerator ({m.platform['gpu']})")
    for w in measured_winners(t).itertuples(index=False):
        print(f"  K={w.K} threads={w.cpu_threads}: measured winner {w.candidate} at "
              f"{w.tpot_us / 1e3:.3f} ms/token")
    return 0


def run_profile(args: argparse.Namespace) -> int:
    """``cope profile`` without ``--analytic``: measure this machine."""
    for opt in ("link", "cpu"):
        if getattr(args, opt, None):
            raise CopeInputError(f"--{opt} only applies to --analytic profiles", field=f"--{opt}")
    prepare_threads(args.device)
    from ..profile.measure import DEFAULT_CONTEXTS, ProfilerSettings, measure_profile
    check_output(args.output, args.force)
    if args.raw_samples:
        check_output(args.raw_samples, args.force)
    from .commands import profiled_geometry
    g = profiled_geometry(args)
    if args.accel_threads < 1:
        raise CopeInputError(f"expected >= 1, got {args.accel_threads}", field="--accel-threads")
    if args.max_samples < 3:
        raise CopeInputError(f"expected >= 3, got {args.max_samples}", field="--max-samples")
    if not args.time_budget > 0:
        raise CopeInputError(f"expected seconds > 0, got {args.time_budget}", field="--time-budget")
    if not args.min_time >= 0:
        raise CopeInputError(f"expected seconds >= 0, got {args.min_time}", field="--min-time")
    base = ProfilerSettings()
    rule = replace(base.rule, min_samples=min(base.rule.min_samples, args.max_samples),
                   max_samples=args.max_samples)
    shared_rule = replace(base.shared_rule, max_samples=args.max_samples,
                          min_samples=min(base.shared_rule.min_samples, args.max_samples))
    settings = ProfilerSettings(device=args.device, accel_threads=args.accel_threads,
                                link_gbps=args.link_gbps, cpu_slowdown=args.cpu_slowdown,
                                cpu_threads=tuple(args.cpu_threads) if args.cpu_threads else None,
                                contexts=tuple(args.contexts or DEFAULT_CONTEXTS),
                                dtype=args.dtype, seed=args.seed, rule=rule,
                                shared_rule=shared_rule, budget_seconds=args.time_budget,
                                min_seconds=min(args.min_time, args.time_budget))
    prof, raw, seconds = measure_profile(g, settings, progress=not args.no_progress)
    parquet_io.write_profile(prof, args.output, overwrite=args.force)
    if args.raw_samples:
        write_atomic(args.raw_samples, json_text({"key": "kind|name|hits|cpu|staged|count|"
                                                           "context|cpu_threads|gpu_share",
                                                    "samples_us": raw}, indent=None),
                     overwrite=args.force)
    threads = sorted({t for t, _ in prof.operating_points()})
    print(f"wrote {args.output}: MEASURED profile of {g.name} ({g.n_layers} MoE layers) on the "
          f"{prof.platform['accelerator']} accelerator ({prof.platform['gpu']}), CPU threads "
          f"{threads}, {len(prof.table)} rows; shared work per block, so it prices any layer "
          f"count of this model")
    print(f"profiling took {seconds:.1f} s")
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


def add_profile_arguments(s: argparse.ArgumentParser) -> None:
    """Options of the measured ``cope profile`` (the analytic one ignores them)."""
    s.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="measured profile: cuda, or cpu for the emulated accelerator")
    s.add_argument("--accel-threads", type=int, default=1,
                   help="measured profile: torch threads of the emulated accelerator")
    s.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="measured profile: weight dtype (default bfloat16 for 2-byte models)")
    emulation_arguments(s, "measured profile: ")
    s.add_argument("--max-samples", type=int, default=40,
                   help="measured profile: most samples per row (default 40)")
    s.add_argument("--time-budget", type=float, default=120.0, metavar="SECONDS",
                   help="measured profile: per operating point, after which every row stops at "
                        "3 samples (default 120)")
    s.add_argument("--min-time", type=float, default=30.0, metavar="SECONDS",
                   help="measured profile: sample every row for at least this long per operating "
                        "point, unless it reaches --max-samples (default 30), so that slow drift "
                        "of the machine averages out")
    s.add_argument("--seed", type=int, default=0,
                   help="measured profile: seed of the synthetic weights (default 0)")
    s.add_argument("--raw-samples", metavar="JSON", help="measured profile: also write every "
                                                         "raw sample to this JSON file")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

