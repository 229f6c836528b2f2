"""Numba kernels of the synthetic trace generator (:mod:`cope_core.trace.synth`), one prompt per
call. Private: a ``numpy.random.Generator`` (numba draws from the same PCG64 stream numpy would),
arrays and scalars in, preallocated arrays out.

Weighted draws without replacement are sequential: draw an id with probability proportional to
its weight (Walker's alias method: one uniform per draw) and redraw when it is already taken.
That is the same distribution as the exponential race of Efraimidis and Spirakis (both are
successive sampling), at O(1) per id instead of a key for every expert. After ``_TRIES``
rejections the draw is made exactly over the ids still free, so heavy skews cannot stall it.
"""
from __future__ import annotations

import numba
import numpy as np

from ..jit import NJIT

_TRIES = 32


@numba.njit(**NJIT)
def _alias_tables(weight, prob, alias):
    """Walker's alias tables (Vose's construction) of each row of ``weight``: column ``i`` keeps
    itself with probability ``prob[l, i]`` and otherwise stands for ``alias[l, i]``."""
    L, E = weight.shape
    small = np.empty(E, np.int64)
    large = np.empty(E, np.int64)
    scaled = np.empty(E, np.float64)
    for lay in range(L):
        total = 0.0
        for e in range(E):
            total += weight[lay, e]
        ns = nl = 0
        for e in range(E):
            scaled[e] = weight[lay, e] * E / total
            if scaled[e] < 1.0:
                small[ns] = e
                ns += 1
            else:
                large[nl] = e
                nl += 1
        while ns > 0 and nl > 0:
            ns -= 1
            s = small[ns]
            g = large[nl - 1]
            prob[lay, s] = scaled[s]
            alias[lay, s] = g
            scaled[g] = (scaled[g] + scaled[s]) - 1.0
            if scaled[g] < 1.0:
                nl -= 1
                small[ns] = g
                ns += 1
        for j in range(nl):  # what rounding leaves over is exactly 1
            prob[lay, large[j]] = 1.0
            alias[lay, large[j]] = large[j]
        for j in range(ns):
            prob[lay, small[j]] = 1.0
            alias[lay, small[j]] = small[j]


@numba.njit(**NJIT)
def _draw_exact(rng, weight, by_rank, lay, mark, stamp):
    """One id of layer ``lay`` not marked with ``stamp``, drawn over the free ids only: the
    fallback when the alias draws keep hitting taken ids."""
    E = weight.shape[1]
    free = 0.0
    for e in range(E):
        if mark[e] != stamp:
            free += weight[lay, e]
    if free > 0.0:
        u = rng.random() * free
        last = -1
        for e in range(E):
            if mark[e] != stamp:
                last = e
                u -= weight[lay, e]
                if u < 0.0:
                    return e
        return last
    # every free weight underflowed to 0 (enormous skew): the most popular free id
    for r in range(E):
        if mark[by_rank[lay, r]] != stamp:
            return by_rank[lay, r]
    return -1


@numba.njit(forceinline=True, **NJIT)
def _shuffle(rng, out, t, lay, n):
    """Fisher-Yates over ``out[t, lay, :n]``."""
    for j in range(n - 1, 0, -1):
        i = int(rng.random() * (j + 1))
        if i > j:  # guards the float edge u * (j + 1) == j + 1
            i = j
        out[t, lay, j], out[t, lay, i] = out[t, lay, i], out[t, lay, j]


@numba.njit(**NJIT)
def _routed_prompt(rng, prob, alias, weight, by_rank, reuse, out, mark):
    """``out[t, l, :]``: the ``k`` routed ids of one prompt's token ``t`` at layer ``l``.

    Token 0 draws ``k`` distinct ids from the layer's weights; later tokens keep each id of
    the previous token with probability ``reuse`` and draw the rest excluding the kept ones.
    The ids are then shuffled (synthetic data has no score order). ``mark`` (E,) is scratch.
    """
    T, L, k = out.shape
    E = prob.shape[1]
    stamp = 0
    mark[:] = -1
    for t in range(T):
        for lay in range(L):
            stamp += 1
            n = 0
            if t > 0 and reuse > 0.0:
                for j in range(k):
                    e = out[t - 1, lay, j]
                    if rng.random() < reuse:
                        out[t, lay, n] = e
                        mark[e] = stamp
                        n += 1
            while n < k:
                # the alias draw stays inline: passing arrays to a helper per draw costs
                # reference counting that outweighs the draw itself
                e = -1
                for _ in range(_TRIES):
                    u = rng.random() * E
                    i = min(int(u), E - 1)
                    c = i if u - i < prob[lay, i] else alias[lay, i]
                    if mark[c] != stamp:
                        e = c
                        break
                if e < 0:
                    e = _draw_exact(rng, weight, by_rank, lay, mark, stamp)
                out[t, lay, n] = e
                mark[e] = stamp
                n += 1
            _shuffle(rng, out, t, lay, k)


@numba.njit(**NJIT)
def _predicted_prompt(rng, routed, by_rank, p, out, mark):
    """``out[t, l, :]``: the list predicted at layer ``l`` for layer ``l + 1`` of one prompt.

    Each id routed at ``(t, l + 1)`` is in the list with probability ``p``; the rest of the
    ``k`` slots take the most popular ids of layer ``l + 1`` not routed there; the list is
    shuffled and padded with -1 when the layer has too few such ids. The last layer's is empty.
    """
    T, L, k = out.shape
    E = by_rank.shape[1]
    stamp = 0
    mark[:] = -1
    for t in range(T):
        for lay in range(L - 1):
            stamp += 1
            for j in range(k):
                mark[routed[t, lay + 1, j]] = stamp
            n = 0
            for j in range(k):
                if rng.random() < p:
                    out[t, lay, n] = routed[t, lay + 1, j]
                    n += 1
            r = 0
            while n < k and r < E:
                e = by_rank[lay + 1, r]
                r += 1
                if mark[e] != stamp:
                    out[t, lay, n] = e
                    n += 1
            _shuffle(rng, out, t, lay, n)
            for j in range(n, k):
                out[t, lay, j] = -1
        for j in range(k):
            out[t, L - 1, j] = -1
