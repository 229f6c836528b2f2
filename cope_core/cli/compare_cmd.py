"""``cope compare``: the same trace on several platforms (a CLI plugin, see PLUGINS in main.py).

    cope compare --trace T [--calibration C] --platform rtx4090 [--platform h100+pcie5 ...]
                 [--profile mine.parquet ...] --vram-gib G [--threads N] [--gpu-share S]
                 [--estimator cope|atomic|hrm] [--draws B] [--seed S] [--json]
"""
from __future__ import annotations

import argparse
import math

from .. import parquet_io
from ..errors import CopeInputError
from ..estimate.compare import catalog_platform, compare, profile_platform
from ..estimate.costs import ESTIMATORS
from ..estimate.speed import tokens_per_s
from ..files import print_json
from .args import add_input_options, add_machine_options, share


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "compare", help="what would another GPU buy me? the same trace on several platforms",
        description="Predict the trace on every platform given (analytic ones built from the "
                    "spec table for the trace's model, measured or analytic profiles as they "
                    "are) and compare the winners at one VRAM budget, each platform capped at "
                    "its own memory.")
    add_input_options(s, ("trace", "calibration"), required=("trace",))
    s.add_argument("--platform", action="append", default=[], metavar="GPU[+LINK[+CPU]]",
                   help="a catalog platform, e.g. rtx4090 or h100+pcie5+epyc-7763, or a JSON "
                        "spec file (PlatformSpec fields, optional vram_gib); repeatable")
    s.add_argument("--profile", action="append", default=[], metavar="P.parquet",
                   help="a profile of the trace's model (measured or analytic); repeatable")
    s.add_argument("--vram-gib", type=float, required=True, help="the budget to compare at")
    add_machine_options(s, ("threads",), threads_type=int,
                        helps={"threads": "operating point in every platform"})
    s.add_argument("--gpu-share", type=share, help="GPU share in every platform, %%")
    s.add_argument("--estimator", default="cope", choices=ESTIMATORS)
    s.add_argument("--draws", type=int, default=1000, help="bootstrap draws (0: none)")
    s.add_argument("--seed", type=int, default=0, help="seed of the draws")
    s.add_argument("--json", action="store_true", help="print the comparison as JSON")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if len(args.platform) + len(args.profile) < 1:
        raise CopeInputError("give at least one --platform or --profile", field="--platform")
    trace = parquet_io.read_trace(args.trace)
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    plats = [catalog_platform(trace.model, p, cpu_threads=args.threads,
                              gpu_share=args.gpu_share) for p in args.platform]
    plats += [profile_platform(parquet_io.read_profile(p)) for p in args.profile]
    cmp = compare(trace, plats, args.vram_gib, cal, cpu_threads=args.threads,
                  gpu_share=args.gpu_share, estimator=args.estimator, draws=args.draws,
                  seed=args.seed)
    if args.json:
        print_json({"vram_gib": cmp.vram_gib, "estimator": args.estimator,
                    "platforms": cmp.at_budget.to_dict("records"),
                    "sweep": cmp.sweep.to_dict("records")})
        return 0
    print(f"trace {args.trace}: {trace.source.upper()} {trace.model.name}, {trace.n_prompts} "
          f"prompts | budget {args.vram_gib:g} GiB | estimator {args.estimator}")
    wid = max(12, *(len(x) for x in cmp.at_budget["platform"])) + 1
    print(f"{'platform':<{wid}} {'kind':<9}{'budget':>8}{'K':>5}  {'winner':<34}{'TPOT ms':>9}"
          f"{'tok/s':>8}  {'95 % interval':<19}{'wins':>6}{'speed-up':>10}")
    for r in cmp.at_budget.itertuples(index=False):
        ci = ("" if not math.isfinite(r.tpot_lo_us) else
              f"[{r.tpot_lo_us / 1e3:.3f}, {r.tpot_hi_us / 1e3:.3f}]")
        wins = "" if not math.isfinite(r.win_probability) else f"{100 * r.win_probability:.0f} %"
        print(f"{r.platform:<{wid}} {'ANALYTIC' if r.analytic else 'MEASURED':<9}"
              f"{r.budget_gib:>7g}G{r.experts_per_layer:>5}  {r.winner:<34}"
              f"{r.tpot_us / 1e3:>9.3f}{tokens_per_s(r.tpot_us):>8.1f}  {ci:<19}{wins:>6}"
              f"{r.speedup:>9.2f}x")
    first = cmp.at_budget.iloc[0]
    print(f"speed-up: {first.platform}'s TPOT over each platform's; a platform with less "
          "memory than the budget is compared at all of its own")
    return 0

