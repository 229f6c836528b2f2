"""Numba kernels of the cache replay (docs/design.md#replay-semantics). Private: arrays and scalars
in, preallocated arrays out, no validation (the wrappers in :mod:`cope_core.replay.engine` do that).

Outputs per prompt ``p`` and layer ``l``: ``hist[p, l, h]`` counts tokens that saw ``h`` hits,
``ins[p, l, h]`` counts those of them at which layer ``l`` inserted a prefetched expert into the
next layer. Hit histograms do not depend on the execution strategy, so one pass per residency
serves all four executions.

Recency is kept as doubly linked lists ordered by stamp (head = smallest stamp). Every new stamp
is the largest so far, so stamping is "move to tail" and the victim is the head: O(1) per event
instead of a scan for the minimum.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..jit import NJIT
from .lists import list_append, list_to_tail, list_unlink


@numba.njit(**NJIT)
def _fixed_one(routed, prompt_start, rank, K, hist):
    """Fixed residency at one K: expert e of layer l is resident iff its popularity rank < K."""
    P = prompt_start.shape[0] - 1
    L = routed.shape[1]
    k = routed.shape[2]
    for p in range(P):
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for l in range(L):
                h = 0
                for j in range(k):
                    if rank[l, routed[t, l, j]] < K:
                        h += 1
                hist[p, l, h] += 1


@numba.njit(**NJIT)
def _fixed_order_stats(routed, prompt_start, rank, cnt):
    """For the fixed-residency K sweep: ``cnt[p, l, j, r]`` counts tokens whose j-th smallest
    routed popularity rank is r. At cache size K a token has >= j+1 hits iff that rank < K."""
    P = prompt_start.shape[0] - 1
    L = routed.shape[1]
    k = routed.shape[2]
    buf = np.empty(k, np.int64)
    for p in range(P):
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for l in range(L):
                for j in range(k):  # insertion sort: k is small (<= 16 in practice)
                    v = rank[l, routed[t, l, j]]
                    i = j
                    while i > 0 and buf[i - 1] > v:
                        buf[i] = buf[i - 1]
                        i -= 1
                    buf[i] = v
                for j in range(k):
                    cnt[p, l, j, buf[j]] += 1


@numba.njit(forceinline=True, **NJIT)
def _gather_hits(routed, t, l, k, base, resident, hits):
    """Resident nodes among token ``t``'s experts at layer ``l``, in routed order, into ``hits``;
    returns how many (written without a data-dependent branch)."""
    h = 0
    for j in range(k):
        node = base + routed[t, l, j]
        hits[h] = node
        h += resident[node]
    return h


@numba.njit(**NJIT)
def _per_layer_one(routed, predicted, prompt_start, order, rank, K, hist, ins):
    """mutable_per_layer at one K: K slots per layer; a layer may prefetch one predicted expert
    into the next layer, evicting that layer's least recently stamped expert."""
    P = prompt_start.shape[0] - 1
    L = routed.shape[1]
    k = routed.shape[2]
    E = order.shape[1]
    W = predicted.shape[2]
    if not (0 < K < E and W > 0):
        _fixed_one(routed, prompt_start, rank, K, hist)  # never a prefetch: hits as fixed
        return
    resident = np.zeros(L * E, np.bool_)
    prv = np.empty(L * E, np.int64)
    nxt = np.empty(L * E, np.int64)
    head = np.empty(L, np.int64)
    tail = np.empty(L, np.int64)
    hits = np.empty(k + 1, np.int64)
    for p in range(P):
        resident[:] = False
        for l in range(L):
            # initial fill: rank r has stamp -(r+1), so the list runs rank K-1 (head) .. rank 0
            hd, tl = -1, -1
            for r in range(K - 1, -1, -1):
                node = l * E + order[l, r]
                resident[node] = True
                hd, tl = list_append(prv, nxt, hd, tl, node)
            head[l], tail[l] = hd, tl
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for l in range(L):
                h = _gather_hits(routed, t, l, k, l * E, resident, hits)
                hd, tl = head[l], tail[l]
                for j in range(h):
                    hd, tl = list_to_tail(prv, nxt, hd, tl, hits[j])
                head[l], tail[l] = hd, tl
                hist[p, l, h] += 1
                if l < L - 1:
                    n = l + 1
                    q = -1
                    nb = n * E
                    for j in range(W):
                        c = predicted[t, l, j]
                        if c < 0:
                            break
                        if not resident[nb + c]:
                            q = nb + c
                            break
                    if q >= 0:
                        hd, tl = head[n], tail[n]
                        v = hd                                  # the layer's oldest stamp
                        hd, tl = list_unlink(prv, nxt, hd, tl, v)
                        resident[v] = False
                        resident[q] = True
                        head[n], tail[n] = list_append(prv, nxt, hd, tl, q)
                        ins[p, l, h] += 1


@numba.njit(**NJIT)
def _cross_layer_one(routed, predicted, prompt_start, order, rank, K, hist, ins):
    """mutable_cross_layer at one K: one pool of K*L slots; the victim is the least recently
    stamped expert of any layer but the executing one (ties: lower layer, then lower id)."""
    P = prompt_start.shape[0] - 1
    L = routed.shape[1]
    k = routed.shape[2]
    E = order.shape[1]
    W = predicted.shape[2]
    if not (0 < K < E and W > 0):
        _fixed_one(routed, prompt_start, rank, K, hist)  # the pool never changes
        return
    resident = np.zeros(L * E, np.bool_)
    prv = np.empty(L * E, np.int64)
    nxt = np.empty(L * E, np.int64)
    hits = np.empty(k + 1, np.int64)
    for p in range(P):
        resident[:] = False
        head, tail = -1, -1
        # equal initial stamps across layers tie-break by lower layer, so rank-major order
        for r in range(K - 1, -1, -1):
            for l in range(L):
                node = l * E + order[l, r]
                resident[node] = True
                head, tail = list_append(prv, nxt, head, tail, node)
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for l in range(L):
                h = _gather_hits(routed, t, l, k, l * E, resident, hits)
                for j in range(h):
                    head, tail = list_to_tail(prv, nxt, head, tail, hits[j])
                hist[p, l, h] += 1
                if l < L - 1:
                    q = -1
                    nb = (l + 1) * E
                    for j in range(W):
                        c = predicted[t, l, j]
                        if c < 0:
                            break
                        if not resident[nb + c]:
                            q = nb + c
                            break
                    if q >= 0:
                        v = head  # oldest node not of the executing layer
                        while v >= 0 and v // E == l:
                            v = nxt[v]
                        if v >= 0:
                            head, tail = list_unlink(prv, nxt, head, tail, v)
                            resident[v] = False
                            resident[q] = True
                            head, tail = list_append(prv, nxt, head, tail, q)
                            ins[p, l, h] += 1


@numba.njit(parallel=True, **NJIT)
def _per_layer_sweep(routed, predicted, prompt_start, order, rank, Ks, hist, ins):
    for i in prange(Ks.shape[0]):
        _per_layer_one(routed, predicted, prompt_start, order, rank, Ks[i], hist[i], ins[i])


@numba.njit(parallel=True, **NJIT)
def _cross_layer_sweep(routed, predicted, prompt_start, order, rank, Ks, hist, ins):
    for i in prange(Ks.shape[0]):
        _cross_layer_one(routed, predicted, prompt_start, order, rank, Ks[i], hist[i], ins[i])
