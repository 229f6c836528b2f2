"""llama.cpp's own MoE expert cache in ``cope predict``: the search at the VRAM budget, its lines
and its JSON objects (docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..errors import CopeInputError
from ..estimate.predict import winner
from ..export.llamacpp import cache_lines
from ..llamacpp import (
    CLASS_LRU,
    LABEL,
    CacheRecord,
    LlamaSettings,
    baseline_of,
    cache_flags,
    llama_settings,
    llamacpp_record,
    row_spread,
)
from ..matrix import LAYER_PARTITION
from ..profile.data import Profile
from ..trace.data import Trace


def add_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--no-llamacpp", action="store_true",
                   help="skip the search of llama.cpp's own MoE cache (--n-cpu-moe x "
                        "--moe-cache-mib x --moe-cache-cpu-share) at the budget")
    s.add_argument("--moe-cache-start", choices=("server", "prompt"), default="server",
                   help="llama.cpp's cache: empty at server start and kept across prompts "
                        "(server, upstream's behaviour) or emptied at every prompt (prompt)")
    add_llama_options(s)


def add_llama_options(s: argparse.ArgumentParser) -> None:
    """How llama.cpp is run, for its memory (the llama.cpp search and its --fit baseline)."""
    s.add_argument("--ctx", type=int, default=4096, metavar="N",
                   help="llama.cpp's context (-c): its KV cache on the GPU (default 4096)")
    s.add_argument("-ctk", "--cache-type-k", default="f16", metavar="TYPE",
                   help="llama.cpp's K cache type (-ctk: f16, q8_0, ...; default f16)")
    s.add_argument("-ctv", "--cache-type-v", default="f16", metavar="TYPE",
                   help="llama.cpp's V cache type (-ctv; default f16)")
    s.add_argument("--fitt", type=int, default=1024, metavar="MIB",
                   help="llama.cpp's --fit margin (-fitt, MiB kept free; default 1024)")


def llama_settings_of(args: argparse.Namespace) -> LlamaSettings:
    """The options of :func:`add_llama_options`, with --model's GGUF tensor table when
    --model names a GGUF file (else the table is made from the priced geometry)."""
    model = getattr(args, "model", None)
    gguf = model if model and os.path.isfile(model) and model.lower().endswith(".gguf") \
        else None
    if args.fitt < 0:
        raise CopeInputError(f"expected MiB >= 0, got {args.fitt}", field="--fitt")
    return llama_settings(gguf, n_ctx=args.ctx, margin_bytes=args.fitt << 20,
                          type_k=args.cache_type_k, type_v=args.cache_type_v)


def cache_search(args: argparse.Namespace, trace: Trace, profile: Profile,
                 calibration: Trace | None, df: pd.DataFrame, ks: list[int],
                 raw_samples: Mapping[str, Sequence[float]] | None = None
                 ) -> CacheRecord | None:
    """The ``llamacpp_cache`` record at this prediction's budget, under its draws, seed and raw
    samples, or None when not asked for (a sweep of K, another estimator, ``--no-llamacpp``, a
    budget nothing fits)."""
    if getattr(args, "no_llamacpp", False) or len(ks) != 1 or args.estimator != "cope":
        return None
    K = ks[0]
    return llamacpp_record(trace, profile, calibration, experts_per_layer=K,
                           vram_gib=args.vram_gib, matrix_winner=str(winner(df, K).candidate),
                           cpu_threads=df.attrs["cpu_threads"], gpu_share=df.attrs["gpu_share"],
                           persist=args.moe_cache_start == "server", draws=args.draws,
                           seed=args.seed, raw_samples=raw_samples,
                           llama=llama_settings_of(args))


def text_lines(rec: CacheRecord | None, trace: Trace, cpu_threads: int) -> list[str]:
    if not rec:
        return []
    return ["", f"{LABEL} (llama.cpp b11480+), at {rec.expert_budget_gib:.2f} GiB for routed "
                "experts:"] + [line.lstrip("# ") if line.startswith("#") else line
                               for line in cache_lines(rec, trace.model, cpu_threads)[:-1]]


def json_rows(rec: CacheRecord | None, trace: Trace, K: int, cpu_threads: int
              ) -> list[dict[str, Any]]:
    """One object per cache candidate (its fastest configuration), after the matrix's."""
    if not rec:
        return []
    g = trace.model
    versus = rec.to_dict()["versus"]
    out = []
    for i, b in enumerate(rec.best):
        if b.candidate == LAYER_PARTITION:
            continue
        out.append({
            "candidate": b.candidate, "runtime": "llama.cpp", "label": LABEL,
            "experts_per_layer": K, "estimator": "cope", "build": b.build,
            "flags": cache_flags(g.dense_layers + g.n_layers, b.n_cpu_moe, b.cache_mib,
                                 b.cpu_share, cpu_threads),
            "n_cpu_moe": b.n_cpu_moe, "cache_mib": b.cache_mib,
            "cpu_share": b.cpu_share, "slots": b.slots, "tpot_us": b.tpot_us,
            "tpot_ci_us": versus[0]["tpot_ci_us"] if i == 0 else None,
            "hits_per_token": b.hits, "uploads_per_token": b.uploads,
            "cpu_misses_per_token": b.cpu_misses,
            "versus": versus[1:] if i == 0 else [],
            # the class-LRU rests on inferred rules: its prediction under each reading
            **({"rule_readings": rec.to_dict().get("rule_readings", []),
                "rule_spread_us": None if (ends := row_spread(rec, b)) is None
                else [r.tpot_us for r in ends]}
               if b.candidate == CLASS_LRU else {})})
    base = baseline_of(rec)
    if out and base is not None:
        out[0]["default_fit"] = base.to_dict()
    return out
