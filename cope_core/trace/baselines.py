"""Next-layer predictions that need no hidden states, and their recall (numpy only).

``previous-token``
    layer ``l + 1``'s experts of the previous token of the same prompt (the first token of a
    prompt, which has none, falls back to ``popularity``);
``popularity``
    the most frequently routed experts of layer ``l + 1`` (in the training prompts, or the
    calibration trace).

They are the yardsticks of the trained predictor (:mod:`cope_core.trace.sources.predictor`) and the
recall columns of ``cope trace stats``.
"""
from __future__ import annotations

import numpy as np

from ..errors import CopeInputError
from .data import Trace

METHODS = ("previous-token", "popularity")


def popularity_lists(routed: np.ndarray, n_experts: int, width: int) -> np.ndarray:
    """``lists[l]``: the ``width`` most routed experts of layer ``l`` (ties to the lower id)."""
    N, L, k = routed.shape
    flat = (np.arange(L)[None, :, None] * n_experts + routed.astype(np.int64)).ravel()
    counts = np.bincount(flat, minlength=L * n_experts).reshape(L, n_experts)
    return np.argsort(-counts, axis=1, kind="stable")[:, :width].astype(np.int16)


def baseline_predictions(routed: np.ndarray, prompt_start: np.ndarray, method: str,
                         popular: np.ndarray) -> np.ndarray:
    """Predicted lists ``[N, L, k]`` for layer ``l + 1`` made at layer ``l`` by a baseline.

    Parameters
    ----------
    routed : ndarray [N, L, k]
    prompt_start : ndarray [P + 1]
        Token offsets of the prompts (the previous token never crosses a prompt boundary).
    method : {"previous-token", "popularity"}
    popular : ndarray [L, >= k]
        Popularity lists from :func:`popularity_lists`, used by ``popularity`` and for the
        first token of each prompt under ``previous-token``.
    """
    if method not in METHODS:
        raise CopeInputError(f"expected one of {list(METHODS)}, got {method!r}", field="method")
    N, L, k = routed.shape
    out = np.full((N, L, k), -1, np.int16)
    nxt = np.broadcast_to(popular[1:, :k], (N, L - 1, k)).copy()
    if method == "previous-token":
        first = np.zeros(N, bool)
        first[prompt_start[:-1]] = True
        prev = np.roll(routed[:, 1:, :], 1, axis=0)
        nxt = np.where(first[:, None, None], nxt, prev)
    out[:, :-1, :] = nxt
    return out


def recall_at_k(predicted: np.ndarray, routed: np.ndarray, k: int | None = None) -> np.ndarray:
    """Per layer pair ``l -> l + 1``: mean over tokens of ``|top-k(predicted[t, l]) ∩
    routed[t, l + 1]| / k``; shape ``[L - 1]`` (NaN when there are no tokens)."""
    N, L, kk = routed.shape
    k = kk if k is None else k
    if predicted.shape[2] == 0 or N == 0:
        return np.full(L - 1, np.nan)
    top = predicted[:, :-1, :k].astype(np.int64)                   # [N, L-1, <=k]
    true = routed[:, 1:, :].astype(np.int64)                       # [N, L-1, kk]
    hit = ((top[..., :, None] == true[..., None, :]) & (top[..., :, None] >= 0)).any(axis=3)
    return hit.sum(axis=2).mean(axis=0) / kk


def predict_trace(trace: Trace, method: str, calibration: Trace | None = None) -> Trace:
    """A copy of ``trace`` whose ``predicted`` column comes from a baseline (``method``)."""
    cal = calibration if calibration is not None else trace
    if calibration is not None and not calibration.model.same_shape(trace.model):
        raise CopeInputError("calibration geometry differs from the trace's",
                             source=calibration.path, field="model")
    k = trace.model.top_k
    popular = popularity_lists(cal.routed, trace.model.n_experts, k)
    pred = baseline_predictions(trace.routed, trace.prompt_start, method, popular)
    return Trace(model=trace.model, prompt_ids=trace.prompt_ids, prompt_start=trace.prompt_start,
                 context=trace.context, routed=trace.routed, predicted=pred, source=trace.source,
                 description=trace.description,
                 predictor={"kind": "baseline", "method": method,
                            "popularity_from": "calibration" if calibration is not None
                            else "trace"})
