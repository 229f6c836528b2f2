"""Plain-numpy helpers of the MoE cache replay
(:func:`cope_core.llamacpp.cache.moe_cache.replay_cache`):
which configurations never evict and their counts without a replay, and how the replayed
ones are shared among the threads. Private."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: a class-LRU lookup's replay time against an LRU one's, to share the configurations among
#: the threads (about 4x: 450-700 ns against 150 ns per lookup, measured on Qwen3-30B-A3B's
#: search); it changes only which thread replays what, never a count
CLASS_LRU_WEIGHT = 4.0


def buckets(run: Sequence[int], weight: np.ndarray, threads: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """The configurations ``run`` dealt to ``threads`` buckets, heaviest first, each to the
    lightest bucket so far: ``(bucket_start, run_order)`` for the kernel."""
    loads = [0.0] * max(1, min(threads, len(run)))
    members: list[list[int]] = [[] for _ in loads]
    for i in sorted(run, key=lambda i: -weight[i]):
        b = loads.index(min(loads))
        loads[b] += float(weight[i])
        members[b].append(i)
    sizes = [len(m) for m in members]
    return (np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            np.array([i for m in members for i in m], np.int64))


def distinct_per_layer(routed: np.ndarray, n_experts: int) -> np.ndarray:
    """How many different experts each MoE layer of ``routed`` (tokens x layers x top_k) routes
    to."""
    L = routed.shape[1]
    seen = np.zeros((L, n_experts), np.bool_)
    seen[np.arange(L)[None, :, None], routed] = True
    return seen.sum(axis=1)


def first_use_counts(routed: np.ndarray, prompt_start: np.ndarray, n_experts: int,
                     persist: bool) -> np.ndarray:
    """``out[l, p, h]``: tokens of prompt ``p`` at which layer ``l`` routed ``h`` experts it had
    routed to before (at an earlier token of the trace, or of the prompt when not ``persist``):
    a never-evicting cache's hits. ``routed``: tokens x layers x top_k, distinct ids per row."""
    r = routed.astype(np.int64)
    T, L, k = r.shape
    P = prompt_start.shape[0] - 1
    prompt = np.repeat(np.arange(P), np.diff(prompt_start))
    key = np.arange(L)[None, :, None] * n_experts + r
    if not persist:
        key = key + prompt[:, None, None] * (L * n_experts)
    # the flat order is token-major: each key's first index is its first token
    _, first, inverse = np.unique(key.ravel(), return_index=True, return_inverse=True)
    first_token = (first // (L * k))[inverse].reshape(T, L, k)
    hits = (first_token < np.arange(T)[:, None, None]).sum(axis=2)
    at = (np.arange(L)[None, :] * P + prompt[:, None]) * (k + 1) + hits
    return np.bincount(at.ravel(), minlength=L * P * (k + 1)).reshape(L, P, k + 1)
