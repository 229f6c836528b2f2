"""The three estimators' per-layer costs, the roofline and the platform tables, checked against
numbers worked out by hand (docs/design.md#profiles-and-operating-points to #the-estimators)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from tiny import (
    ROUND_GEOMETRY,
    ROUND_SPEC,
    exact,
    hand_atomic,
    row_us,
    tiny_profile,
    tiny_trace,
)

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate import layer_costs, predict
from cope_core.estimate import roofline as rl
from cope_core.estimate.costs import atomic_costs, cope_costs, cost_selected_split, hrm_costs
from cope_core.geometry import ModelGeometry
from cope_core.matrix import EXECUTIONS, Execution
from cope_core.platforms import (
    GPUS,
    LINKS,
    PlatformSpec,
    load_spec,
    platform_spec,
    resolve_platform,
    roofline_only,
)
from cope_core.profile.analytic import analytic_profile, default_threads
from cope_core.profile.data import ProfileKey, required_keys
from cope_core.trace.data import Trace

P, W, R, C = (EXECUTIONS.index(e) for e in (Execution.PARALLEL, Execution.WAIT_THEN_GPU,
                                            Execution.READY_FIRST, Execution.COST_SELECTED))

# --- a geometry and a platform with round numbers (tests/tiny.py) -----------------------------
# expert_bytes = 3 * 1000 * 500 * 2 = 3e6 B, expert_flops = 2 * 3 * 1000 * 500 = 3e6 FLOP.
G, SPEC = ROUND_GEOMETRY, ROUND_SPEC
# its pure roofline (no overheads, full efficiency): the analytic profile's work terms alone
BARE = roofline_only(SPEC)
# GPU expert: max(3e6/1e12 s, 3e6/1e11 s) = max(3, 30) us = 30 us
GPU_US = 30.0
# CPU expert by threads: flops 5e9*t (t <= 4 cores), bandwidth min(1.5e10, 1e10*t)
#   t=1: max(600, 300) = 600;  t=2: max(300, 200) = 300;  t=4: max(150, 200) = 200
CPU_US = {1: 600.0, 2: 300.0, 4: 200.0, 16: 200.0}
COPY_US = 300.0   # 3e6 B / 1e10 B/s
ACT_US = 0.4      # 2 * 1000 * 2 B / 1e10 B/s


def test_expert_size():
    assert G.expert_bytes == 3_000_000 and G.expert_flops == 3_000_000


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_gpu_and_copy_per_expert(n):
    assert rl.gpu_experts_us(G, SPEC, n) == exact(GPU_US * n)
    assert rl.copy_experts_us(G, SPEC, n) == exact(COPY_US * n)


def test_gpu_compute_bound():
    slow = PlatformSpec(**(SPEC.to_dict() | {"gpu_flops": 1e9}))
    assert rl.gpu_experts_us(G, slow, 2) == exact(2 * 3000.0)  # 3e6 FLOP / 1e9 FLOP/s


@pytest.mark.parametrize("threads", [1, 2, 4, 16])
def test_cpu_per_expert(threads):
    assert rl.cpu_experts_us(G, SPEC, 1, threads) == exact(CPU_US[threads])
    assert rl.cpu_experts_us(G, SPEC, 3, threads) == exact(3 * CPU_US[threads])
    assert rl.cpu_experts_us(G, SPEC, 0, threads) == 0.0


def test_act_copy():
    assert rl.act_copy_us(G, SPEC) == exact(ACT_US)


@pytest.mark.parametrize("threads,h,c,u,pf,expected", [
    (1, 2, 0, 0, 0, 60.0),             # two resident experts: GPU 2 * 30
    (1, 1, 1, 0, 0, 600.0),            # parallel h=1: CPU 600 > act copy 0.4, GPU 30
    (4, 1, 1, 0, 0, 200.0),
    (4, 0, 2, 0, 0, 400.0),            # parallel h=0 at 4 threads
    (1, 0, 2, 0, 0, 1200.0),
    (4, 1, 0, 1, 0, 300.0),            # wait/ready h=1: copy 300 > GPU 60
    (4, 0, 0, 2, 0, 600.0),            # copy 600 > GPU 60
    (4, 0, 1, 1, 0, 300.4),            # copy 300 + activation 0.4 > CPU 200 > GPU 30
    (4, 2, 0, 0, 1, 300.0),            # a prefetch shares the copy lane: 300 > GPU 60
    (4, 1, 1, 0, 1, 300.4),            # 300 + 0.4 > CPU 200
    (4, 0, 0, 0, 0, 0.0),              # zero experts cost zero
    (1, 0, 0, 0, 0, 0.0),
])
def test_layer_us(threads, h, c, u, pf, expected):
    assert rl.layer_us(G, SPEC, threads, h, c, u, prefetched=pf) == exact(expected)


def test_shared_work_per_part():
    # attention: 2*200*1000 + 2*100*1000 = 600,000 weights; + router 4*1000 -> MoE block 604,000
    # weights = 1.208e6 B; KV per block 2 * 2 * 50 * 2 * ctx = 400 ctx B; attention FLOPs 800 ctx
    # ctx 0: max(1.208 us, 12.08 us) = 12.08; ctx 1000: (1.208e6 + 4e5) B -> 16.08 us
    np.testing.assert_allclose(rl.moe_block_us(G, SPEC, np.array([0, 1000])), [12.08, 16.08],
                               rtol=1e-12)
    # dense block: 600,000 + 3 * 1000 * (500 * 2) = 3.6e6 weights = 7.2e6 B -> 72 us, 76 at 1000
    np.testing.assert_allclose(rl.dense_block_us(G, SPEC, np.array([0, 1000])), [72.0, 76.0],
                               rtol=1e-12)
    assert rl.head_us(G, SPEC) == exact(10.0)          # 500 * 1000 weights = 1e6 B
    # a token: 2 MoE blocks + 1 dense block + the head
    got = rl.shared_decode_us(G, SPEC, np.array([0, 1000, 1_000_000]))
    np.testing.assert_allclose(got, [106.16, 118.16, 2 * 4012.08 + 4072.0 + 10.0], rtol=1e-12)
    # the same parts for any layer count: 5 MoE blocks and no dense block
    five = dataclasses.replace(G, n_layers=5, dense_layers=0)
    assert float(rl.shared_decode_us(five, SPEC, 0)) == exact(5 * 12.08 + 10.0)
    slow = PlatformSpec(**(SPEC.to_dict() | {"gpu_flops": 1e9}))
    # compute bound: 2 * 1.208e6 / 1e9 s + 7.2e6 / 1e9 + 1e6 / 1e9 = 10616 us
    assert float(rl.shared_decode_us(G, slow, 0)) == exact(10616.0)


def test_execution_split():
    assert rl.execution_split(Execution.PARALLEL, 0, 2) == (2, 0)
    assert rl.execution_split(Execution.WAIT_THEN_GPU, 1, 2) == (0, 1)
    assert rl.execution_split(Execution.READY_FIRST, 0, 2) == (0, 2)
    assert rl.execution_split(Execution.COST_SELECTED, 0, 2, 1) == (1, 1)
    with pytest.raises(ValueError):
        rl.execution_split(Execution.COST_SELECTED, 1, 2, 2)


# --- analytic profiles --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def analytic():
    return analytic_profile(G, BARE, cpu_threads=[1, 4], contexts=(0, 1000), gpu_shares=(100,))


def test_default_threads():
    assert default_threads(SPEC) == [1, 2, 4]
    assert default_threads(platform_spec("h100")) == [1, 2, 4, 8, 16, 32]


def test_analytic_profile_complete_and_marked(analytic, tmp_path):
    assert analytic.analytic is True
    assert "ANALYTIC" in analytic.notes
    assert analytic.platform["spec"] == BARE.to_dict()
    assert analytic.operating_points() == [(1, 100.0), (4, 100.0)]
    t = analytic.table
    n_req = len(required_keys(G.top_k))
    for threads in (1, 4):
        rows = t[t["cpu_threads"] == threads]
        # moe_block and dense_block at 2 contexts, the head; a prefetch beside each CPU-miss
        # count for each mutable residency
        assert len(rows) == n_req + 5 + 2 * G.top_k
        keys = {tuple(r) for r in rows[["kind", "name", "hits", "cpu", "staged", "count",
                                        "context"]].itertuples(index=False)}
        assert set(required_keys(G.top_k)) <= keys
        analytic.resolve(threads)  # raises if anything is missing
    assert (t["samples"] == 1).all()
    assert (t["p25_us"] == t["median_us"]).all() and (t["p75_us"] == t["median_us"]).all()

    path = tmp_path / "a.parquet"
    parquet_io.write_profile(analytic, path)
    back = parquet_io.read_profile(path)
    assert back.analytic is True
    meta = parquet_io.read_metadata(path)
    assert meta["analytic"] is True and meta["schema"] == "cope.profile/2"
    assert "ANALYTIC" in meta["notes"]
    assert back.platform == analytic.platform
    assert back.model == G
    cols = list(t.columns)
    np.testing.assert_array_equal(back.table[cols].to_numpy(), t[cols].to_numpy())


def test_analytic_schedule_rows_compose_the_roofline_work(analytic):
    """Without overheads the analytic rows are the roofline's work terms composed in each
    strategy's order: the CPU lane waits for the activation, staged experts for their copy, and
    wait-then-GPU for every copy before any GPU work."""
    t = analytic.table
    sched = t[t["kind"] == "schedule"]
    assert len(sched) == 2 * (3 * 3 + 6)  # per op: 3 h values x 3 executions + 6 cs splits
    for r in sched.itertuples(index=False):
        gpu = lambda n: rl.gpu_experts_us(G, BARE, n)  # noqa: E731
        cpu = rl.cpu_experts_us(G, BARE, r.cpu, r.cpu_threads) + (
            rl.act_copy_us(G, BARE) if r.cpu else 0.0)
        copy = rl.copy_experts_us(G, BARE, r.staged)
        want = (copy + gpu(r.hits + r.staged) if r.name == "wait_then_gpu"
                else max(gpu(r.hits), cpu, copy) + gpu(r.staged))
        assert r.median_us == exact(want), r


def test_analytic_hand_values(analytic):
    t = analytic.table
    # schedule at 1 thread: parallel h=0 runs both experts on one CPU thread after the
    # activation's copy: 1200 + 0.4
    assert row_us(t, 1, "schedule", "parallel", hits=0, cpu=2) == exact(1200.4)
    assert row_us(t, 4, "schedule", "parallel", hits=0, cpu=2) == exact(400.4)
    # wait-then-GPU copies both (600), then runs them (60); cost-selected 1 + 1: the copy
    # (300) outlasts the CPU lane (200.4), then the staged expert runs (30)
    assert row_us(t, 4, "schedule", "wait_then_gpu", hits=0, cpu=0) == exact(660.0)
    assert row_us(t, 4, "schedule", "cost_selected", hits=0, cpu=1) == exact(330.0)
    assert row_us(t, 4, "shared", "moe_block", context=0) == exact(12.08)
    assert row_us(t, 4, "shared", "moe_block", context=1000) == exact(16.08)
    assert row_us(t, 4, "shared", "dense_block", context=1000) == exact(76.0)
    assert row_us(t, 4, "shared", "head") == exact(10.0)
    # composed for the profiled geometry (2 MoE + 1 dense block) and for another layer count
    np.testing.assert_allclose(analytic.resolve(4).shared_us, [106.16, 118.16], rtol=1e-12)
    np.testing.assert_allclose(analytic.resolve(4, model=G.with_layers(6)).shared_us,
                               [6 * 12.08 + 82.0, 6 * 16.08 + 86.0], rtol=1e-12)
    assert row_us(t, 1, "layer", "cpu_layer") == exact(1200.4)
    assert row_us(t, 4, "layer", "cpu_layer") == exact(400.4)
    assert row_us(t, 4, "layer", "gpu_layer") == exact(60.0)
    for name in ("mutable_per_layer", "mutable_cross_layer"):
        assert row_us(t, 4, "prefetch", name, count=0) == 0.0
        # the copy (300) beyond the resident layer (60) and the next block's shared work at
        # context 4096 (12.08 + 4.096 * 4 = 28.464)
        assert row_us(t, 4, "prefetch", name, count=1) == exact(300.0 - 60.0 - 28.464)
    for n in range(3):
        assert row_us(t, 4, "atomic", "gpu_expert", count=n) == exact(30.0 * n)
        assert row_us(t, 4, "atomic", "staged_gpu_expert", count=n) == exact(30.0 * n)
        assert row_us(t, 1, "atomic", "cpu_expert", count=n) == exact(600.0 * n)
        assert row_us(t, 4, "atomic", "cpu_expert", count=n) == exact(200.0 * n)
        assert row_us(t, 4, "atomic", "stage", count=n) == exact(300.0 * n)
    assert row_us(t, 4, "atomic", "act_copy", count=1) == exact(0.4)
    assert row_us(t, 4, "atomic", "prefetch", count=1) == exact(300.0)
    assert row_us(t, 4, "atomic", "sync", count=1) == 0.0
    assert row_us(t, 4, "atomic", "merge", count=1) == 0.0


# --- HRM ----------------------------------------------------------------------------------------
def test_hrm_costs_by_hand():
    lc = hrm_costs(G, SPEC, 4, np.array([1, 1, 0]))
    assert lc.estimator == "hrm"
    np.testing.assert_allclose(lc.moe[P], [400.0, 200.0, 60.0], rtol=1e-12)
    np.testing.assert_allclose(lc.moe[W], [600.0, 300.0, 60.0], rtol=1e-12)
    np.testing.assert_allclose(lc.moe[C], [300.4, 200.0, 60.0], rtol=1e-12)
    # the roofline cannot tell waiting from overlapping: both are max(copy, GPU)
    np.testing.assert_array_equal(lc.moe[W], lc.moe[R])
    assert lc.cpu_layer == exact(400.0) and lc.gpu_layer == exact(60.0)
    for r in ("mutable_per_layer", "mutable_cross_layer"):
        assert lc.pf_step[r] == 0.0
        # a prefetch adds its copy where the copy lane becomes the longest: h=2 -> 300 - 60;
        # parallel h=0: copy 300.4 < CPU 400 -> free; wait h=0: copy 900 vs 600 -> 300
        assert lc.pf_insert[r][P].tolist() == pytest.approx([0.0, 100.4, 240.0])
        assert lc.pf_insert[r][W].tolist() == pytest.approx([300.0, 300.0, 240.0])
    np.testing.assert_allclose(lc.shared_at(np.array([0, 1000])), [106.16, 118.16], rtol=1e-12)


def test_hrm_zero_experts_cost_zero():
    # nothing on any lane costs nothing: no fixed overheads in the roofline
    assert rl.layer_us(G, SPEC, 4, 0, 0, 0) == 0.0
    assert rl.layer_us(G, SPEC, 4, 0, 0, 0, prefetched=0) == 0.0
    # with top_k = 1 and the expert resident, HRM charges only the GPU lane, whatever execution
    one = ModelGeometry(**(G.to_dict() | {"top_k": 1}))
    lc = hrm_costs(one, SPEC, 4, np.array([0, 0]))
    assert lc.moe[:, 1].tolist() == pytest.approx([GPU_US] * 4)
    # and the misses alone (h = 0): CPU 200, copy 300, copy 300, cost_selected c=0 -> copy 300
    assert lc.moe[:, 0].tolist() == pytest.approx([200.0, 300.0, 300.0, 300.0])


def test_hrm_uses_profiles_split(analytic):
    op = analytic.resolve(4)
    split, _ = cost_selected_split(op)
    lc = layer_costs("hrm", op, G, SPEC)
    assert lc.split.tolist() == split.tolist()
    assert layer_costs("atomic", op, G).split.tolist() == split.tolist()
    assert layer_costs("cope", op, G).split.tolist() == split.tolist()


def test_layer_costs_errors(analytic):
    op = analytic.resolve(4)
    with pytest.raises(CopeInputError, match="spec"):
        layer_costs("hrm", op, G, None)
    with pytest.raises(CopeInputError, match="estimator"):
        layer_costs("magic", op, G)


def test_analytic_profile_cope_equals_atomic_on_fixed(analytic):
    """Without overheads an analytic profile's schedule rows are its atomic rows composed in
    each strategy's order, so COPE = the atomic-op simulation for fixed residency (no prefetch
    costs involved); HRM's perfect overlap is never slower."""
    tr = _round_trace()
    got = {est: predict(tr, analytic, [0, 1, 2, 4], fill_by_id=True, estimator=est).set_index(
        ["experts_per_layer", "candidate"]) for est in ("cope", "atomic", "hrm")}
    for K in (0, 1, 2, 4):
        for e in ("parallel", "wait_then_gpu", "ready_first", "cost_selected"):
            key = (K, f"fixed/{e}")
            assert got["cope"].loc[key, "experts_us"] == \
                pytest.approx(got["atomic"].loc[key, "experts_us"])
            assert got["hrm"].loc[key, "experts_us"] <= got["cope"].loc[key, "experts_us"] + 1e-9


