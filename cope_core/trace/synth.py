"""Synthetic routing traces with controllable skew, reuse and predictor accuracy.

The generator stands in for a collected trace (docs/formats.md#routing-trace-copetrace1) when no
real one is at hand, and lets tests and the app sweep the three properties that decide which
offloading policy wins.

Generator semantics
-------------------
Popularity
    Every MoE layer ranks its experts by a seeded random permutation of the ids. The expert of
    popularity rank ``r`` (0-based) has weight ``(r + 1) ** -skew`` (:func:`popularity_weights`);
    ``skew = 0`` is uniform.
Reuse
    Token 0 of a prompt samples all ``top_k`` experts of a layer without replacement from the
    layer's weights. For token ``t > 0`` each of token ``t - 1``'s experts at that layer is kept
    independently with probability ``reuse``; the remaining slots are sampled without replacement
    from the weights, excluding the kept ids (a dropped id may come back). The ``top_k`` ids are
    then shuffled: synthetic data has no score order. ``reuse = 1`` repeats token 0's sets.
Predictions (``predictor_accuracy = p``)
    At layer ``l < L - 1`` the list predicted for layer ``l + 1`` holds ``top_k`` ids: every id
    routed at ``(t, l + 1)`` is included independently with probability ``p`` and the rest of the
    list is filled with the most popular ids of layer ``l + 1`` that were *not* routed there
    (deliberately wrong guesses). The list is then shuffled, so the true ids sit at random ranks.
    When a layer has fewer than ``top_k`` non-routed experts the list is shorter, padded with -1.
    The last layer's list is empty (all -1). ``p = None`` means no predictor: width 0.
Context
    Each prompt starts at a context drawn uniformly from ``prompt_context`` (both ends
    inclusive) and grows by one per decoded token.

Everything is drawn from one ``numpy.random.Generator(PCG64(seed))``: the same arguments give an
identical trace. Every prompt has ``tokens`` decode tokens.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from .data import Trace

__all__ = ["SynthParams", "popularity_weights", "synthesize"]


def popularity_weights(n_experts: int, skew: float) -> np.ndarray:
    """Normalised power-law weights by popularity rank.

    Parameters
    ----------
    n_experts : int
        Number of experts ``E`` (>= 1).
    skew : float
        Exponent ``s >= 0``; rank ``r`` gets weight proportional to ``(r + 1) ** -s``.

    Returns
    -------
    ndarray of float64, shape (E,)
        Weights summing to 1, index = popularity rank (most popular first).
    """
    _check_int("n_experts", n_experts, 1)
    check_skew(skew)
    # log domain, shifted by the maximum (rank 0 -> 0), so large skews do not underflow to 0/0
    logw = -float(skew) * np.log1p(np.arange(n_experts, dtype=np.float64))
    w = np.exp(logw)
    return w / w.sum()


@dataclass(frozen=True)
class SynthParams:
    """Parameters of one :func:`synthesize` call, validated on construction.

    Attributes mirror the arguments of :func:`synthesize` (``model`` excluded).
    """

    prompts: int
    tokens: int
    seed: int
    skew: float = 1.0
    reuse: float = 0.5
    predictor_accuracy: float | None = 0.7
    prompt_context: tuple[int, int] = (128, 2048)

    def __post_init__(self) -> None:
        _check_int("prompts", self.prompts, 1)
        _check_int("tokens", self.tokens, 1)
        _check_int("seed", self.seed, 0)
        check_skew(self.skew)
        _check_unit("reuse", self.reuse)
        if self.predictor_accuracy is not None:
            _check_unit("predictor_accuracy", self.predictor_accuracy)
        pc = self.prompt_context
        if (not isinstance(pc, (tuple, list)) or len(pc) != 2
                or not all(isinstance(v, Integral) and not isinstance(v, bool) for v in pc)
                or not 0 <= pc[0] <= pc[1] or pc[1] + self.tokens > np.iinfo(np.int32).max):
            raise CopeInputError(f"expected (low, high) integers with 0 <= low <= high, got {pc!r}",
                                 field="prompt_context")
        object.__setattr__(self, "prompt_context", (int(pc[0]), int(pc[1])))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["prompt_context"] = list(self.prompt_context)
        return d

    def describe(self) -> str:
        """One-line, machine-readable record of how a trace was made."""
        return "synthetic " + json.dumps(self.to_dict(), sort_keys=True)


def _check_int(name: str, v, lo: int) -> None:
    if not isinstance(v, Integral) or isinstance(v, bool) or v < lo:
        raise CopeInputError(f"expected an integer >= {lo}, got {v!r}", field=name)


def check_skew(v) -> None:
    """A popularity skew: a finite number >= 0, else a one-line error."""
    if not isinstance(v, Real) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise CopeInputError(f"expected a finite number >= 0, got {v!r}", field="skew")


def _check_unit(name: str, v) -> None:
    if not isinstance(v, Real) or isinstance(v, bool) or not 0 <= v <= 1:  # NaN fails too
        raise CopeInputError(f"expected a number in [0, 1], got {v!r}", field=name)


def synthesize(model: ModelGeometry, *, prompts: int, tokens: int, seed: int, skew: float = 1.0,
               reuse: float = 0.5, predictor_accuracy: float | None = 0.7,
               prompt_context: tuple[int, int] = (128, 2048), description: str = "") -> Trace:
    """Generate a synthetic routing trace (semantics in the module docstring).

    Parameters
    ----------
    model : ModelGeometry
        Geometry to trace: ``L`` layers, ``E`` experts, ``top_k``.
    prompts, tokens : int
        Number of prompts (>= 1) and decode tokens per prompt (>= 1).
    seed : int
        Seed (>= 0) of the PCG64 generator; the same arguments give an identical trace.
    skew : float
        Power-law exponent of per-layer popularity (>= 0; 0 is uniform).
    reuse : float
        Probability in [0, 1] that a token keeps each expert of the previous token, per layer.
    predictor_accuracy : float or None
        Recall in [0, 1] of the next-layer predictions; None leaves ``predicted`` of width 0.
    prompt_context : (int, int)
        Inclusive range of each prompt's starting context length.
    description : str
        Free text; the parameter record is appended to it.

    Returns
    -------
    Trace
        ``source="synthetic"``, ``N = prompts * tokens`` rows, ``predictor`` =
        ``{"kind": "synthetic", "accuracy": p}`` or None.

    Raises
    ------
    CopeInputError
        When a parameter is out of range.
    """
    if not isinstance(model, ModelGeometry):
        raise CopeInputError(f"expected a ModelGeometry, got {type(model).__name__}", field="model")
    par = SynthParams(prompts=prompts, tokens=tokens, seed=seed, skew=skew, reuse=reuse,
                      predictor_accuracy=predictor_accuracy, prompt_context=prompt_context)
    L, E, k = model.n_layers, model.n_experts, model.top_k
    P, T = par.prompts, par.tokens
    rng = np.random.Generator(np.random.PCG64(par.seed))

    by_rank = np.argsort(rng.random((L, E)), axis=1)      # [l, rank] -> expert id
    rank_of = np.argsort(by_rank, axis=1)                 # [l, id] -> rank
    cost = float(par.skew) * np.log1p(rank_of.astype(np.float64))  # -log weight, up to a shift

    routed = _sample_routed(rng, cost, P, T, k, float(par.reuse))
    n = P * T
    routed = np.ascontiguousarray(routed.transpose(1, 0, 2, 3)).reshape(n, L, k)

    if par.predictor_accuracy is None:
        predicted = np.empty((n, L, 0), dtype=np.int16)
        predictor = None
    else:
        predicted = _predict(rng, routed, by_rank, float(par.predictor_accuracy))
        predictor = {"kind": "synthetic", "accuracy": float(par.predictor_accuracy)}

    lo, hi = par.prompt_context
    start = rng.integers(lo, hi + 1, size=P)
    context = (start[:, None] + np.arange(T)[None, :]).reshape(n).astype(np.int32)
    text = f"{description.strip()}; {par.describe()}" if description.strip() else par.describe()
    return Trace(model=model, prompt_ids=np.arange(P, dtype=np.int32),
                 prompt_start=np.arange(P + 1, dtype=np.int64) * T, context=context,
                 routed=routed, predicted=predicted, source="synthetic", description=text,
                 predictor=predictor)


def _sample_routed(rng: np.random.Generator, cost: np.ndarray, P: int, T: int, k: int,
                   reuse: float) -> np.ndarray:
    """Routed ids [T, P, L, k]; the token recursion is a loop, prompts and layers are vectorised.

    Weighted sampling without replacement uses exponential races (Efraimidis-Spirakis): the k
    smallest ``log(Exp(1)) + cost`` are a without-replacement draw proportional to ``exp(-cost)``.
    Kept ids get key ``-inf`` so they always win a slot and are excluded from the fresh draw.
    """
    L, E = cost.shape
    out = np.empty((T, P, L, k), dtype=np.int16)
    prev = None
    for t in range(T):
        keys = np.log(rng.standard_exponential((P, L, E))) + cost
        if prev is not None and reuse > 0:
            keep = rng.random((P, L, k)) < reuse
            vals = np.take_along_axis(keys, prev, axis=2)
            np.put_along_axis(keys, prev, np.where(keep, -np.inf, vals), axis=2)
        sel = np.argpartition(keys, k - 1, axis=2)[:, :, :k] if k < E else \
            np.broadcast_to(np.arange(E), (P, L, E)).copy()
        # argpartition leaves kept ids clustered first; the trace must not leak that order
        sel = np.take_along_axis(sel, np.argsort(rng.random((P, L, k)), axis=2), axis=2)
        out[t] = sel
        prev = sel
    return out


def _predict(rng: np.random.Generator, routed: np.ndarray, by_rank: np.ndarray,
             p: float) -> np.ndarray:
    """Predicted ids [N, L, k] for layer l + 1, made at layer l (see module docstring)."""
    n, L, k = routed.shape
    E = by_rank.shape[1]
    out = np.full((n, L, k), -1, dtype=np.int16)
    if L < 2:
        return out
    true = routed[:, 1:, :].astype(np.int64)                         # [n, L-1, k]
    # at most k popular ids are routed, so the 2k most popular hold every wrong guess needed
    c = min(2 * k, E)
    cand = np.broadcast_to(by_rank[None, 1:, :c], (n, L - 1, c))
    wrong_ok = ~(cand[..., :, None] == true[..., None, :]).any(axis=3)
    incl = rng.random(true.shape) < p
    pool = np.concatenate([true, cand], axis=2)
    ok = np.concatenate([incl, wrong_ok], axis=2)
    # stable sort moves usable entries forward keeping order: included true ids, then the
    # wrong guesses by popularity; the first k are the list
    order = np.argsort(~ok, axis=2, kind="stable")[:, :, :k]
    lst = np.take_along_axis(pool, order, axis=2)
    valid = np.take_along_axis(ok, order, axis=2)
    # shuffle the usable entries among themselves; padding keys (2.0) keep -1 at the end
    shuffle_keys = np.where(valid, rng.random(valid.shape), 2.0)
    perm = np.argsort(shuffle_keys, axis=2)
    lst = np.take_along_axis(np.where(valid, lst, -1), perm, axis=2)
    out[:, :-1, :] = lst
    return out
