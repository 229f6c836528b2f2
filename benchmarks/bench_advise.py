"""End-to-end time of ``cope advise``: a fresh ``cope`` process, as a user runs it.

Workloads (issue 40's done-when): the Qwen3-30B-A3B Q4_K_M GGUF header on an RTX 3090, a Ryzen 7
5700X, dual-channel DDR4-3200 and PCIe 4.0 x16 (the whole model fits: K = E), the same on a
12 GB card (K < E: llama.cpp's own MoE cache is searched), GLM-4.5-Air Q4_K_M and gpt-oss-120b
MXFP4_MOE on a 16 GB card; each with every runtime (``--runtime all``, SGLang-KT's expert
location file needs torch) and with llama.cpp alone. Issue 70 (part 8) adds the README's
command: the 12 GB card with a 16,384-token prompt and a 512-token answer (``--prompt-tokens
16384 --gen-tokens 512``: the request's ``-ub`` search prices each batch size's fewest
``--n-cpu-moe``), with every runtime as the README runs it. Every run is a new process
(imports, the numba kernels loaded from their disk cache, the synthetic routing made, the
analytic profile, the prediction, the llama.cpp search and --fit's placement, the renders); a
warm-up run first compiles whatever is not cached yet. Goals on 2 cores: <= 5 s (issue 40),
<= 2 s for the README's command (issue 70).

``--before DIR`` runs every case also on another checkout (e.g. ``git worktree add DIR
<commit>``), alternating the two process by process so that both see the same machine, and
prints today's figure beside the new one with their ratio (wall and CPU). On a shared machine
the CPU time (user + system of the child) says what the command costs when the wall clock
includes waiting.

Run: ``python benchmarks/bench_advise.py [--repeats N] [--before DIR] [--only TEXT]
[--json OUT]``
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
README = "qwen3-30b-a3b Q4_K_M, rtx3060-12gb, 16384 + 512 tokens (README)"
CASES = {
    "qwen3-30b-a3b Q4_K_M, rtx3090 (K = E)": GGUF + ["--gpu", "rtx3090"] + MACHINE,
    "qwen3-30b-a3b Q4_K_M, rtx3060-12gb": GGUF + ["--gpu", "rtx3060-12gb"] + MACHINE,
    "glm-4.5-air Q4_K_M, rtx4060ti-16gb": ["--model", "glm-4.5-air", "--quant", "Q4_K_M",
                                           "--gpu", "rtx4060ti-16gb"] + MACHINE,
    "gpt-oss-120b MXFP4_MOE, rtx4060ti-16gb": ["--model", "gpt-oss-120b", "--quant",
                                               "MXFP4_MOE", "--gpu", "rtx4060ti-16gb"] + MACHINE,
    README: GGUF + ["--gpu", "rtx3060-12gb"] + MACHINE + ["--prompt-tokens", "16384",
                                                          "--gen-tokens", "512"],
}
#: the README runs its command with the default runtimes only
RUNTIMES = {README: ("all",)}


def run_once(code: Path, args: list[str]) -> tuple[float, float]:
    """Wall-clock and CPU (user + system) seconds of one ``cope advise`` process of the
    checkout ``code`` (its own package first on the path, whatever is installed)."""
    c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cope_core.cli.main", "advise", *args], cwd=code,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(code)))
    dt, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise RuntimeError(f"cope advise {' '.join(args)} failed in {code}: {r.stderr}")
    return dt, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)


def _commit(code: Path) -> str:
    """The checkout's commit, ``+changes`` when its tracked files differ from it."""
    git = ["git", "-C", str(code)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (head or "?") + (" +changes" if dirty else "")


def _stats(runs: list[tuple[float, float]]) -> dict:
    wall, cpu = [w for w, _ in runs], [c for _, c in runs]
    return {"median_s": float(np.median(wall)), "max_s": float(max(wall)),
            "cpu_median_s": float(np.median(cpu)), "samples_s": wall, "cpu_samples_s": cpu}


def _line(name: str, r: dict, base: dict | None = None) -> str:
    ratio = "" if base is None else (f"  {r['median_s'] / base['median_s']:.2f}x wall, "
                                     f"{r['cpu_median_s'] / base['cpu_median_s']:.2f}x CPU "
                                     "of before")
    return (f"  {name:<7} wall median {r['median_s']:5.2f} s (max {r['max_s']:5.2f}), "
            f"CPU {r['cpu_median_s']:5.2f} s{ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", help="another checkout to measure the same cases on")
    ap.add_argument("--only", help="only the cases whose name contains this text")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    codes = {"after": ROOT} | ({"before": Path(args.before).resolve()} if args.before else {})
    cases = {n: c for n, c in CASES.items() if not args.only or args.only in n}
    out: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                             "load_1min": os.getloadavg()[0]},
                 "checkouts": {k: {"path": str(v), "commit": _commit(v)}
                               for k, v in codes.items()}, "results": {}}
    for code in codes.values():                                            # warm-up
        run_once(code, list(CASES.values())[0] + ["--runtime", "llama.cpp"])
    for name, case in cases.items():
        for runtimes in RUNTIMES.get(name, ("llama.cpp", "all")):
            argv = case + ["--runtime", runtimes]
            runs: dict[str, list] = {k: [] for k in codes}
            for i in range(args.repeats):      # interleaved, each first in turn: both
                order = list(codes.items())    # versions see the same load
                for k, code in order[::-1] if i % 2 else order:
                    runs[k].append(run_once(code, argv))
            key = f"{name}, --runtime {runtimes}"
            res = {k: _stats(v) for k, v in runs.items()}
            out["results"][key] = res if args.before else res["after"]
            print(key, flush=True)
            if "before" in res:
                print(_line("before", res["before"]), flush=True)
            print(_line("after", res["after"], res.get("before")), flush=True)
    out["machine"]["load_1min_after"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
