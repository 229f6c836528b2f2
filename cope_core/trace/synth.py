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
    layer's weights (successive weighted draws: each id with probability proportional to its
    weight among those not yet taken). For token ``t > 0`` each of token ``t - 1``'s experts at
    that layer is kept independently with probability ``reuse``; the remaining slots are sampled
    without replacement from the weights, excluding the kept ids (a dropped id may come back).
    The ``top_k`` ids are then shuffled: synthetic data has no score order. ``reuse = 1``
    repeats token 0's sets.
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

Random streams are ``numpy.random.Generator(PCG64)`` seeded from
``SeedSequence(seed, spawn_key=...)``: key ``(0,)`` draws the popularity permutation (the
synthetic *model*) and key ``(1, i)`` everything of prompt id ``i`` (its starting context,
routing and predictions). A calibration trace of the same model therefore takes the same seed and
other prompt ids (``first_prompt``). The same
arguments give an identical trace, prompt ``i`` does not depend on how many prompts are made, and
prompts can be generated in parallel and in parts (:func:`synthesize_parts`) with the same result.
Every prompt has ``tokens`` decode tokens.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from .data import Trace

__all__ = ["SynthParams", "popularity_weights", "synthesize", "synthesize_parts"]


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
    first_prompt: int = 0

    def __post_init__(self) -> None:
        _check_int("prompts", self.prompts, 1)
        _check_int("first_prompt", self.first_prompt, 0)
        if self.first_prompt + self.prompts - 1 > np.iinfo(np.int32).max:
            raise CopeInputError(f"prompt ids up to {self.first_prompt + self.prompts - 1} do "
                                 "not fit int32", field="first_prompt")
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
    if not isinstance(v, Real) or isinstance(v, bool) or not 0 <= float(v) <= 1:  # NaN fails
        raise CopeInputError(f"expected a number in [0, 1], got {v!r}", field=name)


def synthesize(model: ModelGeometry, *, prompts: int, tokens: int, seed: int, skew: float = 1.0,
               reuse: float = 0.5, predictor_accuracy: float | None = 0.7,
               prompt_context: tuple[int, int] = (128, 2048), description: str = "",
               first_prompt: int = 0) -> Trace:
    """Generate a synthetic routing trace (semantics in the module docstring).

    Parameters
    ----------
    model : ModelGeometry
        Geometry to trace: ``L`` layers, ``E`` experts, ``top_k``.
    prompts, tokens : int
        Number of prompts (>= 1) and decode tokens per prompt (>= 1).
    seed : int
        Seed (>= 0) of the random streams; the same arguments give an identical trace.
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
    first_prompt : int
        Id of the first prompt (>= 0); prompts are ``first_prompt, first_prompt + 1, ...``. The
        popularity ranking depends on ``seed`` only, so a calibration trace of the same
        synthetic model is the same seed with prompts the evaluated trace does not have.

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
    par = _params(model, prompts, tokens, seed, skew, reuse, predictor_accuracy, prompt_context,
                  first_prompt)
    return _generate(model, par, description, 0, par.prompts)


def synthesize_parts(model: ModelGeometry, *, prompts: int, tokens: int, seed: int,
                     skew: float = 1.0, reuse: float = 0.5,
                     predictor_accuracy: float | None = 0.7,
                     prompt_context: tuple[int, int] = (128, 2048), description: str = "",
                     first_prompt: int = 0, part_rows: int = 1 << 20) -> Iterator[Trace]:
    """:func:`synthesize` in consecutive parts of whole prompts, for writing a trace larger than
    memory (:func:`cope_core.parquet_io.write_trace_parts`); arguments as :func:`synthesize`.

    Parameters
    ----------
    part_rows : int
        Rows (tokens x layers) per part, at least one prompt's. The parts together are exactly
        the trace :func:`synthesize` returns.
    """
    par = _params(model, prompts, tokens, seed, skew, reuse, predictor_accuracy, prompt_context,
                  first_prompt)
    step = max(1, int(part_rows) // (par.tokens * model.n_layers))
    for lo in range(0, par.prompts, step):
        yield _generate(model, par, description, lo, min(par.prompts, lo + step))


def _params(model, prompts, tokens, seed, skew, reuse, predictor_accuracy, prompt_context,
            first_prompt) -> SynthParams:
    if not isinstance(model, ModelGeometry):
        raise CopeInputError(f"expected a ModelGeometry, got {type(model).__name__}", field="model")
    return SynthParams(prompts=prompts, tokens=tokens, seed=seed, skew=skew, reuse=reuse,
                       predictor_accuracy=predictor_accuracy, prompt_context=prompt_context,
                       first_prompt=first_prompt)


def _stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def _generate(model: ModelGeometry, par: SynthParams, description: str, lo: int,
              hi: int) -> Trace:
    """The ``lo``-th to ``hi - 1``-th prompts of the trace ``par`` describes."""
    # numba loads with the first kernel, not with the package (trace.data.Trace.validate)
    from ._synth_kernels import _alias_tables, _predicted_prompt, _routed_prompt
    L, E, k = model.n_layers, model.n_experts, model.top_k
    T, P = par.tokens, hi - lo
    by_rank = np.argsort(_stream(par.seed, 0).random((L, E)), axis=1)  # [l, rank] -> expert id
    rank_of = np.argsort(by_rank, axis=1)                                # [l, id] -> rank
    weight = popularity_weights(E, par.skew)[rank_of]                    # [l, id]
    prob, alias = np.empty((L, E)), np.empty((L, E), np.int64)
    _alias_tables(weight, prob, alias)
    p = par.predictor_accuracy
    routed = np.empty((P, T, L, k), np.int16)
    predicted = np.empty((P, T, L, k if p is not None else 0), np.int16)
    start = np.empty(P, np.int64)
    low, high = par.prompt_context

    def one(i: int) -> None:
        rng = _stream(par.seed, 1, par.first_prompt + lo + i)
        start[i] = rng.integers(low, high + 1)
        mark = np.empty(E, np.int64)
        _routed_prompt(rng, prob, alias, weight, by_rank, float(par.reuse), routed[i], mark)
        if p is not None:
            _predicted_prompt(rng, routed[i], by_rank, float(p), predicted[i], mark)

    # the kernels release the GIL and each prompt has its own stream: threads change nothing
    with ThreadPoolExecutor(max_workers=min(P, os.cpu_count() or 1)) as pool:
        list(pool.map(one, range(P)))
    n = P * T
    context = (start[:, None] + np.arange(T)[None, :]).reshape(n).astype(np.int32)
    text = f"{description.strip()}; {par.describe()}" if description.strip() else par.describe()
    first = par.first_prompt
    return Trace(model=model, prompt_ids=np.arange(first + lo, first + hi, dtype=np.int32),
                 prompt_start=np.arange(P + 1, dtype=np.int64) * T, context=context,
                 routed=routed.reshape(n, L, k), predicted=predicted.reshape(n, L, -1),
                 source="synthetic", description=text,
                 predictor=None if p is None else {"kind": "synthetic", "accuracy": float(p)})
