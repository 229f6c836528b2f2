"""TPOT of every candidate from replay counts and one estimator's cost table, at every K of a
sweep at once (step 2 of :func:`cope_core.estimate.predict.predict`, before the intervals).

Each candidate's parts are computed for all cache sizes with one array expression per part (a
leading K axis), not once per (K, candidate): a sweep of 129 K x 13 candidates, under 1000 draws
of the costs, was mostly Python call overhead. The arithmetic per K is the same as pricing that K
alone, so a sweep's row equals the prediction at its K (tests/test_predict_sweep.py checks it
against a plain per-K reference).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..geometry import ModelGeometry
from ..matrix import CANDIDATES, LAYER_PARTITION, Candidate, Residency
from ..placement import layer_plan
from ..replay.engine import ReplayCounts
from ..trace.data import Trace
from .costs import EXECUTIONS, LayerCosts


@dataclass(frozen=True)
class CandidateTPOT:
    """One candidate's per-prompt TPOT parts, each of shape ``(..., P)``: the leading dimensions
    are the K of :func:`candidate_parts` (none from :func:`candidate_tpot`), then the draws of the
    costs (none for point estimates). ``hist``: the hit histograms (one per K from
    :func:`candidate_parts`), when asked for."""

    experts: np.ndarray
    prefetch: np.ndarray
    hit_rate: np.ndarray
    prefetches: np.ndarray
    hist: np.ndarray | list[np.ndarray] | None


@functools.lru_cache(maxsize=4096)
def _gpu_layers(g: ModelGeometry, k: int) -> int:
    """Whole layers on the GPU for the layer-partition baseline at K (docs/design.md#layer-
    placement); the search is cached: every pricing of a sweep asks for every K again."""
    return layer_plan(g, k).n_gpu


def _layer_partition(trace: Trace, costs: LayerCosts, ks: np.ndarray, histograms: bool
                     ) -> CandidateTPOT:
    g = trace.model
    L, k, P = g.n_layers, g.top_k, trace.n_prompts
    n_gpu = np.array([_gpu_layers(g, int(K)) for K in ks], np.int64)
    cpu, gpu = np.asarray(costs.cpu_layer), np.asarray(costs.gpu_layer)
    n = n_gpu.reshape((-1,) + (1,) * cpu.ndim)              # (nK, 1 per draw dimension)
    per_token = (L - n) * cpu + n * gpu
    experts = np.broadcast_to(per_token[..., None], per_token.shape + (P,)).copy()
    hist = None
    if histograms:
        hist = []
        for ng in n_gpu:
            h = np.zeros((P, L, k + 1), np.int64)
            h[:, : L - ng, 0] = trace.tokens_per_prompt[:, None]
            h[:, L - ng:, k] = trace.tokens_per_prompt[:, None]
            hist.append(h)
    return CandidateTPOT(experts, np.zeros_like(experts),
                         np.broadcast_to((n_gpu / L)[:, None], (len(ks), P)).copy(),
                         np.zeros((len(ks), P), np.int64), hist)


LayerSums = dict[Residency, tuple[np.ndarray, np.ndarray]]


def layer_sums(counts: dict[Residency, ReplayCounts]) -> LayerSums:
    """Per residency, its hit and insert histograms summed over the layers, shape
    ``(nK, P, top_k + 1)`` each: what every execution's price reads (summed once per pricing,
    not once per candidate and block of K)."""
    return {r: (rc.hist.sum(axis=2), rc.ins.sum(axis=2)) for r, rc in counts.items()}


def candidate_parts(trace: Trace, counts: dict[Residency, ReplayCounts], costs: LayerCosts,
                    cand: Candidate, kis: np.ndarray, ks: np.ndarray,
                    histograms: bool = False, sums: LayerSums | None = None) -> CandidateTPOT:
    """The expert and prefetch parts of one candidate's per-prompt TPOT at the ``kis``-th K of
    ``counts`` (``ks`` themselves), each with a leading K axis; TPOT is these plus the shared
    part, which every candidate pays alike (:meth:`LayerCosts.shared_per_prompt`). Costs with
    draw dimensions give parts with them after the K axis. ``sums``: :func:`layer_sums` of
    ``counts``, when the caller has them."""
    ks = np.asarray(ks, np.int64)
    if cand.is_layer_partition:
        return _layer_partition(trace, costs, ks, histograms)
    assert cand.residency is not None and cand.execution is not None   # not layer_partition
    g = trace.model
    L, k = g.n_layers, g.top_k
    tokens = trace.tokens_per_prompt.astype(np.float64)
    rc = counts[cand.residency]
    e = EXECUTIONS.index(cand.execution)
    # (nK, P, k+1): tokens x layers by hits, and by inserts
    hsum, isum = ((rc.hist[kis].sum(axis=2), rc.ins[kis].sum(axis=2)) if sums is None
                  else (sums[cand.residency][0][kis], sums[cand.residency][1][kis]))
    # in place: the same operations as ``(moe @ hsum.T) / tokens``, without temporaries
    experts = costs.moe[..., e, :] @ hsum.transpose(0, 2, 1)
    np.divide(experts, tokens, out=experts)
    if cand.residency.mutable:
        r = cand.residency.value
        pref = costs.pf_insert[r][..., e, :] @ isum.transpose(0, 2, 1)
        np.divide(pref, tokens, out=pref)
        np.add((L - 1) * np.asarray(costs.pf_step[r])[..., None], pref, out=pref)
        # with every expert resident (K = E) nothing can be prefetched: no per-layer step
        pref[ks == g.n_experts] = 0.0
    else:
        pref = np.zeros_like(experts)
    hit_rate = (hsum @ np.arange(k + 1)) / (tokens * L * k)
    return CandidateTPOT(experts, pref, hit_rate, isum.sum(axis=2),
                         list(rc.hist[kis]) if histograms else None)


def candidate_tpot(trace: Trace, counts: dict[Residency, ReplayCounts], costs: LayerCosts,
                   cand: Candidate, ki: int, K: int, histograms: bool = False) -> CandidateTPOT:
    """:func:`candidate_parts` at the ``ki``-th K of ``counts`` (``K`` itself) alone, without
    the K axis."""
    p = candidate_parts(trace, counts, costs, cand, np.array([ki]), np.array([K]), histograms)
    return CandidateTPOT(p.experts[0], p.prefetch[0], p.hit_rate[0], p.prefetches[0],
                         p.hist[0] if p.hist is not None else None)


def _objects(rows: np.ndarray | list) -> np.ndarray:
    """A column of arrays (one per row) as an object array (numpy would stack a list)."""
    out = np.empty(len(rows), object)
    for i, r in enumerate(rows):
        out[i] = r
    return out


def compose_arrays(trace: Trace, counts: dict[Residency, ReplayCounts], costs: LayerCosts,
                   candidates: Sequence[Candidate] = CANDIDATES, histograms: bool = False, *,
                   ks: np.ndarray | None = None, sums: LayerSums | None = None
                   ) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`compose`'s frame and its per-prompt TPOT as one array, shape ``(nK, C, P)`` (K,
    then candidates in order: the frame's rows); ``sums`` as for :func:`candidate_parts`."""
    if ks is None:
        ks = next(iter(counts.values())).ks
    ks = np.asarray(ks, np.int64)
    shared = costs.shared_per_prompt(trace.context, trace.prompt_start)
    kis = np.arange(len(ks))
    sums = layer_sums(counts) if sums is None else sums
    parts = [candidate_parts(trace, counts, costs, c, kis, ks, histograms, sums)
             for c in candidates]
    tpot = np.stack([shared + p.experts + p.prefetch for p in parts], axis=1)  # (nK, C, P)
    nK, C = len(ks), len(candidates)

    def column(name: str) -> np.ndarray:                                      # (nK, C, P)
        return np.stack([getattr(p, name) for p in parts], axis=1)

    hit_rate, prefetches = column("hit_rate"), column("prefetches")
    cols = {
        "experts_per_layer": np.repeat(ks, C),
        "candidate": [c.id for c in candidates] * nK,
        "residency": [c.residency.value if c.residency else LAYER_PARTITION
                      for c in candidates] * nK,
        "execution": [c.execution.value if c.execution else LAYER_PARTITION
                      for c in candidates] * nK,
        "estimator": [costs.estimator] * (nK * C),
        "tpot_us": tpot.mean(axis=-1).ravel(), "shared_us": np.full(nK * C, shared.mean()),
        "experts_us": column("experts").mean(axis=-1).ravel(),
        "prefetch_us": column("prefetch").mean(axis=-1).ravel(),
        "hit_rate": hit_rate.mean(axis=-1).ravel(),
        "prefetches": prefetches.sum(axis=-1).ravel(),
        "prompt_tpot_us": _objects(tpot.reshape(nK * C, -1)),
        "prompt_hit_rate": _objects(hit_rate.reshape(nK * C, -1)),
        "prompt_prefetches": _objects(prefetches.reshape(nK * C, -1)),
    }
    if histograms:
        cols["hist"] = _objects([p.hist[ki] for ki in range(nK) for p in parts])  # type: ignore[index]
    df = pd.DataFrame(cols)
    df["rank"] = df.groupby("experts_per_layer")["tpot_us"].rank(method="first").astype(int)
    df["winner"] = df["rank"] == 1
    df.attrs["prompts"] = trace.prompt_ids.tolist()
    df.attrs["estimator"] = costs.estimator
    return df, tpot


def compose(trace: Trace, counts: dict[Residency, ReplayCounts], costs: LayerCosts,
            candidates: Sequence[Candidate] = CANDIDATES, histograms: bool = False, *,
            ks: np.ndarray | None = None) -> pd.DataFrame:
    """Turn replay counts into TPOT per (K, candidate) with one estimator's cost table.

    ``ks`` defaults to the cache sizes of ``counts``; it is needed only when no residency was
    replayed (layer partition alone). Returns the frame described in
    :func:`cope_core.estimate.predict.predict`.
    """
    return compose_arrays(trace, counts, costs, candidates, histograms, ks=ks)[0]
