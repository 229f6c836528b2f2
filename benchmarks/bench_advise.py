"""End-to-end time of ``cope advise``: a fresh ``cope`` process, as a user runs it.

Workloads (issue 40's done-when): the Qwen3-30B-A3B Q4_K_M GGUF header on an RTX 3090, a Ryzen 7
5700X, dual-channel DDR4-3200 and PCIe 4.0 x16 (the whole model fits: K = E), the same on a
12 GB card (K < E: llama.cpp's own MoE cache is searched), GLM-4.5-Air Q4_K_M and gpt-oss-120b
MXFP4_MOE on a 16 GB card; each with every runtime (``--runtime all``, SGLang-KT's expert
location file needs torch) and with llama.cpp alone. Every run is a new process (imports, the
numba kernels loaded from their disk cache, the synthetic routing made, the analytic profile,
the prediction, the llama.cpp search and --fit's placement, the renders); a warm-up run first
compiles whatever is not cached yet. Goal: <= 5 s on 2 cores.

Run: ``python benchmarks/bench_advise.py [--repeats N] [--json OUT]``
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MACHINE = ["--cpu", "ryzen-7-5700x", "--memory", "ddr4-3200x2", "--pcie", "4x16"]
GGUF = ["--model", "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"]
CASES = {
    "qwen3-30b-a3b Q4_K_M, rtx3090 (K = E)": GGUF + ["--gpu", "rtx3090"] + MACHINE,
    "qwen3-30b-a3b Q4_K_M, rtx3060-12gb": GGUF + ["--gpu", "rtx3060-12gb"] + MACHINE,
    "glm-4.5-air Q4_K_M, rtx4060ti-16gb": ["--model", "glm-4.5-air", "--quant", "Q4_K_M",
                                           "--gpu", "rtx4060ti-16gb"] + MACHINE,
    "gpt-oss-120b MXFP4_MOE, rtx4060ti-16gb": ["--model", "gpt-oss-120b", "--quant",
                                               "MXFP4_MOE", "--gpu", "rtx4060ti-16gb"] + MACHINE,
}


def run_once(args: list[str]) -> tuple[float, float]:
    """Wall-clock and CPU (user + system) seconds of one ``cope advise`` process: on a shared
    machine the CPU time says what the command costs when the wall clock includes waiting."""
    c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cope_core.cli.main", "advise", *args], cwd=ROOT,
                       capture_output=True, text=True)
    dt, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise RuntimeError(f"cope advise {' '.join(args)} failed: {r.stderr}")
    return dt, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    out: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                             "load_1min": os.getloadavg()[0]}, "results": {}}
    run_once(list(CASES.values())[0] + ["--runtime", "llama.cpp"])        # warm-up
    for name, case in CASES.items():
        for runtimes in ("llama.cpp", "all"):
            runs = [run_once(case + ["--runtime", runtimes]) for _ in range(args.repeats)]
            wall, cpu = [w for w, _ in runs], [c for _, c in runs]
            key = f"{name}, --runtime {runtimes}"
            out["results"][key] = {"median_s": float(np.median(wall)), "max_s": float(max(wall)),
                                   "cpu_median_s": float(np.median(cpu)), "samples_s": wall,
                                   "cpu_samples_s": cpu}
            print(f"{key:<66} wall median {np.median(wall):5.2f} s (max {max(wall):5.2f}), "
                  f"CPU {np.median(cpu):5.2f} s", flush=True)
    out["machine"]["load_1min_after"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