# --- atomic-op simulation -----------------------------------------------------------------------
ATOMIC = hand_atomic(prefetch=9.0)
# cost_selected schedule rows: h=0 c=0/1 tie at 30 (-> c=1), h=1 c=0 cheaper (-> c=0)
CS = {ProfileKey("schedule", "cost_selected", hits=h, cpu=c, staged=m): v
      for (h, c, m), v in {(0, 0, 2): 30.0, (0, 1, 1): 30.0, (0, 2, 0): 45.0, (1, 0, 1): 12.0,
                           (1, 1, 0): 14.0}.items()}


@pytest.fixture(scope="module")
def atomic_profile():
    return tiny_profile(ATOMIC | CS)


def test_cost_selected_split_ties_to_larger_c(atomic_profile):
    split, cost = cost_selected_split(atomic_profile.resolve())
    assert split.tolist() == [1, 0, 0]
    assert cost.tolist() == [30.0, 12.0, 2.0]  # h=2: the default 10*0 + 2
    # all three splits equal at h=0 -> the largest c, 2
    even = tiny_profile({ProfileKey("schedule", "cost_selected", hits=0, cpu=c, staged=2 - c): 7.0
                         for c in range(3)})
    split, cost = cost_selected_split(even.resolve())
    assert split[0] == 2 and cost[0] == 7.0


