"""Plain-Python reference of llama.cpp's MoE cache replay (docs/design.md#llamacpp-moe-cache),
written literally from the rules with explicit use times instead of linked lists: the least
recently used slot is the one with the smallest (time, order) stamp. Slow on purpose; the numba
kernels must agree with it exactly."""
from __future__ import annotations

import math

N_CLASS = 8
HALF_LIFE = 128.0


class Group:
    def __init__(self, n_slots):
        self.n = n_slots
        self.slots = {}          # slot -> key (filled slots only)
        self.where = {}          # key -> slot
        self.stamp = {}          # slot -> last touch, a strictly increasing counter
        self.cls = {}            # slot -> class list it sits in (class-LRU)
        self.credit = 0.0

    def full(self):
        return len(self.slots) == self.n


def _score(crf, last, key, clock):
    return crf.get(key, 0.0) * 2.0 ** (-(clock - last[key]) / HALF_LIFE) if key in last else 0.0


def _use(crf, last, now, key):
    """One use: the score decays by half every HALF_LIFE tokens, then counts this use; returns
    the class floor(log2(score)), at most N_CLASS - 1."""
    v = _score(crf, last, key, now) + 1.0
    crf[key], last[key] = v, now
    return min(int(math.floor(math.log2(v))), N_CLASS - 1)


def replay(routed, prompt_start, cached, groups_of, n_slots, E, version, share=0.0,
           persist=True, clock_of="token", order="coldest"):
    """routed[t][l]: expert ids; cached: MoE layers cached in order; groups_of[i]: group of the
    i-th cached layer; n_slots[g]. Returns cnt[p][(h, c)] as dicts.

    The class-LRU's reading: ``clock_of`` "token" (one clock, ticked per decoded token),
    "layer" (each cached layer's own clock, ticked after its lookup; a key's age is measured on
    its layer's clock) or "layer-first" (ticked before its lookup); ``order`` "coldest" (the CPU
    share takes the misses of lowest decayed score) or "ascending" (the lowest ids)."""
    out = []
    touch = [0]

    def fresh():
        return [Group(n) for n in n_slots], {}, {}

    groups, crf, last = fresh()
    clock = 0
    lclk = [0] * len(cached)

    def age_now(key):
        """The clock a key's age is read on: the token's, or its layer's own."""
        return clock if clock_of == "token" else lclk[key // E]

    for p in range(len(prompt_start) - 1):
        if p > 0 and not persist:
            groups, crf, last = fresh()
            clock = 0
            lclk = [0] * len(cached)
        cnt = {}
        for t in range(prompt_start[p], prompt_start[p + 1]):
            for i, layer in enumerate(cached):
                g = groups[groups_of[i]]
                ids = routed[t][layer]
                keys = [i * E + e for e in ids]
                used = set()
                if clock_of == "layer-first":
                    lclk[i] += 1
                now = clock if clock_of == "token" else lclk[i]

                def use(key, state=(crf, last, now)):
                    return _use(*state, key)

                h = 0
                for key in keys:                       # hits, in routed order
                    if key in g.where:
                        h += 1
                        s = g.where[key]
                        touch[0] += 1
                        g.stamp[s] = touch[0]
                        if version == "classlru":
                            g.cls[s] = use(key)
                        used.add(s)
                misses = sorted(key for key in keys if key not in g.where)
                n_cpu = 0
                if version == "classlru" and share > 0 and g.full() and misses:
                    g.credit += share * len(misses)
                    n_cpu = min(int(math.floor(g.credit + 1e-9)), len(misses))
                    g.credit -= n_cpu
                    to_cpu = sorted(misses, key=lambda key: (
                        _score(crf, last, key, now) if order == "coldest" else 0.0, key))
                    for key in to_cpu[:n_cpu]:
                        use(key)
                        misses.remove(key)
                for key in misses:                     # uploads, ascending id
                    if not g.full():
                        s = len(g.slots)
                    elif version == "lru":
                        s = min(g.slots, key=lambda x: g.stamp[x])
                    else:
                        best = None
                        for c in range(N_CLASS):
                            mine = [x for x in g.slots if g.cls[x] == c and x not in used]
                            if not mine:
                                continue
                            v = min(mine, key=lambda x: g.stamp[x])
                            score = (age_now(g.slots[v]) - last[g.slots[v]]) / 2.0 ** c
                            if best is None or score > best[0]:
                                best = (score, v)
                        s = best[1]
                    if s in g.slots:
                        del g.where[g.slots[s]]
                    g.slots[s] = key
                    g.where[key] = s
                    touch[0] += 1
                    g.stamp[s] = touch[0]
                    if version == "classlru":
                        g.cls[s] = use(key)
                    used.add(s)
                cnt[(h, n_cpu)] = cnt.get((h, n_cpu), 0) + 1
                if clock_of == "layer":
                    lclk[i] += 1
            clock += 1
        out.append(cnt)
    return out
