"""Plain-Python reference of the replay (docs/design.md#replay-semantics), written literally from
the rules: explicit recency stamps, a clock and a scan for the smallest stamp. Slow on purpose; the
numba kernels must agree with it exactly."""
from __future__ import annotations


def popularity_order(routed_rows, L, E, by_id=False):
    """routed_rows: iterable of (layer, ids). Returns order[l] = experts by rank."""
    if by_id:
        return [list(range(E)) for _ in range(L)]
    counts = [[0] * E for _ in range(L)]
    for l, ids in routed_rows:
        for e in ids:
            counts[l][e] += 1
    return [sorted(range(E), key=lambda e: (-counts[l][e], e)) for l in range(L)]


def replay_prompt(routed, predicted, L, E, K, order, residency):
    """One prompt from the initial fill.

    routed[t][l], predicted[t][l]: lists of ids. Returns (hits[t][l], inserted[t][l]) lists.
    """
    stamp = {}  # (layer, expert) -> stamp, present iff resident
    for l in range(L):
        for r in range(K):
            stamp[(l, order[l][r])] = -(r + 1)
    clock = 0
    hits_out, ins_out = [], []
    for t in range(len(routed)):
        hrow, irow = [], []
        for l in range(L):
            h = 0
            for e in routed[t][l]:
                if (l, e) in stamp:
                    h += 1
                    stamp[(l, e)] = clock
                    clock += 1
            inserted = False
            if residency != "fixed" and l < L - 1 and 0 < K < E:
                q = None
                for e in predicted[t][l]:
                    if (l + 1, e) not in stamp:
                        q = e
                        break
                if q is not None:
                    if residency == "mutable_per_layer":
                        pool = [key for key in stamp if key[0] == l + 1]
                    else:
                        pool = [key for key in stamp if key[0] != l]
                    if pool:
                        victim = min(pool, key=lambda key: (stamp[key], key[0], key[1]))
                        del stamp[victim]
                        stamp[(l + 1, q)] = clock
                        clock += 1
                        inserted = True
            hrow.append(h)
            irow.append(inserted)
        hits_out.append(hrow)
        ins_out.append(irow)
    return hits_out, ins_out


def tpot_prompt(routed, predicted, contexts, L, E, k, K, order, residency, moe, shared, pf=None):
    """TPOT of one prompt, accumulated token by token as in the spec's pseudo-code.

    moe[h]: layer cost at h hits; shared(context); pf[q]: prefetch cost for q in {0, 1}.
    Returns (tpot, hit_rate, prefetches).
    """
    hits, ins = replay_prompt(routed, predicted, L, E, K, order, residency)
    acc = 0.0
    for t in range(len(routed)):
        acc += shared(contexts[t])
        for l in range(L):
            acc += moe[hits[t][l]]
            # at K = E every expert is resident: nothing to prefetch, no per-layer step
            if residency != "fixed" and K < E and l < L - 1:
                acc += pf[1 if ins[t][l] else 0]
    n = len(routed)
    total_hits = sum(sum(row) for row in hits)
    return acc / n, total_hits / (n * L * k), sum(sum(row) for row in ins)


def layer_partition_tpot(contexts, L, E, K, shared, cpu_layer, gpu_layer):
    n_gpu = (K * L) // E
    n_cpu = L - n_gpu
    return sum(shared(c) + n_cpu * cpu_layer + n_gpu * gpu_layer for c in contexts) / len(contexts)


def split_trace(trace):
    """Trace arrays -> per-prompt Python lists (routed, predicted, contexts)."""
    out = []
    for p in range(trace.n_prompts):
        a, b = int(trace.prompt_start[p]), int(trace.prompt_start[p + 1])
        routed = [[list(map(int, trace.routed[t, l])) for l in range(trace.model.n_layers)]
                  for t in range(a, b)]
        predicted = [[[int(x) for x in trace.predicted[t, l] if x >= 0]
                      for l in range(trace.model.n_layers)] for t in range(a, b)]
        out.append((routed, predicted, [int(c) for c in trace.context[a:b]]))
    return out