def test_atomic_formulas_by_hand(atomic_profile):
    lc = atomic_costs(atomic_profile.resolve())
    # R = [.5, 3, 7], C = [1, 20, 45], S = [0, 11, 25], G = [0, 2, 5], A = 8, F + M = .75
    # h=0 (m=2): parallel max(.5, 45+8) + .75; wait 25+.5+5+.75; ready max(.5, 25)+5+.75;
    #            cost_selected (c=1, u=1) max(.5, 20+8, 11) + 2 + .75
    # h=1 (m=1): parallel max(3, 20+8)+.75; wait 11+3+2+.75; ready max(3, 11)+2+.75;
    #            cost_selected (c=0, u=1) max(3, 1+8, 11) + 2 + .75
    # h=2 (m=0): parallel max(7, C[0]+A = 9)+.75; wait 0+7+0+.75; ready max(7, 0)+0+.75;
    #            cost_selected (0, 0) max(7, 9, 0) + 0 + .75   (zero-count terms included)
    assert lc.moe[P].tolist() == [53.75, 28.75, 9.75]
    assert lc.moe[W].tolist() == [31.25, 16.75, 7.75]
    assert lc.moe[R].tolist() == [30.75, 13.75, 7.75]
    assert lc.moe[C].tolist() == [30.75, 13.75, 9.75]
    assert lc.cpu_layer == 45.0 + 8.0 + 0.5 + 0.25
    assert lc.gpu_layer == 7.0 + 0.25
    for r in ("mutable_per_layer", "mutable_cross_layer"):
        assert lc.pf_step[r] == 0.0
        assert (lc.pf_insert[r] == 9.0).all()


