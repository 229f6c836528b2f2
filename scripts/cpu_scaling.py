"""How llama.cpp's CPU MoE decode scales on this machine (issue 53, first part): llama-bench's tg
on the CPU build at every thread count, for two random-weight qwen3moe models that differ only in
their block count (so in the bytes a token reads), beside a memory probe at the same thread
counts. Per thread count the two models' times per token give, exactly, the part of a token's
time that is bytes over an effective bandwidth and the part that is fixed:
``1 / tps = fixed + bytes / bandwidth``; the effective bandwidth is set beside the probe's.

    python scripts/cpu_scaling.py --run      # measure (an idle machine; minutes), then --write
    python scripts/cpu_scaling.py [--write | --check]

``--run`` writes both GGUFs (tests/llama_tools.py ``write_tiny_moe``: 8 F16 experts of
1024 x 2048, top-2; 8 and 2 blocks), runs ``llama-bench -p 0 -n 64 -r 5 -t 1..N`` of the CPU
build (scripts/runtimes.sh) on each, and probes host memory with 1..N threads
(:func:`cope_core.mechanisms.probe.probe_host_memory`); everything goes to
benchmarks/results/cpu-scaling.json. ``--write`` puts the derivation's table into
docs/design.md between its cpu-scaling markers; ``--check`` exits 1 when it is not current.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doc_blocks import block_main  # beside this script, on sys.path when it runs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "results" / "cpu-scaling.json"
START, END = "<!-- cpu-scaling:start -->", "<!-- cpu-scaling:end -->"
SHAPE = dict(n_experts=8, hidden=1024, inter=2048, heads=16, kv_heads=8, head_dim=64,
             vocab=512)
BLOCKS = (8, 2)
TOP_K = 2                       # write_tiny_moe's n_used


def token_bytes(n_blocks: int) -> int:
    """Bytes of weights a decode token reads (F16): each block's attention projections, router
    and top-2 experts; the output head (the embedding is one row, left out)."""
    s = SHAPE
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    attn = s["hidden"] * (q + 2 * kv) + q * s["hidden"]
    experts = TOP_K * 3 * s["hidden"] * s["inter"]
    router = 2 * s["n_experts"] * s["hidden"]        # F32: two F16 elements' bytes each
    return 2 * (n_blocks * (attn + experts + router) + s["vocab"] * s["hidden"])


def run() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_tools import write_tiny_moe

    from cope_core.mechanisms.probe import probe_host_memory
    cache = os.environ.get("COPE_RUNTIMES_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cope-explorer")
    bench = Path(cache) / "llama.cpp-b11434" / "bin" / "llama-bench"
    if not bench.exists():
        raise SystemExit(f"cpu_scaling: {bench} is missing: bash scripts/runtimes.sh")
    n = os.cpu_count() or 1
    threads = list(range(1, n + 1))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for blocks in BLOCKS:
            model = write_tiny_moe(Path(tmp) / f"moe-{blocks}.gguf", n_blocks=blocks, **SHAPE)
            env = dict(os.environ, LD_LIBRARY_PATH=str(bench.parent))
            out = subprocess.run([str(bench), "-m", str(model), "-p", "0", "-n", "64", "-r", "5",
                                  "-t", ",".join(map(str, threads)), "-o", "jsonl"], env=env,
                                 check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                r = json.loads(line)
                rows.append({"blocks": blocks, "threads": r["n_threads"],
                             "avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"],
                             "samples_ts": r["samples_ts"], "build": r["build_number"]})
    probe = []
    for t in threads:
        hb = probe_host_memory(seconds=3.0, threads=t)
        probe.append({"threads": t, "read_bytes_per_s": hb.all_threads,
                      "one_thread_bytes_per_s": hb.one_thread})
    record = {"what": "scripts/cpu_scaling.py --run", "when": time.strftime("%Y-%m-%d"),
              "shape": SHAPE, "blocks": list(BLOCKS), "rows": rows, "probe": probe}
    partial = DATA.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(DATA)
    print(f"wrote {DATA}")


def table() -> str:
    rec = json.loads(DATA.read_text())
    ts = {(r["blocks"], r["threads"]): r["avg_ts"] for r in rec["rows"]}
    probe = {p["threads"]: p["read_bytes_per_s"] for p in rec["probe"]}
    big, small = rec["blocks"]
    b_big, b_small = token_bytes(big), token_bytes(small)
    lines = [f"| threads | tg t/s, {big} blocks ({b_big / 2**20:.0f} MiB/token) | "
             f"{small} blocks ({b_small / 2**20:.0f} MiB/token) | effective bandwidth (GB/s) "
             "| fixed per token (ms) | fixed share, 8 blocks | memory probe (GB/s) | "
             "effective / probe |", "|---|---|---|---|---|---|---|---|"]
    for t in sorted(probe):
        if (big, t) not in ts or (small, t) not in ts:
            continue
        t_big, t_small = 1 / ts[(big, t)], 1 / ts[(small, t)]
        bw = (b_big - b_small) / (t_big - t_small)          # the bytes' slope
        fixed = t_big - b_big / bw
        lines.append(f"| {t} | {ts[(big, t)]:.1f} | {ts[(small, t)]:.1f} | {bw / 1e9:.1f} | "
                     f"{1e3 * fixed:.2f} | {100 * fixed / t_big:.0f} % | "
                     f"{probe[t] / 1e9:.1f} | {bw / probe[t]:.2f} |")
    return "\n".join(lines + ["", f"Measured {rec['when']} by `python scripts/cpu_scaling.py "
                              "--run` (llama.cpp b11434's CPU build, `llama-bench -p 0 -n 64 "
                              "-r 5`); the fixed part and the bandwidth solve `1 / tps = fixed "
                              "+ bytes / bandwidth` from the two models at each thread count."])


def main() -> int:
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "design.md", START, END, table,
                      run=run)


if __name__ == "__main__":
    raise SystemExit(main())
