"""How much the measured peak numbers (``mechanisms/probe.py``) move from one probe to the next:
N probes in a row after a warm-up one, each quantity's worst deviation from their median. With
``--load`` a second process keeps one core busy 0.7 s out of every 1.4 s meanwhile, the bursty
interference of a shared machine.

    python benchmarks/probe_stability.py [--runs 6] [--load] [--hidden 2048]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np
import torch

from cope_core.mechanisms import Accelerator
from cope_core.mechanisms.probe import probe_platform

FIELDS = ("gpu_flops", "gpu_bandwidth", "link_bandwidth", "cpu_flops_per_thread",
          "cpu_bandwidth_per_thread", "cpu_bandwidth")
_HOG = ("import time\nwhile True:\n    t = time.time()\n    while time.time() - t < 0.7:\n"
        "        pass\n    time.sleep(0.7)\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--load", action="store_true", help="a bursty busy process meanwhile")
    ap.add_argument("--hidden", type=int, default=2048, help="the probe's model width")
    a = ap.parse_args(argv)
    hog = subprocess.Popen([sys.executable, "-c", _HOG]) if a.load else None
    try:
        with Accelerator("cpu") as acc:
            probe_platform(acc, torch.bfloat16, a.hidden)          # warm-up: pages, kernels
            t0 = time.perf_counter()
            runs = [probe_platform(acc, torch.bfloat16, a.hidden) for _ in range(a.runs)]
            each = (time.perf_counter() - t0) / a.runs
    finally:
        if hog is not None:
            hog.kill()
    v = np.array([[getattr(s, f) for f in FIELDS] for s in runs])
    dev = np.abs(v / np.median(v, axis=0) - 1).max(axis=0)
    print(f"{a.runs} probes{' under load' if a.load else ''}, {each:.1f} s each; worst "
          "deviation from their median:")
    for f, d, med in zip(FIELDS, dev, np.median(v, axis=0)):
        print(f"  {f:<26}{100 * d:6.1f} %   (median {med:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