def test_cope_costs_from_same_profile(atomic_profile):
    lc = cope_costs(atomic_profile.resolve())
    # default schedule cost at 8 threads: 10 per miss + hits + 0.5 per CPU miss
    assert lc.moe[P].tolist() == [21.0, 11.5, 2.0]
    assert lc.moe[W].tolist() == [20.0, 11.0, 2.0]
    assert lc.moe[C].tolist() == [30.0, 12.0, 2.0]
    # default prefetch 2 + 3q: 2 at every step, 3 more per inserted prefetch
    assert lc.pf_step["mutable_per_layer"] == 2.0
    assert (lc.pf_insert["mutable_cross_layer"] == 3.0).all()


@pytest.mark.parametrize("K,expected", [
    # shared: contexts 10..21 clamp to the 128 row, 100 + 128/128 = 101
    (6, {"fixed/parallel": 101 + 3 * 9.75, "fixed/wait_then_gpu": 101 + 3 * 7.75,
         "mutable_cross_layer/cost_selected": 101 + 3 * 9.75,
         "layer_partition": 101 + 3 * 7.25}),          # N_gpu = 3
    (0, {"fixed/parallel": 101 + 3 * 53.75, "mutable_per_layer/ready_first": 101 + 3 * 30.75,
         "mutable_cross_layer/wait_then_gpu": 101 + 3 * 31.25,
         "layer_partition": 101 + 3 * 53.75}),         # N_gpu = 0
])
def test_atomic_tpot_at_the_ends(atomic_profile, K, expected):
    df = predict(tiny_trace(), atomic_profile, K, estimator="atomic",
                 fill_by_id=True).set_index("candidate")
    for cid, value in expected.items():
        assert df.loc[cid, "prompt_tpot_us"].tolist() == [value, value], cid
        assert df.loc[cid, "prefetches"] == 0


