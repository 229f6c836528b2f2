"""Calibrated synthesis: fit the synthetic generator's skew and reuse to a real trace.

The target is the real trace's fixed-residency hit rate as a function of ``K`` (popularity from
the trace itself) and its token-to-token reuse (:mod:`cope_core.trace.stats`). Both depend on the
trace's size as well as on the routing: a short trace ranks experts by a noisy count, which
makes its self-calibrated hit rates optimistic. The fit therefore compares like with like: every
candidate parameter set is synthesised at the real trace's shape (its prompt count and mean
tokens per prompt) with one fixed seed (common random numbers, so the objective does not jump
with sampling noise), and

1. for the current skew, ``reuse`` is bisected until the synthetic trace's measured reuse
   equals the real one (measured reuse grows with the parameter; a dropped expert can be drawn
   again, so the two are not equal);
2. for that reuse, ``skew`` is searched on a grid, then a finer grid around the best point,
   minimising the largest hit-rate gap over ``K`` (mean squared gap breaks ties);

and the two steps alternate a few times. When the real trace carries predictions, the
generator's predictor accuracy is set to their measured top-k recall (what the generator's
accuracy means).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from .baselines import recall_at_k
from .data import Trace
from .stats import fixed_hit_rate
from .stats import reuse as measured_reuse
from .synth import check_skew, synthesize


@dataclass(frozen=True)
class FitResult:
    """Fitted generator parameters and how well they reproduce the real trace."""

    skew: float
    reuse: float
    predictor_accuracy: float | None
    prompts: int
    tokens: int
    ks: list[int]
    real_hit_rate: list[float]
    synth_hit_rate: list[float]
    max_gap: float
    real_reuse: float
    synth_reuse: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def describe(self) -> str:
        acc = "none" if self.predictor_accuracy is None else f"{self.predictor_accuracy:.3f}"
        return (f"fitted skew {self.skew:.3f}, reuse {self.reuse:.3f}, predictor accuracy {acc}; "
                f"max fixed hit-rate gap {self.max_gap:.3f} over K = 0..{self.ks[-1]} at "
                f"{self.prompts} prompts x {self.tokens} tokens")


def _synth(trace: Trace, P: int, T: int, skew: float, reuse: float, seed: int) -> Trace:
    return synthesize(trace.model, prompts=P, tokens=T, seed=seed, skew=float(skew),
                      reuse=float(reuse), predictor_accuracy=None)


def _curve(tr: Trace, ks: list[int]) -> np.ndarray:
    return fixed_hit_rate(tr, ks)


def _mean_reuse(tr: Trace) -> float:
    r = measured_reuse(tr)
    return float(np.nanmean(r)) if np.isfinite(r).any() else float("nan")


def fit_synth(trace: Trace, *, seed: int = 0, rounds: int = 3, max_skew: float = 4.0,
              skew: float | None = None) -> FitResult:
    """Fit ``skew`` and ``reuse`` of :func:`~cope_core.trace.synth.synthesize` to ``trace``.

    Parameters
    ----------
    trace : Trace
        The real trace (any source).
    seed : int
        Seed of the synthetic traces used while fitting.
    rounds : int
        Alternations of the reuse and skew steps.
    max_skew : float
        Upper end of the skew search.
    skew : float, optional
        Keep this skew (e.g. one calibrated on published popularity counts, which rank experts
        far better than a short trace) and fit only ``reuse``.

    Returns
    -------
    FitResult
        Parameters, both hit-rate curves at the real trace's shape, and their largest gap.
    """
    g = trace.model
    ks = list(range(g.n_experts + 1))
    P = trace.n_prompts
    T = max(1, int(round(trace.n_tokens / P)))
    real = _curve(trace, ks)
    measured = _mean_reuse(trace)
    # single-token prompts: reuse cannot be measured (None); the fit keeps it at 0
    real_reuse = measured if np.isfinite(measured) else None

    cache: dict[tuple[float, float], tuple[np.ndarray, float]] = {}

    def evaluate(s: float, r: float) -> tuple[np.ndarray, float]:
        key = (round(s, 6), round(r, 6))
        if key not in cache:
            tr = _synth(trace, P, T, s, r, seed)
            cache[key] = (_curve(tr, ks), _mean_reuse(tr))
        return cache[key]

    def loss(s: float, r: float) -> tuple[float, float]:
        gap = np.abs(evaluate(s, r)[0] - real)
        return float(gap.max()), float((gap ** 2).mean())

    def fit_reuse(s: float) -> float:
        if real_reuse is None or T < 2:
            return 0.0
        lo, hi = 0.0, 1.0
        if evaluate(s, lo)[1] >= real_reuse:
            return lo
        if evaluate(s, hi)[1] <= real_reuse:
            return hi
        for _ in range(14):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if evaluate(s, mid)[1] < real_reuse else (lo, mid)
        return 0.5 * (lo + hi)

    def fit_skew(r: float, center: float | None) -> float:
        grid = np.linspace(0.0, max_skew, 41) if center is None else \
            np.clip(center + np.linspace(-0.25, 0.25, 21), 0.0, max_skew)
        best = min(grid, key=lambda s: loss(float(s), r))
        fine = np.clip(best + np.linspace(-grid[1] + grid[0], grid[1] - grid[0], 11), 0, max_skew)
        return float(min(fine, key=lambda s: loss(float(s), r)))

    if skew is not None:
        check_skew(skew)
        s = float(skew)
    else:
        s, r = 1.0, 0.5
        center = None
        for _ in range(max(1, rounds)):
            r = fit_reuse(s)
            s = fit_skew(r, center)
            center = s
    s = round(s, 4)
    r = round(fit_reuse(s), 4)

    acc = None
    if trace.has_predictions:
        rec = recall_at_k(trace.predicted, trace.routed)
        acc = float(np.clip(np.nanmean(rec), 0.0, 1.0)) if np.isfinite(rec).any() else None
    syn, syn_reuse = evaluate(s, r)
    return FitResult(skew=s, reuse=r, predictor_accuracy=acc, prompts=P,
                     tokens=T, ks=ks, real_hit_rate=real.tolist(), synth_hit_rate=syn.tolist(),
                     max_gap=float(np.abs(syn - real).max()),
                     real_reuse=float("nan") if real_reuse is None else real_reuse,
                     synth_reuse=syn_reuse)


def check_fit_input(trace: Trace) -> None:
    """Reject traces a fit cannot use (kept separate so the CLI can fail before fitting)."""
    if trace.n_tokens < 2:
        raise CopeInputError("a fit needs at least 2 decode tokens", source=trace.path,
                             field="routed")


# --- popularity skew from published per-expert counts ---------------------------------------------
def coverage_curve(counts: np.ndarray) -> np.ndarray:
    """Share of routed selections that the ``K`` most popular experts receive, ``K = 0..E``.

    Parameters
    ----------
    counts : array_like, shape (rows, E) or (E,)
        Per-expert selection counts (or frequencies), one row per layer (or per layer and text
        domain). Each row is normalised on its own, so rows of different token counts weigh
        the same.

    Returns
    -------
    ndarray of float64, shape (E + 1,)
        The mean over rows of the sorted cumulative share; index ``K`` is what a fixed cache of
        the ``K`` most popular experts would hit, with popularity known exactly.
    """
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    if c.ndim != 2 or c.shape[1] < 1 or not np.isfinite(c).all() or (c < 0).any() \
            or (c.sum(axis=1) <= 0).any():
        raise CopeInputError("expected per-expert counts: finite, >= 0, every row with a "
                             f"positive total; got shape {c.shape}", field="counts")
    share = -np.sort(-c / c.sum(axis=1, keepdims=True), axis=1)
    cum = np.concatenate([np.zeros((c.shape[0], 1)), np.cumsum(share, axis=1)], axis=1)
    return np.minimum(cum.mean(axis=0), 1.0)


def transfer_curve(curve: np.ndarray, n_experts: int) -> np.ndarray:
    """Carry a coverage curve to a model with ``n_experts`` experts by the fraction ``K / E``.

    The assumption (stated wherever the result is used): the share of selections that the most
    popular fraction ``f`` of experts receives is the same in both models. Linear interpolation
    between the source's points.
    """
    src = np.linspace(0.0, 1.0, len(curve))
    return np.interp(np.linspace(0.0, 1.0, n_experts + 1), src, curve)


@dataclass(frozen=True)
class SkewFit:
    """A popularity skew fitted to a target coverage curve."""

    skew: float
    target: list[float]
    synth: list[float]
    max_gap: float


def fit_skew_to_counts(target: np.ndarray, model: ModelGeometry, *, tokens: int = 4000,
                       layers: int = 4, seed: int = 0, max_skew: float = 3.0) -> SkewFit:
    """Generator skew whose coverage curve is closest (largest gap) to ``target``.

    Parameters
    ----------
    target : ndarray, shape (E + 1,)
        Coverage curve for ``model``'s ``E`` (from :func:`coverage_curve`, possibly through
        :func:`transfer_curve`).
    model : ModelGeometry
        Sets ``E`` and ``top_k`` (sampling ``top_k`` distinct experts caps every expert's share
        at ``1 / top_k``, so the same skew covers differently at different ``top_k``).
    tokens, layers : int
        Size of each synthetic probe (reuse 0, so tokens are independent draws).
    seed : int
        One seed for every probe (common random numbers: the objective is smooth in ``skew``).
    max_skew : float
        Upper end of the search.

    Returns
    -------
    SkewFit
    """
    target = np.asarray(target, dtype=np.float64)
    E = model.n_experts
    if target.shape != (E + 1,):
        raise CopeInputError(f"expected a coverage curve of {E + 1} points for {model.name}, "
                             f"got shape {target.shape}", field="target")
    g = model.with_layers(layers)

    def curve(s: float) -> np.ndarray:
        tr = synthesize(g, prompts=1, tokens=tokens, seed=seed, skew=float(s), reuse=0.0,
                        predictor_accuracy=None)
        counts = np.stack([np.bincount(tr.routed[:, l].ravel(), minlength=E)
                           for l in range(layers)])
        return coverage_curve(counts)

    def gap(s: float) -> float:
        return float(np.abs(curve(s) - target).max())

    grid = np.linspace(0.0, max_skew, 31)
    best = float(min(grid, key=gap))
    step = grid[1] - grid[0]
    fine = np.clip(best + np.linspace(-step, step, 21), 0.0, max_skew)
    best = round(float(min(fine, key=gap)), 3)
    syn = curve(best)
    return SkewFit(skew=best, target=target.tolist(), synth=syn.tolist(),
                   max_gap=float(np.abs(syn - target).max()))
