"""What one inserted prefetch costs beside the layer it overlaps: a fully resident layer (the
profile's ``prefetch`` row) against a ``parallel`` layer whose routed experts all miss and run
on the CPU. COPE charges the first at every layer that inserts an expert, whatever that layer
runs; the grid's residency gap by execution (``report.md``) says the mutable residencies come
out too cheap against fixed where the layer computes misses on the CPU. This measures the
prefetch in both surroundings with the profiler's own sampler (``Bench.prefetch``) and rule.

    python benchmarks/prefetch_beside.py [--grid data/platforms/cpu-emulated-grid]
        [--settings none:4,4:2,1:1] [--threads 1,2] [--residency mutable_per_layer]
        [--min-time 10] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from grid_report import settings_of, tag  # beside this script, on sys.path when it runs

from cope_core import parquet_io
from cope_core.errors import CopeInputError
from cope_core.files import json_text
from cope_core.matrix import Residency
from cope_core.mechanisms.accelerator import Accelerator
from cope_core.mechanisms.threads import host_threads
from cope_core.mechanisms.timing import StopRule, load_average, round_robin
from cope_core.mechanisms.weights import model_dtype
from cope_core.profile.measure import Bench, profiler_rig

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except CopeInputError as exc:       # a missing or malformed grid file: one line, exit 2
        print(f"prefetch_beside: {exc}", file=sys.stderr)
        return 2


def _run(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=Path, default=ROOT / "data" / "platforms" / "cpu-emulated-grid",
                    help="a grid folder: its trace gives the geometry, its profiles the context")
    ap.add_argument("--settings", default="none:4,4:2,1:1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--residency", default="mutable_per_layer",
                    choices=["mutable_per_layer", "mutable_cross_layer"])
    ap.add_argument("--min-time", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    g = parquet_io.read_trace(a.grid / "trace.parquet").model
    dtype = model_dtype(g, None)
    # the profile's middle context, as the profiler times its prefetch rows
    prof = parquet_io.read_profile(a.grid / f"profile-{tag(*settings_of(a.settings)[0])}.parquet")
    ctxs = sorted(int(c) for c in prof.table["context"].unique() if c >= 0)
    mid = ctxs[len(ctxs) // 2]
    rule = replace(StopRule(), min_samples=15, rel_tol=0.05, abs_tol_us=25.0)  # the diff rule
    threads = [int(t) for t in a.cpu_threads.split(",")]
    k = g.top_k
    rows, t0, load0 = [], time.perf_counter(), load_average()
    for link, slow in settings_of(a.settings):
        with Accelerator("cpu", 1, link_gbps=link, cpu_slowdown=slow) as acc:
            bench = Bench(profiler_rig(acc, g, dtype, mid, 0))
            for t in threads:
                with host_threads(t):
                    samplers = [bench.prefetch(Residency(a.residency), 1, mid, cpu_misses=m)
                                for m in (0, k)]
                    resident, beside_cpu = round_robin(samplers, [rule, rule],
                                                       budget_seconds=120.0,
                                                       min_seconds=a.min_time)
                rows.append({"setting": tag(link, slow), "cpu_threads": t,
                             "beside_resident_us": resident.clamped().median_us,
                             "beside_cpu_misses_us": beside_cpu.clamped().median_us,
                             "samples": [len(resident.samples_us), len(beside_cpu.samples_us)]})
                r = rows[-1]
                print(f"{r['setting']:>20} {t} threads: one prefetch adds "
                      f"{r['beside_resident_us'] / 1e3:7.2f} ms beside a resident layer, "
                      f"{r['beside_cpu_misses_us'] / 1e3:7.2f} ms beside {k} CPU misses",
                      flush=True)
    out = {"residency": a.residency, "model": g.name, "context": mid, "cpu_misses": k,
           "rows": rows, "seconds": time.perf_counter() - t0,
           "load_average": [load0, load_average()]}
    if a.json:
        a.json.write_text(json_text(out))
    print(f"{out['seconds']:.0f} s, load average {load0:.2f} -> {out['load_average'][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