# --- platform catalog and spec files ------------------------------------------------------------
GB = 1e9


GIB = 1024**3


@pytest.mark.parametrize("name,bandwidth,flops,vram,link", [
    ("a100-80gb", 2039, 312e12, 80 * GIB, "pcie4"),
    ("h100", 3350, 989e12, 80 * GIB, "pcie5"),
    ("h200", 4800, 989e12, 141 * GB, "pcie5"),
    ("rtx4090", 1008, 165.2e12, 24 * GIB, "pcie4"),
    ("rtx5090", 1792, 209.5e12, 32 * GIB, "pcie5"),
    ("l40s", 864, 362e12, 48 * GIB, "pcie4"),
])
def test_gpu_catalog(name, bandwidth, flops, vram, link):
    g = GPUS[name]
    assert g.bandwidth == pytest.approx(bandwidth * GB)
    assert g.flops == pytest.approx(flops, rel=1e-3)
    assert g.vram_bytes == pytest.approx(vram)
    s = platform_spec(name)
    assert s.gpu_bandwidth == g.bandwidth and s.link_name == link
    assert s.link_bandwidth == LINKS[link].bandwidth
    assert s.source == "published"


def test_catalog_sizes_and_links():
    assert set(GPUS) == {"a100-80gb", "h100", "h200", "rtx4090", "rtx5090", "l40s"}
    assert set(LINKS) == {"pcie4", "pcie5"}
    assert LINKS["pcie4"].bandwidth == pytest.approx(31.5 * GB)
    assert LINKS["pcie5"].bandwidth == pytest.approx(63.0 * GB)
    assert platform_spec("RTX4090", link="pcie5").link_bandwidth == pytest.approx(63 * GB)


