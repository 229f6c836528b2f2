"""Replay and TPOT composition: hand-worked traces, the plain-Python reference, properties."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import naive
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cope_core.estimate.predict import predict
from cope_core.geometry import ModelGeometry
from cope_core.matrix import CANDIDATE_IDS
from cope_core.profile.data import COLUMNS, Profile, required_keys
from cope_core.replay.engine import replay
from cope_core.trace.data import Trace, fill_order
from cope_core.trace.synth import synthesize


def geometry(L, E, k):
    return ModelGeometry(name="tiny", n_layers=L, n_experts=E, top_k=k, hidden=8,
                         expert_intermediate=4, dtype_bytes=2, n_shared_experts=0, dense_layers=0,
                         n_heads=2, n_kv_heads=2, head_dim=4, vocab=16, non_expert_bytes=1000)


def make_trace(g, prompts, width=None):
    """prompts: list of (contexts, routed[t][l], predicted[t][l])."""
    routed, pred, ctx, starts = [], [], [], [0]
    W = width if width is not None else max(
        [len(p) for _, _, pr in prompts for row in pr for p in row] + [0])
    for contexts, r, p in prompts:
        for t in range(len(r)):
            routed.append(r[t])
            pred.append([list(p[t][l]) + [-1] * (W - len(p[t][l])) for l in range(g.n_layers)])
            ctx.append(contexts[t])
        starts.append(starts[-1] + len(r))
    return Trace(model=g, prompt_ids=np.arange(len(prompts), dtype=np.int32),
                 prompt_start=np.array(starts, np.int64), context=np.array(ctx, np.int32),
                 routed=np.array(routed, np.int16).reshape(len(routed), g.n_layers, g.top_k),
                 predicted=np.array(pred, np.int16).reshape(len(routed), g.n_layers, W))


def make_profile(g, cost, shared=((100, 100.0), (200, 200.0)), threads=1):
    """cost(key) -> median_us for each required key of one operating point."""
    rows = [("shared", "decode", -1, -1, -1, -1, c, threads, 100.0, v, v, v, 3) for c, v in shared]
    rows += [(*key, threads, 100.0, cost(key), cost(key), cost(key), 3)
             for key in required_keys(g.top_k)]
    table = pd.DataFrame(rows, columns=list(COLUMNS)).astype(COLUMNS)
    return Profile(table=table, model=g, platform={"gpu": "test"})


# --- the hand-worked case -------------------------------------------------------------------
# L=3 layers, E=4 experts, top-1, K=1, fill by id (every layer starts with expert 0).
G = geometry(3, 4, 1)
HAND = make_trace(G, [(
    [100, 150, 300],
    [[[0], [1], [2]], [[1], [0], [2]], [[0], [0], [3]]],
    [[[1], [2], []], [[0], [3], []], [[], [], []]],
)])

SCHEDULE = {("parallel", 0): 50, ("parallel", 1): 10, ("wait_then_gpu", 0): 80,
            ("wait_then_gpu", 1): 12, ("ready_first", 0): 70, ("ready_first", 1): 11,
            ("cost_selected", 0): 60, ("cost_selected", 1): 10}
ATOMIC = {("gpu_expert", 0): 0, ("gpu_expert", 1): 3, ("cpu_expert", 0): 1, ("cpu_expert", 1): 30,
          ("stage", 0): 0, ("stage", 1): 40, ("staged_gpu_expert", 0): 0,
          ("staged_gpu_expert", 1): 4, ("act_copy", 1): 2, ("sync", 1): 1, ("merge", 1): 1,
          ("prefetch", 1): 7}
PREFETCH = {("mutable_per_layer", 0): 1, ("mutable_per_layer", 1): 5,
            ("mutable_cross_layer", 0): 2, ("mutable_cross_layer", 1): 6}


def hand_cost(key):
    kind, name, h, c, u, n = key[:6]
    if kind == "schedule":
        return float(SCHEDULE[(name, h)])
    if kind == "prefetch":
        return float(PREFETCH[(name, n)])
    if kind == "layer":
        return {"cpu_layer": 40.0, "gpu_layer": 9.0}[name]
    return float(ATOMIC[(name, n)])


HAND_PROFILE = make_profile(G, hand_cost)


def test_hand_histograms():
    order = fill_order(HAND, by_id=True)
    fixed = replay(HAND, order, "fixed", 1)
    per = replay(HAND, order, "mutable_per_layer", 1)
    cross = replay(HAND, order, "mutable_cross_layer", 1)
    # hits per layer, by token: fixed L0 1,0,1  L1 0,1,1  L2 0,0,0
    assert fixed.hist[0, 0].tolist() == [[1, 2], [1, 2], [3, 0]]
    # per-layer: L0 1,0,1  L1 1,1,1  L2 1,0,1; prefetches at t0 L0 (h=1), t0 L1, t1 L0 (h=0), t1 L1
    assert per.hist[0, 0].tolist() == [[1, 2], [0, 3], [1, 2]]
    assert per.ins[0, 0].tolist() == [[1, 1], [0, 2], [0, 0]]
    # cross-layer: t1 L1 evicts layer 0's expert for layer 2, so L0 misses at t2, L2 hits at t1
    assert cross.hist[0, 0].tolist() == [[2, 1], [0, 3], [0, 3]]
    assert cross.ins[0, 0].tolist() == [[1, 1], [0, 2], [0, 0]]
    assert per.hits().tolist() == [[7]] and cross.hits().tolist() == [[7]]
    assert fixed.hits().tolist() == [[4]]


def by_candidate(df):
    return df.set_index("candidate")


def test_hand_tpot_cope():
    df = by_candidate(predict(HAND, HAND_PROFILE, 1, fill_by_id=True))
    # shared: contexts 100, 150, 300 -> 100, 150, 200 (clamped)  = 450 over 3 tokens
    exact = {
        "fixed/parallel": Fraction(450 + 4 * 10 + 5 * 50, 3),
        "fixed/wait_then_gpu": Fraction(450 + 4 * 12 + 5 * 80, 3),
        "fixed/ready_first": Fraction(450 + 4 * 11 + 5 * 70, 3),
        "fixed/cost_selected": Fraction(450 + 4 * 10 + 5 * 60, 3),
        # 7 hits, 2 misses; 6 prefetch steps, 4 inserted: 4*5 + 2*1
        "mutable_per_layer/parallel": Fraction(450 + 7 * 10 + 2 * 50 + 22, 3),
        "mutable_cross_layer/parallel": Fraction(450 + 7 * 10 + 2 * 50 + 4 * 6 + 2 * 2, 3),
        "mutable_cross_layer/wait_then_gpu": Fraction(450 + 7 * 12 + 2 * 80 + 28, 3),
        # N_gpu = floor(1*3/4) = 0: three CPU layers of 40
        "layer_partition": Fraction(450 + 3 * 3 * 40, 3),
    }
    for cid, value in exact.items():
        assert df.loc[cid, "tpot_us"] == pytest.approx(float(value), rel=1e-15, abs=0), cid
    assert df.loc["mutable_per_layer/parallel", "prefetches"] == 4
    assert df.loc["fixed/parallel", "hit_rate"] == pytest.approx(4 / 9)
    assert df.loc["mutable_cross_layer/parallel", "shared_us"] == 150.0
    assert df.loc["mutable_per_layer/parallel", "prefetch_us"] == pytest.approx(22 / 3)
    assert bool(df.loc["mutable_per_layer/parallel", "winner"])
    assert df["winner"].sum() == 1


def test_hand_tpot_atomic():
    df = by_candidate(predict(HAND, HAND_PROFILE, 1, fill_by_id=True, estimator="atomic"))
    # parallel: h=1 max(3, 1+2)+1+1 = 5; h=0 max(0, 30+2)+2 = 34
    assert df.loc["fixed/parallel", "tpot_us"] == pytest.approx((450 + 4 * 5 + 5 * 34) / 3)
    # wait_then_gpu: h=1 0+3+0+2 = 5; h=0 40+0+4+2 = 46; each inserted prefetch adds P=7
    assert df.loc["mutable_per_layer/wait_then_gpu", "tpot_us"] == pytest.approx(
        (450 + 7 * 5 + 2 * 46 + 4 * 7) / 3)
    # cost_selected split at h=0 is c=1 (tie 60/60 goes to the larger CPU share): 32+0+2
    assert df.loc["fixed/cost_selected", "tpot_us"] == pytest.approx((450 + 4 * 5 + 5 * 34) / 3)
    # CPU layer = C[1] + A + F + M = 34
    assert df.loc["layer_partition", "tpot_us"] == pytest.approx((450 + 9 * 34) / 3)


def test_layer_partition_counts_gpu_layers():
    df = by_candidate(predict(HAND, HAND_PROFILE, [2, 4], fill_by_id=True,
                              candidates=["layer_partition"]).query("experts_per_layer == 2"))
    # K=2: N_gpu = floor(6/4) = 1, N_cpu = 2
    assert df.loc["layer_partition", "tpot_us"] == pytest.approx((450 + 3 * (2 * 40 + 9)) / 3)
    assert df.loc["layer_partition", "hit_rate"] == pytest.approx(1 / 3)


def test_popularity_fill_ties_to_lower_id():
    g = geometry(1, 4, 2)
    cal = make_trace(g, [([1, 1, 1], [[[3, 1]], [[1, 2]], [[3, 0]]], [[[]], [[]], [[]]])])
    # counts: 0:1 1:2 2:1 3:2 -> ranks 1, 3, 0, 2
    assert fill_order(cal).tolist() == [[1, 3, 0, 2]]
    assert fill_order(cal, by_id=True).tolist() == [[0, 1, 2, 3]]


def test_per_prompt_reset_and_mean():
    g = geometry(2, 4, 1)
    one = ([100, 100], [[[1], [1]], [[1], [1]]], [[[1], []], [[1], []]])
    tr = make_trace(g, [one, one])
    prof = make_profile(g, hand_cost_2layer)
    df = by_candidate(predict(tr, prof, 1, fill_by_id=True))
    single = by_candidate(predict(make_trace(g, [one]), prof, 1, fill_by_id=True))
    # the second prompt starts from the initial fill again, so both prompts are identical
    assert df.loc["mutable_per_layer/parallel", "prompt_tpot_us"].tolist() == \
        single.loc["mutable_per_layer/parallel", "prompt_tpot_us"].tolist() * 2
    assert df.loc["mutable_per_layer/parallel", "prefetches"] == 2


def hand_cost_2layer(key):
    return hand_cost(key)


# --- against the plain-Python reference -----------------------------------------------------
def reference_tpots(trace, profile, K, by_id=False, calibration=None):
    g = trace.model
    L, E, k = g.n_layers, g.n_experts, g.top_k
    op = profile.resolve()
    cal = calibration or trace
    rows = [(l, list(map(int, cal.routed[t, l]))) for t in range(cal.n_tokens) for l in range(L)]
    order = naive.popularity_order(rows, L, E, by_id)

    def shared(c):
        return float(np.interp(c, op.shared_context, op.shared_us))

    out = {}
    for cid in CANDIDATE_IDS:
        tp = []
        for routed, pred, ctx in naive.split_trace(trace):
            if cid == "layer_partition":
                tp.append(naive.layer_partition_tpot(ctx, L, E, K, shared, op.cpu_layer,
                                                     op.gpu_layer))
                continue
            res, ex = cid.split("/")
            from cope_core.matrix import EXECUTIONS
            ei = [e.value for e in EXECUTIONS].index(ex)
            if ex == "cost_selected":
                moe = [np.nanmin(op.schedule[ei, h, : k - h + 1]) for h in range(k + 1)]
            elif ex == "parallel":
                moe = [op.schedule[ei, h, k - h] for h in range(k + 1)]
            else:
                moe = [op.schedule[ei, h, 0] for h in range(k + 1)]
            pf = op.prefetch.get(res)
            tp.append(naive.tpot_prompt(routed, pred, ctx, L, E, k, K, order, res, moe, shared,
                                        pf)[0])
        out[cid] = tp
    return out


def random_cost(seed):
    rng = np.random.default_rng(seed)
    table = {}

    def cost(key):
        if key not in table:
            table[key] = float(rng.integers(0, 100)) + float(rng.random())
        return table[key]
    return cost


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernels_match_reference_on_random_traces(seed):
    rng = np.random.default_rng(seed)
    L, E, k = int(rng.integers(2, 5)), int(rng.integers(3, 9)), 0
    k = int(rng.integers(1, min(E, 4) + 1))
    g = geometry(L, E, k)
    tr = synthesize(g, prompts=3, tokens=int(rng.integers(5, 25)), seed=seed, skew=1.2, reuse=0.4,
                    predictor_accuracy=0.6, prompt_context=(50, 250))
    cal = synthesize(g, prompts=2, tokens=10, seed=seed + 100)
    prof = make_profile(g, random_cost(seed))
    ks = list(range(E + 1))
    df = predict(tr, prof, ks, calibration=cal)
    for K in ks:
        ref = reference_tpots(tr, prof, K, calibration=cal)
        sub = df[df["experts_per_layer"] == K].set_index("candidate")
        for cid, values in ref.items():
            np.testing.assert_allclose(sub.loc[cid, "prompt_tpot_us"], values, rtol=1e-12,
                                       err_msg=f"K={K} {cid}")


def test_single_k_equals_sweep():
    g = geometry(4, 8, 2)
    tr = synthesize(g, prompts=4, tokens=30, seed=5)
    order = fill_order(tr)
    for res in ("fixed", "mutable_per_layer", "mutable_cross_layer"):
        sweep = replay(tr, order, res, list(range(9)))
        for K in range(9):
            one = replay(tr, order, res, K)
            assert (one.hist[0] == sweep.hist[K]).all() and (one.ins[0] == sweep.ins[K]).all()


# --- properties --------------------------------------------------------------------------
@st.composite
def traces(draw):
    L = draw(st.integers(1, 4))
    E = draw(st.integers(2, 10))
    k = draw(st.integers(1, min(E, 4)))
    seed = draw(st.integers(0, 2**16))
    acc = draw(st.sampled_from([None, 0.0, 0.5, 1.0]))
    tr = synthesize(geometry(L, E, k), prompts=draw(st.integers(1, 3)),
                    tokens=draw(st.integers(1, 12)), seed=seed,
                    skew=draw(st.floats(0, 2)), reuse=draw(st.floats(0, 1)),
                    predictor_accuracy=acc, prompt_context=(10, 400))
    return tr


PROP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROP
@given(traces())
def test_hits_bounded_and_fixed_monotone(tr):
    g = tr.model
    order = fill_order(tr)
    ks = list(range(g.n_experts + 1))
    fixed = replay(tr, order, "fixed", ks)
    hits = fixed.hits().sum(axis=1)
    assert (np.diff(hits) >= 0).all()
    for res in ("fixed", "mutable_per_layer", "mutable_cross_layer"):
        rc = replay(tr, order, res, ks)
        assert rc.hist.shape[-1] == g.top_k + 1          # hits <= top_k by construction
        assert (rc.hist.sum(axis=3) == tr.tokens_per_prompt[None, :, None]).all()
        assert (rc.ins <= rc.hist).all()
        full = rc.hist[-1]                               # K = E: everything resident
        assert (full[..., : g.top_k] == 0).all() and rc.ins[-1].sum() == 0
        assert rc.hist[0][..., 1:].sum() == 0 and rc.ins[0].sum() == 0   # K = 0: no hits


@PROP
@given(traces(), st.integers(0, 2**16))
def test_tpot_at_least_shared(tr, seed):
    prof = make_profile(tr.model, random_cost(seed))
    df = predict(tr, prof, list(range(tr.model.n_experts + 1)), fill_by_id=True)
    assert (df["tpot_us"] >= df["shared_us"] - 1e-9).all()
    full = df[df["experts_per_layer"] == tr.model.n_experts]
    assert (full[full["candidate"] != "layer_partition"]["hit_rate"] == 1.0).all()
    assert (full["prefetches"] == 0).all()


# --- the fixed hit count without replay = the fixed kernel ----------------------------------------
SHIPPED = sorted((Path(__file__).resolve().parents[1] / "data").glob("*/*trace.parquet"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_fixed_hits_from_popularity_equal_the_replay_on_shipped_traces(path):
    # trace/stats computes fixed-residency hits as a cumulative sum of popularity in fill order;
    # the replay's fixed kernels (one K, and the order-statistics sweep) must count exactly the
    # same hits at every K, with the calibration's fill and with the trace's own
    from cope_core import parquet_io
    from cope_core.trace.stats import fixed_hits
    tr = parquet_io.read_trace(path)
    cal_path = path.with_name(path.name.replace("trace", "calibration"))
    cal = parquet_io.read_trace(cal_path) if cal_path.exists() else None
    E = tr.model.n_experts
    ks = np.arange(E + 1)
    for c in (cal, None):
        want = fixed_hits(tr, ks, c)
        order = fill_order(c if c is not None else tr)
        sweep = replay(tr, order, "fixed", ks).hits().sum(axis=1)
        np.testing.assert_array_equal(sweep, want)
        for k in (0, 1, E // 3, E):
            one = replay(tr, order, "fixed", [k]).hits().sum(axis=1)
            assert one[0] == want[k]
    assert SHIPPED  # the data folder is part of the repository
