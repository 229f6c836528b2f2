"""Numba kernels of llama.cpp's MoE expert cache (docs/design.md#llamacpp-moe-cache). Private:
arrays and scalars in, preallocated arrays out, no validation (the wrapper in
:mod:`cope_core.llamacpp.cache.moe_cache` does that).

The cache covers the first ``N`` MoE layers (their experts are host-resident); each layer belongs
to one *group* (layers with the same expert tensor layout), and each group is one pool of slots
with its own eviction state, keyed by (layer, expert). Per token and cached layer the kernel
counts ``h`` hits, ``c`` misses computed on the CPU and ``u`` uploads into ``cnt[p, h, c]`` (u is
``top_k - h - c``).

A configuration's slots are numbered from 0: group ``g`` owns ``off[g] .. off[g+1]-1``. Recency
lists are doubly linked over slots (``prv``/``nxt``, -1 ends a list); the head is the least
recently used.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ...jit import NJIT
from ...replay.lists import list_append, list_to_tail, list_unlink

#: class-LRU constants of llama.cpp b12170 (src/llama-moe-cache.cpp, struct moe_cache_lru)
N_CLASS = 8
HALF_LIFE = 128.0
#: the class-LRU's clock, as read (``moe_cache.Reading``): one tick per decoded token; each cached
#: layer's own clock, ticked after its lookup; or ticked before it
TOKEN_CLOCK, LAYER_CLOCK, LAYER_CLOCK_FIRST = 0, 1, 2
#: which misses the CPU share takes: the coldest; or the first in the plan (ascending id)
COLDEST, ASCENDING = 0, 1
#: 2 ** -c for each class: the victim's score age / 2**c as a product, exact (a power of two)
_INV_POW2 = np.array([2.0 ** -c for c in range(N_CLASS)])
#: a score's decay over ``d`` clock ticks, 2 ** (-d / HALF_LIFE), for the ages a trace of a few
#: thousand tokens has: libm's exp2 was a tenth of the replay. Python's math.exp2 and the
#: kernels' are the same C library function (tests/test_cache_kernels.py checks it), so a
#: looked-up value is the one computed; older ages call exp2 (:func:`_decay`)
_DECAY = np.array([math.exp2(-d / HALF_LIFE) for d in range(4096)])
#: a float64's mantissa bits; scores within 2**-40 of a power of two (either side) take libm's
#: log2 (:func:`_class`), whose rounding may land on the power
_MANT = (1 << 52) - 1
_EDGE = 1 << 12


@numba.njit(forceinline=True, **NJIT)
def _sorted_misses(routed, t, l, k, base, slot_of, miss):
    """The token's experts at layer ``l`` not in the cache, ascending by id (upstream sorts the
    misses so consecutive experts get consecutive slots); returns how many."""
    m = 0
    for j in range(k):
        e = routed[t, l, j]
        if slot_of[base + e] < 0:
            i = m
            while i > 0 and miss[i - 1] > e:
                miss[i] = miss[i - 1]
                i -= 1
            miss[i] = e
            m += 1
    return m


@numba.njit(**NJIT)
def _lru_one(routed, prompt_start, layers, n_cached, group, off, persist, E, cnt):
    """b11480's cache: one LRU list per group, updated once per layer lookup; hits move to the
    most recent end in routed order, then each miss (ascending id) takes the head slot (an empty
    slot while there is one: they start at the head in slot order)."""
    P = prompt_start.shape[0] - 1
    k = routed.shape[2]
    G = off.shape[0] - 1
    S = off[G]
    key_of = np.empty(S, np.int64)
    prv = np.empty(S, np.int64)
    nxt = np.empty(S, np.int64)
    head = np.empty(G, np.int64)
    tail = np.empty(G, np.int64)
    slot_of = np.empty(n_cached * E, np.int64)
    miss = np.empty(k, np.int64)
    for p in range(P):
        if p == 0 or not persist:
            slot_of[:] = -1
            key_of[:] = -1
            for g in range(G):
                hd, tl = -1, -1
                for s in range(off[g], off[g + 1]):
                    hd, tl = list_append(prv, nxt, hd, tl, s)
                head[g], tail[g] = hd, tl
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for i_l in range(n_cached):
                l = layers[i_l]
                g = group[i_l]
                base = i_l * E
                hd, tl = head[g], tail[g]
                h = 0
                for j in range(k):
                    s = slot_of[base + routed[t, l, j]]
                    if s >= 0:
                        h += 1
                        hd, tl = list_to_tail(prv, nxt, hd, tl, s)
                m = _sorted_misses(routed, t, l, k, base, slot_of, miss)
                for i in range(m):
                    s = hd
                    if key_of[s] >= 0:
                        slot_of[key_of[s]] = -1
                    key_of[s] = base + miss[i]
                    slot_of[base + miss[i]] = s
                    hd, tl = list_to_tail(prv, nxt, hd, tl, s)
                head[g], tail[g] = hd, tl
                cnt[p, h, 0] += 1


@numba.njit(forceinline=True, **NJIT)
def _class(v, fbits, ibits):
    """``min(floor(log2(v)), N_CLASS-1)`` for a score ``v >= 1``, from its exponent bits
    (``fbits``/``ibits``: one float64 and its int64 view, scratch): libm's log2 was a fifth of
    the replay. Where ``v`` is within 2**-40 of a power of two log2's rounding may reach the
    power, so there (and only there) log2 itself decides, as before; 1.0 is class 0 (C99
    F.9.3.8: log2(1) is +0)."""
    fbits[0] = v
    bits = ibits[0]
    c = (bits >> 52) - 1023
    if c >= N_CLASS - 1:
        return N_CLASS - 1
    mant = bits & _MANT
    if (mant <= _EDGE or mant >= _MANT - _EDGE) and v != 1.0:
        return min(int(math.floor(math.log2(v))), N_CLASS - 1)
    return c


@numba.njit(forceinline=True, **NJIT)
def _decay(d):
    """``2 ** (-d / HALF_LIFE)`` for ``d`` clock ticks (:data:`_DECAY`)."""
    if 0 <= d < _DECAY.shape[0]:
        return _DECAY[d]
    return math.exp2(-d / HALF_LIFE)


@numba.njit(forceinline=True, **NJIT)
def _use(crf, last, key, clock, fbits, ibits):
    """One use of ``key`` at ``clock``: its score decays by half every HALF_LIFE tokens since its
    last use, then counts this use; returns its class (floor(log2 score), at most N_CLASS-1)."""
    if last[key] >= 0:
        v = crf[key] * _decay(clock - last[key]) + 1.0
    else:
        v = 1.0
    crf[key] = v
    last[key] = clock
    return _class(v, fbits, ibits)


@numba.njit(**NJIT)
def _classlru_one(routed, prompt_start, layers, n_cached, group, off, persist, E, share, clock_of,
                  order, cnt):
    """b12170's class-LRU (with b12191's CPU share ``share``): one LRU list per frequency class
    per group; the victim is an empty slot, else of each list's least recently used slot not
    used by this lookup, the one with the largest age / 2**class (ties: the lower class).

    ``clock_of`` (TOKEN_CLOCK, LAYER_CLOCK, LAYER_CLOCK_FIRST) says what a key's age is measured
    in; ``order`` (COLDEST, ASCENDING) which misses the CPU share takes."""
    P = prompt_start.shape[0] - 1
    k = routed.shape[2]
    G = off.shape[0] - 1
    S = off[G]
    key_of = np.empty(S, np.int64)
    cls_of = np.empty(S, np.int64)
    mark = np.empty(S, np.int64)
    prv = np.empty(S, np.int64)
    nxt = np.empty(S, np.int64)
    head = np.empty(G * N_CLASS, np.int64)
    tail = np.empty(G * N_CLASS, np.int64)
    filled = np.empty(G, np.int64)
    credit = np.empty(G, np.float64)
    slot_of = np.empty(n_cached * E, np.int64)
    crf = np.empty(n_cached * E, np.float64)
    last = np.empty(n_cached * E, np.int64)
    miss = np.empty(k, np.int64)
    cold = np.empty(k, np.float64)
    lclk = np.zeros(max(n_cached, 1), np.int64)     # each cached layer's own clock
    fbits = np.empty(1, np.float64)                 # a score's bits, for _class
    ibits = fbits.view(np.int64)
    clock = 0
    lookup = 0
    for p in range(P):
        if p == 0 or not persist:
            slot_of[:] = -1
            key_of[:] = -1
            mark[:] = -1
            crf[:] = 0.0
            last[:] = -1
            head[:] = -1
            tail[:] = -1
            filled[:] = 0
            credit[:] = 0.0
            lclk[:] = 0
            clock = 0
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for i_l in range(n_cached):
                l = layers[i_l]
                g = group[i_l]
                base = i_l * E
                lookup += 1
                if clock_of == LAYER_CLOCK_FIRST:
                    lclk[i_l] += 1
                now = clock if clock_of == TOKEN_CLOCK else lclk[i_l]
                h = 0
                for j in range(k):
                    key = base + routed[t, l, j]
                    s = slot_of[key]
                    if s >= 0:
                        h += 1
                        li = g * N_CLASS + cls_of[s]
                        head[li], tail[li] = list_unlink(prv, nxt, head[li], tail[li], s)
                        c = _use(crf, last, key, now, fbits, ibits)
                        cls_of[s] = c
                        li = g * N_CLASS + c
                        head[li], tail[li] = list_append(prv, nxt, head[li], tail[li], s)
                        mark[s] = lookup
                m = _sorted_misses(routed, t, l, k, base, slot_of, miss)
                n_cpu = 0
                if share > 0.0 and filled[g] == off[g + 1] - off[g] and m > 0:
                    credit[g] += share * m
                    n_cpu = min(int(math.floor(credit[g] + 1e-9)), m)
                    credit[g] -= n_cpu
                    # the coldest misses (lowest decayed score, then lower id) go to the CPU;
                    # in ASCENDING order all score 0 and the lowest ids go
                    for i in range(m):
                        key = base + miss[i]
                        cold[i] = (crf[key] * _decay(now - last[key])
                                   if last[key] >= 0 and order == COLDEST else 0.0)
                    for _ in range(n_cpu):
                        b = -1
                        for i in range(m):
                            if miss[i] >= 0 and (b < 0 or cold[i] < cold[b]):
                                b = i
                        _use(crf, last, base + miss[b], now, fbits, ibits)
                        miss[b] = -1
                for i in range(m):
                    if miss[i] < 0:
                        continue
                    key = base + miss[i]
                    if filled[g] < off[g + 1] - off[g]:
                        s = off[g] + filled[g]
                        filled[g] += 1
                    else:
                        s = -1
                        best = -1.0
                        for c in range(N_CLASS):
                            v = head[g * N_CLASS + c]
                            while v >= 0 and mark[v] == lookup:
                                v = nxt[v]
                            if v >= 0:
                                kv = key_of[v]
                                age = (clock if clock_of == TOKEN_CLOCK else lclk[kv // E]) \
                                    - last[kv]
                                score = age * _INV_POW2[c]
                                if s < 0 or score > best:
                                    s = v
                                    best = score
                        slot_of[key_of[s]] = -1
                        li = g * N_CLASS + cls_of[s]
                        head[li], tail[li] = list_unlink(prv, nxt, head[li], tail[li], s)
                    key_of[s] = key
                    slot_of[key] = s
                    c = _use(crf, last, key, now, fbits, ibits)
                    cls_of[s] = c
                    li = g * N_CLASS + c
                    head[li], tail[li] = list_append(prv, nxt, head[li], tail[li], s)
                    mark[s] = lookup
                cnt[p, h, n_cpu] += 1
                if clock_of == LAYER_CLOCK:
                    lclk[i_l] += 1
            clock += 1


@numba.njit(parallel=True, **NJIT)
def _cache_buckets(routed, prompt_start, layers, n_cached, group, off, off_of, version, share,
                   persist, E, clock_of, order, bucket_start, run_order, cnt):
    """Configuration ``i`` caches the MoE layers ``layers[i, :n_cached[i]]``, in groups
    ``group[i]``, with slot offsets ``off[off_of[i]:off_of[i+1]]`` (from 0); ``version[i]`` 0
    is LRU, 1 class-LRU; ``clock_of[i]`` and ``order[i]``: the class-LRU's reading (see
    :func:`_classlru_one`). Bucket ``b`` replays the configurations
    ``run_order[bucket_start[b]:bucket_start[b+1]]`` one after another, the buckets in parallel
    (numba splits a ``prange`` into equal runs of iterations, so the caller balances the work
    by the buckets it makes)."""
    for b in prange(bucket_start.shape[0] - 1):
        for j in range(bucket_start[b], bucket_start[b + 1]):
            i = run_order[j]
            o = off[off_of[i]:off_of[i + 1]]
            if version[i] == 0:
                _lru_one(routed, prompt_start, layers[i], n_cached[i], group[i], o, persist, E,
                         cnt[i])
            else:
                _classlru_one(routed, prompt_start, layers[i], n_cached[i], group[i], o,
                              persist, E, share[i], clock_of[i], order[i], cnt[i])


@numba.njit(**NJIT)
def _cache_sweep(routed, prompt_start, layers, n_cached, group, off, off_of, version, share,
                 persist, E, clock_of, order, cnt):
    """:func:`_cache_buckets` with one reading for every configuration, each its own bucket."""
    n = n_cached.shape[0]
    idx = np.arange(n)
    _cache_buckets(routed, prompt_start, layers, n_cached, group, off, off_of, version, share,
                   persist, E, np.full(n, clock_of), np.full(n, order), np.arange(n + 1), idx,
                   cnt)