@pytest.mark.parametrize("kwargs,needle", [
    ({"gpu": "voodoo5"}, "voodoo5"),
    ({"gpu": "h100", "link": "nvlink9"}, "nvlink9"),
    ({"gpu": "h100", "cpu": "z80"}, "z80"),
])
def test_platform_spec_unknown(kwargs, needle):
    with pytest.raises(CopeInputError, match=needle):
        platform_spec(kwargs.pop("gpu"), **kwargs)


def _spec_file(tmp_path, data, name="spec.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_load_spec_accepts_user_json(tmp_path):
    data = SPEC.to_dict()
    data.pop("source")
    spec = load_spec(_spec_file(tmp_path, data))
    assert spec.source == "user"
    assert spec.gpu_bandwidth == 1e11 and spec.cpu_cores == 4
    assert resolve_platform(str(tmp_path / "spec.json")) == spec


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.pop("gpu_flops"), "gpu_flops"),
    (lambda d: d.pop("link_bandwidth"), "link_bandwidth"),
    (lambda d: d.update(gpu_tflops=5), "gpu_tflops"),
    (lambda d: d.update(gpu_bandwidth=0), "gpu_bandwidth"),
    (lambda d: d.update(cpu_cores=-2), "cpu_cores"),
    (lambda d: d.update(link_bandwidth="fast"), "link_bandwidth"),
])
def test_load_spec_rejects(tmp_path, edit, needle):
    data = SPEC.to_dict()
    edit(data)
    path = _spec_file(tmp_path, data)
    with pytest.raises(CopeInputError) as info:
        load_spec(path)
    msg = str(info.value)
    assert needle in msg and str(path) in msg and "\n" not in msg


