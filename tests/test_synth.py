"""Tests of the synthetic trace generator (cope_core.trace.synth)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cope_core.errors import CopeInputError
from cope_core.geometry import get_model
from cope_core.trace.data import Trace
from cope_core.trace.synth import SynthParams, popularity_weights, synthesize

OLMOE = get_model("olmoe-1b-7b")          # 16 layers, 64 experts, top 8
SMALL = OLMOE.with_layers(4)


def _geom(L: int, E: int, k: int):
    return dataclasses.replace(OLMOE, n_layers=L, n_experts=E, top_k=k)


def _overlap(tr: Trace) -> float:
    """Mean fraction of a token's routed ids also routed by the previous token (same prompt)."""
    r = tr.routed
    same_prompt = np.ones(tr.n_tokens, dtype=bool)
    same_prompt[tr.prompt_start[:-1]] = False          # first token of each prompt has no previous
    cur, prev = r[1:], r[:-1]
    hit = (cur[..., :, None] == prev[..., None, :]).any(axis=3).mean(axis=2)  # [N-1, L]
    return float(hit[same_prompt[1:]].mean())


def _top_share(tr: Trace, frac: float = 0.1) -> float:
    """Share of routing events taken by each layer's most-used ``frac`` of experts."""
    E = tr.model.n_experts
    top = max(1, int(round(frac * E)))
    shares = []
    for layer in range(tr.model.n_layers):
        counts = np.bincount(tr.routed[:, layer, :].ravel(), minlength=E)
        shares.append(np.sort(counts)[::-1][:top].sum() / counts.sum())
    return float(np.mean(shares))


def _recall(tr: Trace) -> float:
    nxt = tr.routed[:, 1:, :]
    pred = tr.predicted[:, :-1, :]
    return float((nxt[..., :, None] == pred[..., None, :]).any(axis=3).mean())


