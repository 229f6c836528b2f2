"""Hits of llama.cpp's MoE cache under every reading of the class-LRU's inferred rules, and of
the LRU, on a trace at several cache sizes (docs/design.md#llamacpp-moe-cache quotes its output).

    python3 scripts/cache_readings.py [TRACE] [--n-cpu N] [--mib 361 1024 4096 14536]
"""
from __future__ import annotations

import argparse

from cope_core import parquet_io
from cope_core.llamacpp import (
    READINGS,
    CacheConfig,
    CacheVersion,
    cache_layout,
    cliff_mib,
    replay_cache,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?",
                    default="data/examples/gguf-qwen3-30b-a3b-q4_k_m-trace.parquet")
    ap.add_argument("--n-cpu", type=int, default=None, help="host MoE layers (default: all)")
    ap.add_argument("--mib", type=int, nargs="+", default=[361, 1024, 4096, 14536])
    ap.add_argument("--share", type=float, nargs="+", default=[0.0, 0.9])
    a = ap.parse_args()
    tr = parquet_io.read_trace(a.trace)
    g = tr.model
    n = g.n_layers if a.n_cpu is None else a.n_cpu
    print(f"{a.trace}: {int(tr.tokens_per_prompt.sum())} decoded tokens in {tr.n_prompts} "
          f"prompts, {n} host MoE layers, top-{g.top_k}; hits summed over tokens and layers")
    print("slots: " + ", ".join(f"{m} MiB {cache_layout(g, n, m).n_slots}" for m in a.mib)
          + f"; cliff: LRU {cliff_mib(g, n, CacheVersion.LRU)} MiB, class-LRU "
          f"{cliff_mib(g, n, CacheVersion.CLASS_LRU)} MiB")
    lru = replay_cache(tr, [CacheConfig(n, m, 0.0, CacheVersion.LRU) for m in a.mib])
    print(f"{'LRU':42s}" + "".join(f"{m:>9d} MiB" for m in a.mib))
    print(f"{'':42s}" + "".join(f"{int(h):>13d}" for h in lru.totals()["hits"].sum(axis=1)))
    for share in a.share:
        cfgs = [CacheConfig(n, m, share, CacheVersion.CLASS_LRU) for m in a.mib]
        print(f"class-LRU, --moe-cache-cpu-share {share:g}")
        for r in READINGS:
            if not share and r.cpu_order != READINGS[0].cpu_order:
                continue                          # without a CPU share the order is moot
            hits = replay_cache(tr, cfgs, reading=r).totals()["hits"].sum(axis=1)
            print(f"  {r.label:40s}" + "".join(f"{int(h):>13d}" for h in hits))


if __name__ == "__main__":
    main()
