"""llama.cpp's own MoE expert cache in ``cope predict``: the search at the VRAM budget, its lines
and its JSON objects (docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from ..estimate.llamacpp_cache import LABEL, cache_record, compare, search
from ..estimate.predict import winner
from ..export.llamacpp import cache_flags, cache_lines
from ..geometry import GIB
from ..profile.data import Profile
from ..trace.data import Trace


def add_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--no-llamacpp", action="store_true",
                   help="skip the search of llama.cpp's own MoE cache (--n-cpu-moe x "
                        "--moe-cache-mib x --moe-cache-cpu-share) at the budget")
    s.add_argument("--moe-cache-start", choices=("server", "prompt"), default="server",
                   help="llama.cpp's cache: empty at server start and kept across prompts "
                        "(server, upstream's behaviour) or emptied at every prompt (prompt)")


def cache_search(args: argparse.Namespace, trace: Trace, profile: Profile,
                 calibration: Trace | None, df: pd.DataFrame, ks: list[int]) -> dict | None:
    """The ``llamacpp_cache`` record at this prediction's budget, or None when not asked for
    (a sweep of K, another estimator, ``--no-llamacpp``, a budget nothing fits)."""
    if getattr(args, "no_llamacpp", False) or len(ks) != 1 or args.estimator != "cope":
        return None
    g, K = trace.model, ks[0]
    budget = (g.expert_budget_bytes(args.vram_gib * GIB) if args.vram_gib is not None
              else K * g.per_k_bytes)
    if budget < 0:
        return None
    found = search(trace, profile, budget, cpu_threads=df.attrs["cpu_threads"],
                   gpu_share=df.attrs["gpu_share"], persist=args.moe_cache_start == "server")
    versus = compare(found, trace, profile, str(winner(df, K).candidate), calibration=calibration,
                     experts_per_layer=K, draws=args.draws, seed=args.seed)
    return cache_record(found, versus)


def text_lines(rec: dict | None, trace: Trace, cpu_threads: int) -> list[str]:
    if not rec:
        return []
    return ["", f"{LABEL} (llama.cpp b11480+), at {rec['expert_budget_gib']:.2f} GiB for routed "
                "experts:"] + [line.lstrip("# ") if line.startswith("#") else line
                               for line in cache_lines(rec, trace.model, cpu_threads)[:-1]]


def json_rows(rec: dict | None, trace: Trace, K: int, cpu_threads: int) -> list[dict[str, Any]]:
    """One object per cache candidate (its fastest configuration), after the matrix's."""
    if not rec:
        return []
    g = trace.model
    out = []
    for i, b in enumerate(rec["best"]):
        if b["candidate"] == "layer_partition":
            continue
        v = rec["versus"][0] if i == 0 else None
        out.append({
            "candidate": b["candidate"], "runtime": "llama.cpp", "label": LABEL,
            "experts_per_layer": K, "estimator": "cope", "build": b["build"],
            "flags": cache_flags(g.dense_layers + g.n_layers, b["n_cpu_moe"], b["cache_mib"],
                                 b["cpu_share"], cpu_threads),
            "n_cpu_moe": b["n_cpu_moe"], "cache_mib": b["cache_mib"],
            "cpu_share": b["cpu_share"], "slots": b["slots"], "tpot_us": b["tpot_us"],
            "tpot_ci_us": None if v is None else v["tpot_ci_us"],
            "hits_per_token": b["hits"], "uploads_per_token": b["uploads"],
            "cpu_misses_per_token": b["cpu_misses"],
            "versus": rec["versus"][1:] if i == 0 else []})
    return out
