"""``cope profile``: write a profile, measured on this machine (:mod:`cope_core.profile.measure`)
or analytic, a what-if from published peak numbers (:mod:`cope_core.profile.analytic`)."""
from __future__ import annotations

import argparse
from dataclasses import replace

from .. import parquet_io
from ..errors import CopeInputError
from ..platforms import DEFAULT_CPU, resolve_platform
from ..profile.raw_samples import write_raw_samples
from .args import add_machine_options, check_output, ints, layers, model_from_args, shares
from .measure_cmd import emulation_arguments, prepare_threads

#: How often ``cope profile`` measures an operating point that other work inflated.
BUSY_ATTEMPTS = 3


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("profile", help="write a profile: measured on this machine, or "
                                       "--analytic (what-if from published specs)")
    s.add_argument("--analytic", action=_AnalyticSwitch,
                   help="a what-if from published specs of the machine --gpu, --cpu and --pcie "
                        "name, instead of measuring this machine")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a catalog name, a GGUF file (its header; an analytic "
                                     "profile prices its stored types) or an HF model folder / "
                                     "config.json")
    src.add_argument("--trace", help="take the model geometry from this trace")
    s.add_argument("--quant", metavar="PRESET",
                   help="with --model: price a catalog model or HF config as this llama-quantize "
                        "preset (Q4_K_M, Q8_0, MXFP4_MOE, ...)")
    s.add_argument("--layers", type=layers,
                   help="profile the model cut to N MoE layers: shared work is profiled per "
                        "block, so the profile still prices the whole model, in less time")
    add_machine_options(s, ("gpu", "cpu", "pcie"), prefix="with --analytic: ", helps={
        "gpu": "a catalog GPU (`cope parts gpus`: rtx3090, rtx4090, h100, ...), a GPU part "
               "file, or a JSON spec file (PlatformSpec's fields)",
        "cpu": "catalog CPU for the host side (`cope parts cpus`)",
        "pcie": "pcie4, pcie5 or GENxLANES such as 4x16 (default: the GPU's usual link)"},
        notes={"cpu": f" (default {DEFAULT_CPU})"})
    add_machine_options(s, ("threads",), threads_type=ints,
                        helps={"threads": "operating points, e.g. 1,4,16"})
    s.add_argument("--contexts", type=ints, default=None, help="shared-cost contexts")
    s.add_argument("--gpu-shares", type=shares, default=None,
                   help="analytic: GPU shares (CUDA MPS %%) of the operating points "
                        "(default 20,50,80,100): throughput scales, latencies do not")
    s.add_argument("-o", "--output", required=True, help="Parquet file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_profile_arguments(s)
    s.set_defaults(func=cmd_profile)


class _AnalyticSwitch(argparse.Action):
    """``--analytic``: a switch; the GPU it once took is ``--gpu`` now, said in one line."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=False, help=kwargs.get("help"))

    def __call__(self, parser, namespace, values, option_string=None):
        if values is not None:
            raise CopeInputError(f"takes no value now: name the GPU with --gpu (--analytic "
                                 f"--gpu {values})", field="--analytic")
        setattr(namespace, self.dest, True)


def profiled_geometry(args: argparse.Namespace):
    """The geometry ``cope profile`` profiles: the trace's or the catalog's, cut by --layers."""
    g = parquet_io.read_trace(args.trace).model if args.trace else model_from_args(args)
    if args.layers is not None:
        g = g.with_layers(args.layers)
    return g


def cmd_profile(args: argparse.Namespace) -> int:
    if args.analytic and args.gpu is None:
        raise CopeInputError("needs the GPU: --analytic --gpu GPU", field="--analytic")
    if not args.analytic:  # measured on this machine (cope_core.profile.measure)
        if args.gpu_shares:
            raise CopeInputError("is for --analytic profiles: a measured profile is taken at "
                                 "the GPU share its process has (100 %, or the CUDA MPS limit "
                                 "it runs under)", field="--gpu-shares")
        return run_profile(args)
    from ..profile.analytic import DEFAULT_CONTEXTS, DEFAULT_SHARES, analytic_profile
    g = profiled_geometry(args)
    spec = resolve_platform(args.gpu, link=args.pcie, cpu=args.cpu or DEFAULT_CPU)
    prof = analytic_profile(g, spec, cpu_threads=args.threads,
                            contexts=args.contexts or DEFAULT_CONTEXTS,
                            gpu_shares=args.gpu_shares or DEFAULT_SHARES)
    parquet_io.write_profile(prof, args.output, overwrite=args.force)
    threads = sorted({t for t, _ in prof.operating_points()})
    got = sorted({s for _, s in prof.operating_points()})
    print(f"wrote {args.output}: ANALYTIC profile ({spec.source} peak numbers with efficiencies "
          f"and overheads, not measured) of {spec.name} for {g.name}, CPU threads {threads}, "
          f"GPU shares {[f'{s:g} %' for s in got]}")
    return 0


def run_profile(args: argparse.Namespace) -> int:
    """``cope profile`` without ``--analytic``: measure this machine."""
    for opt in ("gpu", "pcie", "cpu"):
        if getattr(args, opt, None):
            raise CopeInputError(f"--{opt} only applies to --analytic profiles", field=f"--{opt}")
    prepare_threads(args.device)
    from ..profile.measure import DEFAULT_CONTEXTS, ProfilerSettings, measure_profile
    check_output(args.output, args.force)
    if args.raw_samples:
        check_output(args.raw_samples, args.force)
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
                                cpu_threads=tuple(args.threads) if args.threads else None,
                                contexts=tuple(args.contexts or DEFAULT_CONTEXTS),
                                dtype=args.dtype, seed=args.seed, rule=rule,
                                shared_rule=shared_rule, budget_seconds=args.time_budget,
                                min_seconds=min(args.min_time, args.time_budget),
                                attempts=BUSY_ATTEMPTS, refuse_busy=not args.busy_ok)
    prof, raw, seconds = measure_profile(g, settings, progress=not args.no_progress)
    parquet_io.write_profile(prof, args.output, overwrite=args.force)
    if args.raw_samples:
        write_raw_samples(args.raw_samples, raw, overwrite=args.force)
    threads = sorted({t for t, _ in prof.operating_points()})
    print(f"wrote {args.output}: MEASURED profile of {g.name} ({g.n_layers} MoE layers) on the "
          f"{prof.platform['accelerator']} accelerator ({prof.platform['gpu']}), CPU threads "
          f"{threads}, {len(prof.table)} rows; shared work per block, so it prices any layer "
          f"count of this model")
    print(f"profiling took {seconds:.1f} s")
    return 0


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
    s.add_argument("--busy-ok", action="store_true",
                   help="measured profile: keep a profile that other work on the machine "
                        f"inflated (measured {BUSY_ATTEMPTS} times, still busy) instead of "
                        "refusing it; its quality is recorded in the profile")

