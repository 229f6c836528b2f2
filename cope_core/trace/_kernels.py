"""Numba kernels over the dense trace arrays: the id-list checks of :meth:`Trace.validate` and the
popularity counts. Private: arrays and scalars in, preallocated arrays out; the callers in
:mod:`cope_core.trace.data` and :mod:`cope_core.parquet_io.trace` turn results into messages.

One pass over the ids replaces the sort-based numpy checks, which made a copy of the whole
``[tokens, layers, k]`` array per check (gigabytes at a million tokens).
"""
from __future__ import annotations

import numba
import numpy as np

from ..jit import NJIT

# Problem kinds returned by _first_list_problem, in the order the checks are reported.
OK, OUT_OF_RANGE, PAD_INSIDE, DUPLICATE, LAST_LAYER = 0, 1, 2, 3, 4


@numba.njit(**NJIT)
def _first_list_problem(ids, E, padded, last_empty, found):
    """First ``(t, l)`` with a problem in ``ids[t, l, :]``, per kind; ``found[kind] = t * L + l``
    (-1 when none).

    ``padded``: -1 may end a list (a suffix; anything else below 0 is out of range).
    ``last_empty``: the last layer's lists must be all padding. Duplicates are found with a
    stamp per expert, so no sort and no copy.
    """
    n, L, W = ids.shape
    seen = np.full(max(E, 1), -1, np.int64)
    for kind in range(found.shape[0]):
        found[kind] = -1
    for t in range(n):
        for l in range(L):
            row = t * L + l
            stamp = row
            ended = False
            for j in range(W):
                v = ids[t, l, j]
                if padded and v == -1:
                    ended = True
                    continue
                if ended and found[PAD_INSIDE] < 0:
                    found[PAD_INSIDE] = row
                if last_empty and l == L - 1 and found[LAST_LAYER] < 0:
                    found[LAST_LAYER] = row
                if v < 0 or v >= E:
                    if found[OUT_OF_RANGE] < 0:
                        found[OUT_OF_RANGE] = row
                    continue
                if seen[v] == stamp:
                    if found[DUPLICATE] < 0:
                        found[DUPLICATE] = row
                seen[v] = stamp


@numba.njit(**NJIT)
def _popularity(routed, E, counts):
    """``counts[l, e]`` += tokens whose routed set at layer ``l`` holds ``e`` (ids in range)."""
    n, L, k = routed.shape
    for t in range(n):
        for l in range(L):
            for j in range(k):
                counts[l, routed[t, l, j]] += 1


def first_list_problem(ids: np.ndarray, n_experts: int, *, padded: bool,
                       last_empty: bool = False) -> np.ndarray:
    """``found[kind]``: flat ``t * L + l`` of the first list with each problem kind, or -1."""
    found = np.empty(5, np.int64)
    _first_list_problem(ids, n_experts, padded, last_empty, found)
    return found


def popularity_counts(routed: np.ndarray, n_experts: int) -> np.ndarray:
    """``counts[l, e]`` as int64 (ids already validated to lie in ``0..E-1``)."""
    counts = np.zeros((routed.shape[1], n_experts), np.int64)
    if routed.size:
        _popularity(routed, n_experts, counts)
    return counts
