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

_NJIT = dict(nogil=True, cache=True, boundscheck=False)


@numba.njit(**_NJIT)
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


@numba.njit(**_NJIT)
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


@numba.njit(**_NJIT)
def _per_layer_one(routed, predicted, prompt_start, order, K, hist, ins):
    """mutable_per_layer at one K: K slots per layer; a layer may prefetch one predicted expert
    into the next layer, evicting that layer's least recently stamped expert."""
    P = prompt_start.shape[0] - 1
    L = routed.shape[1]
    k = routed.shape[2]
    W = predicted.shape[2]
    E = order.shape[1]
    resident = np.zeros((L, E), np.bool_)
    prv = np.empty((L, E), np.int32)
    nxt = np.empty((L, E), np.int32)
    head = np.empty(L, np.int32)
    tail = np.empty(L, np.int32)
    hits = np.empty(k + 1, np.int64)
    can_prefetch = 0 < K < E and W > 0
    if not can_prefetch:  # recency only matters for eviction: count hits as fixed does
        rank = np.empty((L, E), np.int32)
        for l in range(L):
            for r in range(E):
                rank[l, order[l, r]] = r
        _fixed_one(routed, prompt_start, rank, K, hist)
        return
    for p in range(P):
        resident[:, :] = False
        for l in range(L):
            # initial fill: rank r has stamp -(r+1), so the list runs rank K-1 (head) .. rank 0
            head[l] = -1
            tail[l] = -1
            for r in range(K - 1, -1, -1):
                e = order[l, r]
                resident[l, e] = True
                prv[l, e] = tail[l]
                nxt[l, e] = -1
                if tail[l] >= 0:
                    nxt[l, tail[l]] = e
                else:
                    head[l] = e
                tail[l] = e
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for l in range(L):
                h = 0
                for j in range(k):  # gather hits without a data-dependent branch
                    e = routed[t, l, j]
                    hits[h] = e
                    h += resident[l, e]
                for j in range(h):
                    e = hits[j]
                    if tail[l] != e:  # move to tail
                        a = prv[l, e]
                        b = nxt[l, e]
                        if a >= 0:
                            nxt[l, a] = b
                        else:
                            head[l] = b
                        prv[l, b] = a
                        prv[l, e] = tail[l]
                        nxt[l, e] = -1
                        nxt[l, tail[l]] = e
                        tail[l] = e
                hist[p, l, h] += 1
                if can_prefetch and l < L - 1:
                    n = l + 1
                    q = -1
                    for j in range(W):
                        c = predicted[t, l, j]
                        if c < 0:
                            break
                        if not resident[n, c]:
                            q = c
                            break
                    if q >= 0:
                        v = head[n]
                        head[n] = nxt[n, v]
                        if head[n] >= 0:
                            prv[n, head[n]] = -1
                        else:
                            tail[n] = -1
                        resident[n, v] = False
                        resident[n, q] = True
                        prv[n, q] = tail[n]
                        nxt[n, q] = -1
                        if tail[n] >= 0:
                            nxt[n, tail[n]] = q
                        else:
                            head[n] = q
                        tail[n] = q
                        ins[p, l, h] += 1


@numba.njit(**_NJIT)
def _cross_layer_one(routed, predicted, prompt_start, order, K, hist, ins):
    """mutable_cross_layer at one K: one pool of K*L slots; the victim is the least recently
    stamped expert of any layer but the executing one (ties: lower layer, then lower id)."""
    P = prompt_start.shape[0] - 1
    L = routed.shape[1]
    k = routed.shape[2]
    W = predicted.shape[2]
    E = order.shape[1]
    LE = L * E
    resident = np.zeros(LE, np.bool_)
    prv = np.empty(LE, np.int32)
    nxt = np.empty(LE, np.int32)
    hits = np.empty(k + 1, np.int64)
    can_prefetch = 0 < K < E and W > 0
    if not can_prefetch:  # without prefetches the pool never changes
        rank = np.empty((L, E), np.int32)
        for l in range(L):
            for r in range(E):
                rank[l, order[l, r]] = r
        _fixed_one(routed, prompt_start, rank, K, hist)
        return
    for p in range(P):
        resident[:] = False
        head = -1
        tail = -1
        # equal initial stamps across layers tie-break by lower layer, so rank-major order
        for r in range(K - 1, -1, -1):
            for l in range(L):
                node = l * E + order[l, r]
                resident[node] = True
                prv[node] = tail
                nxt[node] = -1
                if tail >= 0:
                    nxt[tail] = node
                else:
                    head = node
                tail = node
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for l in range(L):
                h = 0
                base = l * E
                for j in range(k):  # gather hits without a data-dependent branch
                    node = base + routed[t, l, j]
                    hits[h] = node
                    h += resident[node]
                for j in range(h):
                    node = hits[j]
                    if tail != node:
                        a = prv[node]
                        b = nxt[node]
                        if a >= 0:
                            nxt[a] = b
                        else:
                            head = b
                        prv[b] = a
                        prv[node] = tail
                        nxt[node] = -1
                        nxt[tail] = node
                        tail = node
                hist[p, l, h] += 1
                if can_prefetch and l < L - 1:
                    nb = base + E
                    q = -1
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
                            a = prv[v]
                            b = nxt[v]
                            if a >= 0:
                                nxt[a] = b
                            else:
                                head = b
                            if b >= 0:
                                prv[b] = a
                            else:
                                tail = a
                            resident[v] = False
                            resident[q] = True
                            prv[q] = tail
                            nxt[q] = -1
                            if tail >= 0:
                                nxt[tail] = q
                            else:
                                head = q
                            tail = q
                            ins[p, l, h] += 1


@numba.njit(parallel=True, **_NJIT)
def _per_layer_sweep(routed, predicted, prompt_start, order, Ks, hist, ins):
    for i in prange(Ks.shape[0]):
        _per_layer_one(routed, predicted, prompt_start, order, Ks[i], hist[i], ins[i])


@numba.njit(parallel=True, **_NJIT)
def _cross_layer_sweep(routed, predicted, prompt_start, order, Ks, hist, ins):
    for i in prange(Ks.shape[0]):
        _cross_layer_one(routed, predicted, prompt_start, order, Ks[i], hist[i], ins[i])
