"""``cope contention``: where a measured profile's schedules depart from their isolated-op
composition (a CLI plugin, see PLUGINS in main.py).

    cope contention --profile P [--threads N] [--gpu-share S] [--json]
"""
from __future__ import annotations

import argparse
import math

from .. import parquet_io
from ..estimate.contention import contention, prefetch_hiding
from ..files import print_json
from .args import add_machine_options, share


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "contention", help="where a measured profile's schedules depart from the composition "
                           "of their isolated ops (contention, or better overlap)",
        description="For every schedule row of a measured profile: its measured cost, the "
                    "atomic simulation's composition of its isolated ops (overlapped and "
                    "serial), the excess over the composition and the share of the nominal "
                    "overlap achieved; and per mutable residency what a prefetch adds beside a "
                    "running layer against the copy timed alone.")
    s.add_argument("--profile", required=True, help="a measured profile (cope.profile/1 or /2)")
    add_machine_options(s, ("threads",), threads_type=int,
                        helps={"threads": "operating point (default: every operating point "
                                           "of the profile)"})
    s.add_argument("--gpu-share", type=share, help="GPU share of the operating point, %%")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=run)


def _points(prof, args) -> list[tuple[int, float]]:
    if args.threads is None and args.gpu_share is None:
        return list(prof.operating_points())
    return [prof.choose(args.threads, args.gpu_share)]


def run(args: argparse.Namespace) -> int:
    prof = parquet_io.read_profile(args.profile)
    points = _points(prof, args)
    result = [(t, s, contention(prof, t, s), prefetch_hiding(prof, t, s)) for t, s in points]
    if args.json:
        print_json({"profile": str(args.profile), "operating_points": [
            {"cpu_threads": t, "gpu_share": s,
             "schedules": df.to_dict("records"), "prefetch": pf.to_dict("records")}
            for t, s, df, pf in result]})
        return 0
    plat = prof.platform
    link = plat.get("link_gbps")
    print(f"profile {args.profile}: {prof.model.name}, {plat.get('accelerator', '?')} "
          f"accelerator, link {'unpaced' if link is None else f'{link:g} GB/s'}, host "
          f"{plat.get('cpu_slowdown', 1):g}x slower")
    print("composed: the atomic simulation's cost (isolated ops, max where overlapped); serial: "
          "the same ops one after another; overlap: share of the nominal overlap achieved; "
          "verdict beyond the interquartile ranges")
    for t, s, df, pf in result:
        print(f"\ncpu_threads {t}, gpu_share {s:g} %")
        print(f"{'execution':<15}{'h':>3}{'c':>3}{'u':>3}{'measured ms':>13}{'composed ms':>13}"
              f"{'serial ms':>11}{'excess':>9}{'overlap':>9}  verdict")
        for r in df.itertuples(index=False):
            ov = "" if not math.isfinite(r.overlap) else f"{r.overlap:.2f}"
            print(f"{r.execution:<15}{r.hits:>3}{r.cpu:>3}{r.staged:>3}"
                  f"{r.measured_us / 1e3:>13.3f}{r.composed_us / 1e3:>13.3f}"
                  f"{r.serial_us / 1e3:>11.3f}{r.excess_pct:>8.1f}%{ov:>9}  {r.verdict}")
        for r in pf.itertuples(index=False):
            hid = "" if not math.isfinite(r.hidden_pct) else f", {r.hidden_pct:.1f} % hidden"
            print(f"prefetch {r.residency}: {r.beside_layer_us / 1e3:.3f} ms beside a resident "
                  f"layer, {r.beside_cpu_us / 1e3:.3f} ms beside CPU misses, "
                  f"{r.isolated_us / 1e3:.3f} ms alone{hid}")
    return 0