def test_same_seed_identical_and_seeds_differ():
    a = synthesize(SMALL, prompts=3, tokens=20, seed=7)
    b = synthesize(SMALL, prompts=3, tokens=20, seed=7)
    c = synthesize(SMALL, prompts=3, tokens=20, seed=8)
    for name in ("routed", "predicted", "context", "prompt_start", "prompt_ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.description == b.description and a.predictor == b.predictor
    assert not np.array_equal(a.routed, c.routed)
    assert not np.array_equal(a.context, c.context)


def test_shapes_dtypes_and_metadata():
    tr = synthesize(SMALL, prompts=3, tokens=5, seed=1, prompt_context=(10, 20),
                    predictor_accuracy=0.5, description="demo")
    n, L, k = 15, SMALL.n_layers, SMALL.top_k
    assert tr.routed.shape == (n, L, k) and tr.routed.dtype == np.int16
    assert tr.predicted.shape == (n, L, k) and tr.predicted.dtype == np.int16
    assert tr.prompt_ids.dtype == np.int32 and tr.prompt_ids.tolist() == [0, 1, 2]
    assert tr.prompt_start.dtype == np.int64 and tr.prompt_start.tolist() == [0, 5, 10, 15]
    assert tr.context.dtype == np.int32 and tr.context.shape == (n,)
    ctx = tr.context.reshape(3, 5)
    assert ((ctx[:, 0] >= 10) & (ctx[:, 0] <= 20)).all()
    assert (np.diff(ctx, axis=1) == 1).all()
    assert tr.source == "synthetic"
    assert tr.predictor == {"kind": "synthetic", "accuracy": 0.5}
    assert tr.description.startswith("demo; synthetic ")
    rec = json.loads(tr.description.split("synthetic ", 1)[1])
    assert rec == {"prompts": 3, "tokens": 5, "seed": 1, "skew": 1.0, "reuse": 0.5,
                   "predictor_accuracy": 0.5, "prompt_context": [10, 20], "first_prompt": 0}
    tr.validate()  # also ran on construction


def test_reuse_one_repeats_sets():
    tr = synthesize(SMALL, prompts=2, tokens=30, seed=3, reuse=1.0)
    s = np.sort(tr.routed, axis=2).reshape(2, 30, SMALL.n_layers, SMALL.top_k)
    assert (s[:, 1:] == s[:, :1]).all()
    # and prompts are independent: the two prompts' sets are not all the same
    assert not (s[0, 0] == s[1, 0]).all()


def test_reuse_orders_overlap():
    kw = dict(prompts=4, tokens=200, seed=11, skew=0.0, predictor_accuracy=None)
    low = _overlap(synthesize(OLMOE, reuse=0.0, **kw))
    high = _overlap(synthesize(OLMOE, reuse=0.9, **kw))
    # uniform over 64 with top 8: independent draws overlap ~8/64; reuse 0.9 gives >= 0.9
    assert low < 0.2
    assert high > 0.85
    assert high > low + 0.5


def test_skew_concentrates_popularity():
    kw = dict(prompts=4, tokens=200, seed=5, reuse=0.0, predictor_accuracy=None)
    flat = _top_share(synthesize(OLMOE, skew=0.0, **kw))
    steep = _top_share(synthesize(OLMOE, skew=2.0, **kw))
    assert flat < 0.2          # uniform: the busiest 10% of experts take about 10% (+ noise)
    assert steep > 0.5         # capped at 6/8 here: top 6 of 64 experts, 8 distinct per token
    assert steep > flat + 0.3


def test_popularity_weights():
    w = popularity_weights(5, 1.0)
    np.testing.assert_allclose(w.sum(), 1.0)
    np.testing.assert_allclose(w / w[0], [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5])
    np.testing.assert_allclose(popularity_weights(4, 0.0), [0.25] * 4)
    assert np.isfinite(popularity_weights(128, 500.0)).all()
    with pytest.raises(CopeInputError):
        popularity_weights(0, 1.0)
    with pytest.raises(CopeInputError):
        popularity_weights(4, -1.0)


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_predictor_extremes(p):
    tr = synthesize(SMALL, prompts=2, tokens=40, seed=2, predictor_accuracy=p)
    nxt, pred = tr.routed[:, 1:, :], tr.predicted[:, :-1, :]
    contains = (nxt[..., :, None] == pred[..., None, :]).any(axis=3)
    if p == 1.0:
        assert contains.all()
    else:
        assert not contains.any()
    # E=64 leaves plenty of wrong guesses: every list is full length
    assert (pred >= 0).all()
    assert (tr.predicted[:, -1, :] == -1).all()


def test_predictor_recall_close_to_p():
    tr = synthesize(SMALL, prompts=2, tokens=200, seed=4, predictor_accuracy=0.6)
    # 400 tokens x 3 predicted layers x 8 ids = 9600 routing events
    assert abs(_recall(tr) - 0.6) < 0.05
    assert (tr.predicted[:, -1, :] == -1).all()
    assert tr.has_predictions


def test_true_ids_not_always_first():
    tr = synthesize(SMALL, prompts=2, tokens=100, seed=9, predictor_accuracy=0.5)
    nxt, pred = tr.routed[:, 1:, :], tr.predicted[:, :-1, :]
    is_true = (pred[..., :, None] == nxt[..., None, :]).any(axis=3)
    # shuffled: a true id shows up at the last rank in some list, a wrong one at the first
    assert is_true[..., -1].any() and (~is_true[..., 0]).any()


def test_no_predictor_width_zero():
    tr = synthesize(SMALL, prompts=1, tokens=3, seed=0, predictor_accuracy=None)
    assert tr.predicted.shape == (3, SMALL.n_layers, 0)
    assert tr.predictor is None and not tr.has_predictions


def test_short_lists_when_few_wrong_guesses():
    g = _geom(3, 3, 2)   # only one non-routed expert per layer
    tr = synthesize(g, prompts=1, tokens=20, seed=0, predictor_accuracy=0.0)
    pred = tr.predicted[:, :-1, :]
    assert ((pred >= 0).sum(axis=2) == 1).all()
    assert (pred[..., 1] == -1).all()


@pytest.mark.parametrize("kwargs", [
    dict(prompts=0), dict(tokens=0), dict(prompts=1.5), dict(tokens=True), dict(seed=-1),
    dict(reuse=-0.1), dict(reuse=1.1), dict(reuse=float("nan")), dict(skew=-1.0),
    dict(skew=float("inf")), dict(predictor_accuracy=1.5), dict(predictor_accuracy=-0.01),
    dict(prompt_context=(10, 5)), dict(prompt_context=(-1, 5)), dict(prompt_context=(1,)),
    dict(prompt_context=(1.0, 5)),
])
def test_bad_params_raise(kwargs):
    args = dict(prompts=1, tokens=2, seed=0) | kwargs
    with pytest.raises(CopeInputError) as err:
        synthesize(SMALL, **args)
    assert next(iter(kwargs)) in str(err.value)


def test_bad_model_raises():
    with pytest.raises(CopeInputError):
        synthesize("qwen3-30b-a3b", prompts=1, tokens=1, seed=0)


def test_params_dataclass_frozen():
    p = SynthParams(prompts=1, tokens=1, seed=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.seed = 3  # type: ignore[misc]


@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 4), E=st.integers(1, 12), data=st.data(), seed=st.integers(0, 2**32),
       reuse=st.floats(0, 1), skew=st.floats(0, 4),
       p=st.one_of(st.none(), st.floats(0, 1)))
def test_any_small_geometry_is_valid(L, E, data, seed, reuse, skew, p):
    k = data.draw(st.integers(1, E))
    g = _geom(L, E, k)
    tr = synthesize(g, prompts=2, tokens=3, seed=seed, reuse=reuse, skew=skew,
                    predictor_accuracy=p)
    r = tr.routed
    assert ((r >= 0) & (r < E)).all()
    assert (np.sort(r, axis=2)[..., 1:] != np.sort(r, axis=2)[..., :-1]).all()
    if p is None:
        assert tr.predicted.shape[2] == 0
    else:
        pr = tr.predicted
        assert pr.shape == (6, L, k)
        assert (pr[:, -1, :] == -1).all()
        ok = pr >= 0
        assert (pr[ok] < E).all()
    tr.validate()