@pytest.mark.parametrize("text", ["[1, 2]", "{nope", ""])
def test_load_spec_not_an_object(tmp_path, text):
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(CopeInputError, match="s.json"):
        load_spec(path)


def test_load_spec_missing_file(tmp_path):
    with pytest.raises(CopeInputError, match="not found"):
        load_spec(tmp_path / "none.json")


@pytest.mark.parametrize("value", [2.5, True])
def test_load_spec_rejects_non_integer_cores(tmp_path, value):
    data = SPEC.to_dict() | {"cpu_cores": value}
    with pytest.raises(CopeInputError, match="cpu_cores"):
        load_spec(_spec_file(tmp_path, data))


# --- HRM through the CLI with a user spec -------------------------------------------------------
def _round_trace() -> Trace:
    """One prompt, two tokens at context 1000 (shared roofline cost 112 us)."""
    routed = np.array([[[0, 1], [2, 3]], [[1, 2], [0, 3]]], np.int16)
    return Trace(model=G, prompt_ids=np.array([0], np.int32), prompt_start=np.array([0, 2]),
                 context=np.array([1000, 1000], np.int32), routed=routed,
                 predicted=np.empty((2, 2, 0), np.int16))


def test_cli_predict_hrm_with_user_spec(tmp_path, capsys):
    trace, prof = tmp_path / "t.parquet", tmp_path / "p.parquet"
    parquet_io.write_trace(_round_trace(), trace)
    # the profile's own spec is an H100; the user's spec must replace it
    parquet_io.write_profile(analytic_profile(G, platform_spec("h100"), cpu_threads=[4]), prof)
    data = SPEC.to_dict()
    data.pop("source")
    spec = _spec_file(tmp_path, data, "round.json")
    code = main(["predict", "--trace", str(trace), "--profile", str(prof), "-K", "0,4",
                 "--estimator", "hrm", "--spec", str(spec), "--fill-by-id", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = {(d["experts_per_layer"], d["candidate"]): d["tpot_us"] for d in json.loads(out)}
    # K=0: every layer has h=0 at 4 threads; shared 118.16 us per token
    assert got[(0, "fixed/parallel")] == exact(118.16 + 2 * 400.0)
    assert got[(0, "fixed/wait_then_gpu")] == exact(118.16 + 2 * 600.0)
    assert got[(0, "fixed/ready_first")] == exact(118.16 + 2 * 600.0)
    assert got[(0, "layer_partition")] == exact(118.16 + 2 * 400.0)
    # K=E: everything resident, 2 layers of 2 GPU experts
    for cid in ("fixed/parallel", "mutable_per_layer/cost_selected", "layer_partition"):
        assert got[(4, cid)] == exact(118.16 + 2 * 60.0)
    # and it is what the library computes with the loaded spec
    lib = predict(_round_trace(), parquet_io.read_profile(prof), [0, 4], fill_by_id=True,
                  estimator="hrm", spec=load_spec(spec))
    for r in lib.itertuples(index=False):
        assert got[(r.experts_per_layer, r.candidate)] == r.tpot_us
    # without --spec the profile's H100 numbers are used: a different answer
    code = main(["predict", "--trace", str(trace), "--profile", str(prof), "-K", "0",
                 "--estimator", "hrm", "--fill-by-id", "--json"])
    h100 = {d["candidate"]: d["tpot_us"] for d in json.loads(capsys.readouterr().out)}
    assert code == 0 and h100["fixed/parallel"] != got[(0, "fixed/parallel")]


def test_cli_profile_from_user_spec(tmp_path, capsys):
    data = SPEC.to_dict()
    data.pop("source")
    spec = _spec_file(tmp_path, data, "round.json")
    out_path = tmp_path / "p.parquet"
    code = main(["profile", "--analytic", "--gpu", str(spec), "--model", "olmoe-1b-7b", "--threads",
                 "1,4", "-o", str(out_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "ANALYTIC" in out
    prof = parquet_io.read_profile(out_path)
    assert prof.analytic and prof.platform["spec"]["source"] == "user"
    assert prof.platform["spec"]["gpu_bandwidth"] == 1e11
    assert prof.operating_points() == [(t, share) for t in (1, 4)
                                       for share in (20.0, 50.0, 80.0, 100.0)]


def test_no_prefetch_cost_when_every_expert_is_resident(atomic_profile):
    """At K = E nothing can be prefetched: the mutable residencies pay no per-layer step and
    equal the fixed residency; one expert fewer, they pay the step (2 at each of L - 1 = 2
    layers) and 3 per inserted prefetch (the profile's default 2 + 3q)."""
    trace = tiny_trace()
    E, L = trace.model.n_experts, trace.model.n_layers
    full = predict(trace, atomic_profile, E, estimator="cope", fill_by_id=True
                   ).set_index("candidate")
    for r in ("mutable_per_layer", "mutable_cross_layer"):
        for e in ("parallel", "cost_selected"):
            row = full.loc[f"{r}/{e}"]
            assert row.prefetch_us == 0.0 and row.prefetches == 0
            assert row.tpot_us == full.loc[f"fixed/{e}", "tpot_us"]
    short = predict(trace, atomic_profile, E - 1, estimator="cope", fill_by_id=True
                    ).set_index("candidate")
    tokens = trace.tokens_per_prompt
    for r in ("mutable_per_layer", "mutable_cross_layer"):
        row = short.loc[f"{r}/parallel"]
        expected = np.mean((L - 1) * 2.0 + 3.0 * row.prompt_prefetches / tokens)
        assert row.prefetch_us == pytest.approx(expected, rel=1e-12)
        assert row.prefetch_us >= (L - 1) * 2.0
