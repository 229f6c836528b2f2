"""Where a shared sample's time goes on a busy machine (issue 42 item 4, design.md#a-busy-machine).

Rigs of the small geometry of ``bench_busy_profile.py`` with 2 and 6 MoE blocks on one emulated
accelerator, sampled alternately in one process: per sample, the ``moe_block`` sampler's time per
block, the run-queue wait of this process's threads (``profile.busy.run_queue_wait_ns``) over the
sample's wall time, and the wait for the last block's queued addition, timed apart (what the
sampler timed, divided by the block count, until issue 42).

    python benchmarks/probe_busy_shared.py [--samples 100]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as cope profile sets it, before torch

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from bench_busy_profile import G  # noqa: E402  (beside this script, on sys.path when it runs)

from cope_core.mechanisms import Accelerator, host_threads  # noqa: E402
from cope_core.mechanisms.weights import model_dtype  # noqa: E402
from cope_core.profile.bench import profiler_rig  # noqa: E402
from cope_core.profile.busy import run_queue_wait_ns  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100)
    a = ap.parse_args(argv)
    stats: dict[int, dict[str, list[float]]] = {L: {"block": [], "wait": [], "tail": []}
                                                 for L in (2, 6)}
    load0 = os.getloadavg()[0]
    with host_threads(1), Accelerator("cpu", 1) as acc:
        rigs = {L: profiler_rig(acc, G.with_layers(L), model_dtype(G, None), 256, 0)
                for L in stats}
        for _ in range(a.samples):
            for L, rig in rigs.items():
                sh = rig.shared
                acc.compute.submit(rig.io.out.zero_)
                acc.compute.synchronize()
                w0, t0 = run_queue_wait_ns() or 0, time.perf_counter()
                for layer in range(L):
                    sh.moe_block(layer, 64, list(range(G.top_k)))
                    sh.end_block()
                t1 = time.perf_counter()
                sh.wait()
                t2 = time.perf_counter()
                s = stats[L]
                s["block"].append((t1 - t0) * 1e6 / L)
                s["tail"].append((t2 - t1) * 1e6)
                s["wait"].append(((run_queue_wait_ns() or 0) - w0) / 1e3 / ((t2 - t0) * 1e6))
    print(f"{a.samples} samples per rig, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs")
    for L, s in stats.items():
        b, t, w = (np.asarray(s[k]) for k in ("block", "tail", "wait"))
        print(f"  {L} blocks: per block median {np.median(b):.0f} us (best {b.min():.0f}); "
              f"run-queue wait {np.median(w):.0%} of a sample (median); tail wait median "
              f"{np.median(t):.0f} us = {np.median(t) / L / np.median(b):+.1%} per block")
    return 0


if __name__ == "__main__":
    sys.exit(main())
