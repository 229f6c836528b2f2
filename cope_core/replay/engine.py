"""Validated wrappers around the replay kernels (docs/design.md#replay-semantics)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import CopeInputError
from ..matrix import Residency
from ..trace.data import Trace


@dataclass(frozen=True, eq=False)
class ReplayCounts:
    """Hit histograms of one residency over a sweep of cache sizes.

    Attributes
    ----------
    residency : Residency
    ks : ndarray of int64, shape (nK,)
        Cache sizes (experts per layer).
    hist : ndarray of int64, shape (nK, P, L, top_k + 1)
        Tokens of prompt ``p`` that saw ``h`` hits at layer ``l``.
    ins : ndarray of int64, shape (nK, P, L, top_k + 1)
        Of those, the tokens at which layer ``l`` inserted a prefetched expert into ``l + 1``.
    """

    residency: Residency
    ks: np.ndarray
    hist: np.ndarray
    ins: np.ndarray

    def hits(self) -> np.ndarray:
        """Total hits per (K, prompt)."""
        h = np.arange(self.hist.shape[-1])
        return (self.hist * h).sum(axis=(2, 3))

    def prefetches(self) -> np.ndarray:
        """Inserted prefetches per (K, prompt)."""
        return self.ins.sum(axis=(2, 3))


def check_ks(ks: int | Sequence[int] | np.ndarray, n_experts: int) -> np.ndarray:
    """Cache sizes as a sorted int64 array without repeats; any outside ``[0, E]`` is an error,
    not clamped."""
    arr = np.atleast_1d(np.asarray(ks))
    if arr.size == 0:
        raise CopeInputError("no cache size given", field="experts_per_layer")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise CopeInputError(f"expected whole numbers, got {arr.tolist()}",
                                 field="experts_per_layer")
    bad = arr[(arr < 0) | (arr > n_experts)]
    if bad.size:
        raise CopeInputError(f"{int(bad[0])} is out of range, expected 0..{n_experts}",
                             field="experts_per_layer")
    return np.unique(arr.astype(np.int64))  # sorted, each K once


def replay(trace: Trace, order: np.ndarray, residency: Residency | str,
           ks: int | Sequence[int] | np.ndarray) -> ReplayCounts:
    """Replay one residency over the trace at every cache size in ``ks``.

    Parameters
    ----------
    trace : Trace
        The evaluated trace; every prompt starts from the initial fill.
    order : ndarray of int32, shape (L, E)
        Initial-fill order from :func:`fill_order` (normally of a calibration trace).
    residency : Residency or str
    ks : int or sequence of int
        Experts per layer, each in ``[0, E]``.
    """
    residency = Residency(residency)
    g = trace.model
    L, E, k = g.n_layers, g.n_experts, g.top_k
    if order.shape != (L, E):
        raise ValueError(f"fill order must have shape {(L, E)}, got {order.shape}")
    if not (np.sort(order, axis=1) == np.arange(E)).all():
        raise ValueError("each row of the fill order must be a permutation of the expert ids")
    ks = check_ks(ks, E)
    P = trace.n_prompts
    order = np.ascontiguousarray(order, dtype=np.int32)
    hist = np.zeros((ks.size, P, L, k + 1), np.int64)
    ins = np.zeros_like(hist)
    routed, starts = trace.routed, trace.prompt_start.astype(np.int64)
    # rank[l, e]: popularity rank of expert e (the inverse of the fill order), for every kernel
    rank = np.empty((L, E), np.int32)
    rank[np.arange(L)[:, None], order] = np.arange(E, dtype=np.int32)
    # numba (about 0.3 s) loads with the first kernel, not with the package: a server answering
    # from its disk cache (cope_core/app/persisted.py) replays nothing
    from . import _kernels
    if residency is Residency.FIXED:
        if ks.size == 1:
            _kernels._fixed_one(routed, starts, rank, int(ks[0]), hist[0])
        else:
            hist[:] = _fixed_sweep(routed, starts, rank, ks, k, E)
    elif ks.size == 1:  # one pass: no thread team, so callers may run residencies side by side
        one = (_kernels._per_layer_one if residency is Residency.MUTABLE_PER_LAYER
               else _kernels._cross_layer_one)
        one(routed, trace.predicted, starts, order, rank, int(ks[0]), hist[0], ins[0])
    else:
        sweep = (_kernels._per_layer_sweep if residency is Residency.MUTABLE_PER_LAYER
                 else _kernels._cross_layer_sweep)
        sweep(routed, trace.predicted, starts, order, rank, ks, hist, ins)
    return ReplayCounts(residency, ks, hist, ins)


def _fixed_sweep(routed, starts, rank, ks, k, E):
    P, L = starts.size - 1, routed.shape[1]
    cnt = np.zeros((P, L, k, E), np.int64)
    from . import _kernels
    _kernels._fixed_order_stats(routed, starts, rank, cnt)
    # at_least[p, l, j, K] = tokens with >= j+1 hits at cache size K
    cum = np.zeros((P, L, k, E + 1), np.int64)
    np.cumsum(cnt, axis=3, out=cum[..., 1:])
    at_least = cum[..., ks]                                   # (P, L, k, nK)
    tokens = np.diff(starts)[:, None, None, None]
    ge = np.concatenate([np.broadcast_to(tokens, (P, L, 1, ks.size)), at_least,
                         np.zeros((P, L, 1, ks.size), np.int64)], axis=2)
    hist = ge[:, :, :-1, :] - ge[:, :, 1:, :]                 # (P, L, k+1, nK)
    return np.moveaxis(hist, 3, 0)
