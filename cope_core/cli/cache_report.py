"""llama.cpp's own MoE expert cache in ``cope predict``: the search at the VRAM budget, its lines
and its JSON objects (docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..estimate.predict import winner
from ..export import cache_lines
from ..llamacpp import (
    CACHE_LABEL,
    CLASS_LRU_CANDIDATE,
    CacheRecord,
    LlamaAnswer,
    llamacpp_answer,
    llamacpp_record,
    row_spread,
)
from ..matrix import LAYER_PARTITION
from ..profile.data import Profile
from ..trace.data import Trace
from . import cards
from .args import (
    add_llamacpp_options,
    add_request_options,
    request_settings,
)


def add_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--no-llamacpp", action="store_true",
                   help="skip the search of llama.cpp's own MoE cache (--n-cpu-moe x "
                        "--moe-cache-mib x --moe-cache-cpu-share) at the budget")
    s.add_argument("--moe-cache-start", choices=("server", "prompt"), default="server",
                   help="llama.cpp's cache: empty at server start and kept across prompts "
                        "(server, upstream's behaviour) or emptied at every prompt (prompt)")
    add_llamacpp_options(s)
    add_request_options(s)
    cards.add_option(s)
    s.add_argument("--explain", action="store_true",
                   help="print llama.cpp's search in words (fit's placement, every contender, "
                        "the cache's sizes and readings), not only what to run")



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
                           **request_settings(args))



def answer_of(rec: CacheRecord | None, trace: Trace, K: int, cpu_threads: int
              ) -> LlamaAnswer | None:
    """llama.cpp's answer at this prediction's budget, made once for the text and the JSON."""
    return None if not rec else llamacpp_answer(rec, trace.model, cpu_threads,
                                                experts_per_layer=K)


def text_lines(rec: CacheRecord | None, answer: LlamaAnswer | None, trace: Trace,
               explain: bool = False) -> list[str]:
    """The llama.cpp section of ``cope predict``: what to run, or with ``explain`` the search in
    words."""
    if not rec:
        return []
    return ["", f"{CACHE_LABEL} (llama.cpp b11480+), at {rec.expert_budget_gib:.2f} GiB for routed "
                "experts:"] + [line.lstrip("# ") if line.startswith("#") else line
                               for line in cache_lines(answer, rec, trace.model,
                                                       explain=explain)[:-1]]


def json_rows(rec: CacheRecord | None, answer: LlamaAnswer | None, trace: Trace, K: int,
              cpu_threads: int) -> list[dict[str, Any]]:
    """One object per cache candidate (its fastest configuration), after the matrix's; the
    first carries llama.cpp's default (facts) and the answer (what to run)."""
    if not rec:
        return []
    g = trace.model
    versus = rec.to_dict()["versus"]
    out = []
    for i, b in enumerate(rec.best):
        if b.candidate == LAYER_PARTITION:
            continue
        out.append({
            "candidate": b.candidate, "runtime": "llama.cpp", "label": CACHE_LABEL,
            "experts_per_layer": K, "estimator": "cope", "build": b.build,
            "flags": rec.assumed.spell(b.flags(g.dense_layers + g.n_layers,
                                               cpu_threads)).text(),   # the build's spelling
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
               if b.candidate == CLASS_LRU_CANDIDATE else {})})
    base = None if answer is None else answer.baseline
    if out and base is not None:
        out[0]["default_fit"] = base.to_dict()
    if out and answer is not None:
        out[0]["answer"] = answer.to_dict()
    return out
