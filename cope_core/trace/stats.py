"""Routing statistics of a trace: the properties that decide which offloading policy wins.

Definitions (per MoE layer ``l``; a trace has ``N`` decode tokens and routes ``top_k`` of ``E``):

skew
    Share of all routing assignments at layer ``l`` that go to its ``ceil(E / 10)`` most
    routed experts (the top 10 %). Uniform routing gives ``ceil(E / 10) / E``.
reuse
    Mean over consecutive token pairs of the same prompt of ``|routed[t] ∩ routed[t-1]| /
    top_k``. Independent uniform routing gives ``top_k / E``.
recall
    For the trace's ``predicted`` column: mean of ``|top-k(predicted[t, l]) ∩ routed[t, l+1]| /
    top_k`` (layer pairs ``l -> l + 1``); and the same for the two baselines of
    :mod:`cope_core.trace.baselines`, computed from the trace itself.
hit rate vs K
    Fixed residency: hits / (N · L · top_k) when each layer keeps its ``K`` most popular
    experts of the calibration trace (the trace itself when none is given, which is
    optimistic): a cumulative sum of popularity in fill order (:func:`fixed_hits`).
hot set
    The hit rate of fixed caches of 10 %, 25 % and 50 % of each layer's experts against the
    share a cache of that size catches when routing is uniform (``K / E``), and a one-line
    verdict (:func:`hot_set`): caching pays when the 25 % cache catches at least
    :data:`PAYS` times its uniform share, and there is no exploitable hot set below
    :data:`NO_HOT_SET` times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CopeInputError
from .baselines import baseline_predictions, popularity_lists, recall_at_k
from .data import Trace, fill_order

HOT_FRACTIONS = (0.10, 0.25, 0.50)
PAYS = 1.5        # the 25 % cache catches >= 1.5x its uniform share: a hot set worth caching
NO_HOT_SET = 1.1  # below 1.1x: indistinguishable from uniform routing for a cache


@dataclass(frozen=True)
class HotSet:
    """What fixed caches of a few sizes catch, against uniform routing (module docstring)."""

    fractions: tuple[float, ...]
    ks: tuple[int, ...]
    caught: tuple[float, ...]
    uniform: tuple[float, ...]
    verdict: str
    kind: str  # "pays", "weak" or "none"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "kind": self.kind, "caches": [
            {"fraction": f, "experts_per_layer": k, "caught": c, "uniform": u,
             "ratio": c / u if u else None}
            for f, k, c, u in zip(self.fractions, self.ks, self.caught, self.uniform,
                                  strict=True)]}


def hot_set(trace: Trace, calibration: Trace | None = None) -> HotSet:
    """Shares of routed experts that fixed caches of 10 %, 25 % and 50 % of the experts catch
    (by the calibration's popularity; the trace's own when None, which is optimistic), against
    the uniform share, with a verdict on whether caching can pay."""
    E = trace.model.n_experts
    ks = tuple(max(1, min(E, round(f * E))) for f in HOT_FRACTIONS)
    caught = tuple(float(h) for h in fixed_hit_rate(trace, list(ks), calibration))
    uniform = tuple(k / E for k in ks)
    i = HOT_FRACTIONS.index(0.25)
    c, u, k = caught[i], uniform[i], ks[i]
    ratio = c / u
    size = f"a 25 % cache ({k} of {E} experts per layer)"
    kind = "pays" if ratio >= PAYS else "none" if ratio < NO_HOT_SET else "weak"
    if kind == "pays":
        verdict = (f"{size} catches {c:.0%} of routed experts, {ratio:.1f}x uniform: caching "
                   "pays")
    elif kind == "none":
        verdict = f"no exploitable hot set: {size} catches {c:.0%} against {u:.0%} uniform"
    else:
        verdict = (f"a weak hot set: {size} catches {c:.0%}, {ratio:.2f}x uniform; a cache "
                   "pays only where misses are cheap")
    if calibration is None:
        verdict += " (popularity from the trace itself: optimistic)"
    return HotSet(HOT_FRACTIONS, ks, caught, uniform, verdict, kind)


@dataclass(frozen=True)
class TraceStats:
    """Per-layer and overall statistics of one trace (see the module docstring)."""

    model: str
    source: str
    prompts: int
    tokens: int
    layers: int
    n_experts: int
    top_k: int
    skew: list[float]
    reuse: list[float]
    recall: list[float] | None
    recall_previous_token: list[float]
    recall_popularity: list[float]
    ks: list[int]
    hit_rate: list[float]
    calibration: str
    hot_set: HotSet

    @property
    def mean_skew(self) -> float:
        return float(np.mean(self.skew))

    @property
    def mean_reuse(self) -> float:
        return float(np.nanmean(self.reuse)) if np.isfinite(self.reuse).any() else float("nan")

    def to_dict(self) -> dict[str, Any]:
        def clean(v):
            if isinstance(v, list):
                return [clean(x) for x in v]
            return None if isinstance(v, float) and not math.isfinite(v) else v
        d = {k: clean(v) for k, v in self.__dict__.items() if k != "hot_set"}
        d["hot_set"] = self.hot_set.to_dict()
        d["mean"] = {"skew": clean(self.mean_skew), "reuse": clean(self.mean_reuse),
                     "recall": None if self.recall is None else clean(_mean(self.recall)),
                     "recall_previous_token": clean(_mean(self.recall_previous_token)),
                     "recall_popularity": clean(_mean(self.recall_popularity)),
                     "uniform_skew": math.ceil(self.n_experts / 10) / self.n_experts,
                     "uniform_reuse": self.top_k / self.n_experts}
        return d

    def format(self) -> str:
        """Human-readable tables."""
        m = self.to_dict()["mean"]
        f = lambda v: "   -" if v is None or not math.isfinite(v) else f"{v:.3f}"  # noqa: E731
        lines = [f"{self.source} trace, {self.model}: {self.prompts} prompts, {self.tokens} "
                 f"tokens, {self.layers} MoE layers, top-{self.top_k} of {self.n_experts}",
                 f"skew = share of routing to the top 10% of experts (uniform "
                 f"{m['uniform_skew']:.3f}); reuse = share of a token's experts also used by the "
                 f"previous token (uniform {m['uniform_reuse']:.3f}); recall = top-{self.top_k} "
                 f"recall of the next layer's experts", "",
                 "layer   skew  reuse  recall  prev-token  popularity"]
        cols = (self.recall, self.recall_previous_token, self.recall_popularity)
        for l in range(self.layers):
            rc = [None if v is None or l == self.layers - 1 else v[l] for v in cols]
            lines.append(f"{l:5d}  {f(self.skew[l])}  {f(self.reuse[l])}   {f(rc[0])}       "
                         f"{f(rc[1])}       {f(rc[2])}")
        lines.append(f" mean  {f(m['skew'])}  {f(m['reuse'])}   {f(m['recall'])}       "
                     f"{f(m['recall_previous_token'])}       {f(m['recall_popularity'])}")
        lines += ["", f"fixed-residency hit rate vs K (popularity from {self.calibration})",
                  "    K  " + " ".join(f"{k:>6d}" for k in self.ks),
                  "  hit  " + " ".join(f"{h:6.3f}" for h in self.hit_rate)]
        hs = self.hot_set
        lines += ["", "hot set: " + hs.verdict]
        lines += [f"  {f:4.0%} cache ({k:>3d} experts): catches {c:6.1%} of routed experts, "
                  f"uniform {u:6.1%}, {c / u:.2f}x"
                  for f, k, c, u in zip(hs.fractions, hs.ks, hs.caught, hs.uniform, strict=True)]
        return "\n".join(lines)


def _mean(v: list[float]) -> float:
    a = np.asarray(v, dtype=float)
    return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")


def skew(trace: Trace) -> np.ndarray:
    """Per-layer share of routing to the top ``ceil(E / 10)`` experts, shape ``[L]``."""
    E = trace.model.n_experts
    m = math.ceil(E / 10)
    counts = np.sort(trace.popularity, axis=1)[:, ::-1]
    return counts[:, :m].sum(axis=1) / counts.sum(axis=1)


def reuse(trace: Trace) -> np.ndarray:
    """Per-layer token-to-token reuse, shape ``[L]`` (NaN when no prompt has 2 tokens)."""
    r = trace.routed.astype(np.int64)
    same_prompt = np.ones(r.shape[0], bool)
    same_prompt[trace.prompt_start[:-1]] = False          # token 0 of a prompt has no predecessor
    cur, prev = r[1:][same_prompt[1:]], r[:-1][same_prompt[1:]]
    if cur.shape[0] == 0:
        return np.full(r.shape[1], np.nan)
    shared = (cur[..., :, None] == prev[..., None, :]).any(axis=3).sum(axis=2)
    return shared.mean(axis=0) / r.shape[2]


def fixed_hits(trace: Trace, ks, calibration: Trace | None = None) -> np.ndarray:
    """Hits of fixed residency over the whole trace at each ``K`` of ``ks`` (int64).

    A layer keeping its ``K`` most popular experts of ``calibration`` (the trace itself when
    None) hits every routing assignment to those experts, so the total is a cumulative sum of
    the trace's popularity in the calibration's fill order; no replay is needed (the replay's
    fixed kernel must give the same numbers, which the tests check on the shipped traces)."""
    E = trace.model.n_experts
    ks = np.asarray(ks)
    if ks.dtype.kind not in "iu" or ((ks < 0) | (ks > E)).any():
        raise CopeInputError(f"expected cache sizes in 0..{E}, got {ks.tolist()}",
                             field="experts_per_layer")
    cal = trace if calibration is None else calibration
    ranked = np.take_along_axis(trace.popularity, fill_order(cal).astype(np.int64), axis=1)
    cum = np.concatenate([[0], np.cumsum(ranked.sum(axis=0, dtype=np.int64))])
    return cum[ks]


def fixed_hit_rate(trace: Trace, ks, calibration: Trace | None = None) -> np.ndarray:
    """Fixed-residency hit rate at each ``K`` of ``ks``: :func:`fixed_hits` over
    ``tokens x layers x top_k``."""
    g = trace.model
    return fixed_hits(trace, ks, calibration) / (trace.n_tokens * g.n_layers * g.top_k)


def trace_stats(trace: Trace, calibration: Trace | None = None) -> TraceStats:
    """All statistics of the module docstring for one trace."""
    g = trace.model
    if calibration is not None and not calibration.model.same_shape(g):
        raise CopeInputError("calibration geometry differs from the trace's",
                             source=calibration.path, field="model")
    ks = list(range(g.n_experts + 1))
    hit = fixed_hit_rate(trace, ks, calibration)
    popular = popularity_lists((calibration or trace).routed, g.n_experts, g.top_k)
    rec = recall_at_k(trace.predicted, trace.routed).tolist() if trace.has_predictions else None
    prev = baseline_predictions(trace.routed, trace.prompt_start, "previous-token", popular)
    pop = baseline_predictions(trace.routed, trace.prompt_start, "popularity", popular)
    return TraceStats(
        model=g.name, source=trace.source, prompts=trace.n_prompts, tokens=trace.n_tokens,
        layers=g.n_layers, n_experts=g.n_experts, top_k=g.top_k, skew=skew(trace).tolist(),
        reuse=reuse(trace).tolist(), recall=rec,
        recall_previous_token=recall_at_k(prev, trace.routed).tolist(),
        recall_popularity=recall_at_k(pop, trace.routed).tolist(), ks=ks, hit_rate=hit.tolist(),
        calibration="the calibration trace" if calibration is not None
        else "the trace itself (optimistic)", hot_set=hot_set(trace, calibration))
