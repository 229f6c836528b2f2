"""The execution mechanisms on torch (cope_core.mechanisms): thread budgets, the emulated
accelerator's streams and events, synthetic weights and slot pools, the four execution strategies
against a dense reference, the residency mechanisms against the numba replay, and stable timing."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from tiny import tiny_geometry, tiny_trace

from cope_core.errors import CopeInputError
from cope_core.geometry import ModelGeometry
from cope_core.matrix import Execution, Residency
from cope_core.mechanisms import (
    Accelerator,
    Rig,
    StopRule,
    Timing,
    host_threads,
    make_state,
    model_dtype,
    pin_thread_budget,
    prefetch_step,
    run_cpu_layer,
    run_execution,
    run_gpu_layer,
    until_stable,
)
from cope_core.mechanisms.experts import TOLERANCE, close_to_reference, dense_reference
from cope_core.mechanisms.threads import per_thread_budgets
from cope_core.mechanisms.timing import round_robin
from cope_core.mechanisms.weights import Filler
from cope_core.profile.data import required_keys
from cope_core.replay.engine import replay
from cope_core.trace.data import fill_order
from cope_core.trace.synth import synthesize

G = tiny_geometry()


@pytest.fixture(scope="module")
def acc():
    with host_threads(1), Accelerator("cpu", 1) as a:
        yield a


@pytest.fixture(scope="module")
def rig32(acc):
    return Rig.build(acc, G, torch.float32, pool_slots=6, max_context=32)


# --- thread budgets -----------------------------------------------------------------------------
@pytest.mark.skipif(not per_thread_budgets(), reason="needs torch's OpenMP backend")
def test_worker_keeps_its_own_thread_budget():
    seen = {}
    pinned, go = threading.Event(), threading.Event()

    def worker():
        pin_thread_budget(1)
        pinned.set()
        go.wait()
        torch.ones(1000).sum()           # a parallel op after the host changed its budget
        seen["worker"] = torch.get_num_threads()

    t = threading.Thread(target=worker)
    t.start()
    pinned.wait()
    with host_threads(2):
        go.set()
        t.join()
        assert torch.get_num_threads() == 2
    assert seen["worker"] == 1


def test_pin_thread_budget_rejects_bad_counts():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CopeInputError):
            pin_thread_budget(bad)


# --- the emulated accelerator -------------------------------------------------------------------
def test_stream_runs_in_order_and_events_fire(acc):
    out = []
    for i in range(5):
        acc.compute.submit(out.append, i)
    ev = acc.compute.record()
    ev.synchronize()
    assert out == [0, 1, 2, 3, 4] and ev.query()


def test_stream_wait_orders_after_another_stream(acc):
    state = {"copied": False, "seen": None}

    def slow_copy():
        time.sleep(0.05)
        state["copied"] = True

    acc.copy.submit(slow_copy)
    landed = acc.copy.record()
    acc.compute.wait(landed)
    acc.compute.submit(lambda: state.__setitem__("seen", state["copied"]))
    acc.compute.synchronize()
    assert state["seen"] is True


def test_worker_failure_surfaces_on_synchronize():
    with host_threads(1), Accelerator("cpu", 1) as a:
        a.compute.submit(lambda: 1 / 0)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            a.compute.synchronize()


def test_accelerator_describes_its_platform(acc):
    d = acc.describe()
    assert d["accelerator"] == "emulated" and d["gpu"] == "emulated"
    assert d["accel_threads"] == 1 and d["torch"] == torch.__version__ and d["cpu_cores"] >= 1


def test_accelerator_rejects_bad_device_and_threads():
    with pytest.raises(CopeInputError, match="--device"):
        Accelerator("tpu")
    with pytest.raises(CopeInputError, match="--accel-threads"):
        Accelerator("cpu", 0)
    if not torch.cuda.is_available():
        with pytest.raises(CopeInputError, match="no CUDA device"):
            Accelerator("cuda")


# --- weights and slots --------------------------------------------------------------------------
def test_filler_is_deterministic_distinct_and_scaled():
    a, b = torch.empty(5000), torch.empty(5000)
    Filler(3).fill(a, 7, 100)
    Filler(3).fill(b, 7, 100)
    assert torch.equal(a, b)
    Filler(3).fill(b, 8, 100)
    assert not torch.allclose(a, b)
    big = Filler(0).fill(torch.empty(200_000), 1, 400)
    assert float(big.std()) == pytest.approx(1 / 20, rel=0.05)


def test_model_dtype():
    assert model_dtype(G) is torch.bfloat16
    assert model_dtype(G, "float16") is torch.float16
    with pytest.raises(CopeInputError, match="dtype_bytes=2"):
        model_dtype(G, "float32")
    one = ModelGeometry(**(G.to_dict() | {"dtype_bytes": 1}))
    with pytest.raises(CopeInputError, match="1-byte"):
        model_dtype(one)


def test_store_experts_differ_and_pool_loads_only_changes(rig32):
    st, pool = rig32.store, rig32.pool
    assert not torch.equal(st.expert(0, 1), st.expert(0, 2))
    assert not torch.equal(st.expert(0, 1), st.expert(1, 1))
    assert pool.load(st, {0: (0, 1), 1: (2, 5)}) == 2
    assert torch.equal(pool.slot(1), st.expert(2, 5))
    assert pool.load(st, {0: (0, 1), 1: (2, 4)}) == 1   # slot 0 already holds (0, 1)
    assert torch.equal(pool.slot(1), st.expert(2, 4))


# --- strategies against the dense reference ---------------------------------------------------
def _set_input(rig, seed):
    gen = torch.Generator().manual_seed(seed)
    rig.io.x.copy_(torch.randn(1, G.hidden, generator=gen).to(rig.dtype))
    rig.io.w.copy_(torch.softmax(torch.randn(G.top_k, generator=gen), 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_schedule_equals_the_dense_reference(acc, dtype):
    rig = Rig.build(acc, G, dtype, pool_slots=6, max_context=8)
    layer = 1
    rig.pool.load(rig.store, {s: (layer, s) for s in range(6)})   # slot s holds expert s
    for i, key in enumerate(k for k in required_keys(G.top_k) if k[0] == "schedule"):
        _, name, h, c, u = key[:5]
        _set_input(rig, i)
        routed = [(3 * i + j) % G.n_experts for j in range(G.top_k)]   # distinct ids
        hits = [(j, routed[j]) for j in range(h)]
        misses = [(j, routed[j]) for j in range(h, G.top_k)]
        run_execution(rig.runner, Execution(name), layer, hits, misses, c)
        ref = dense_reference(rig.io.x, rig.io.w, [rig.store.expert(layer, e) for e in routed],
                              G.hidden, G.expert_intermediate)
        assert close_to_reference(rig.io.out, ref, dtype), key
        if dtype is torch.float32:
            assert torch.allclose(rig.io.out, ref, rtol=1e-5, atol=1e-6), key


def test_wrong_slot_is_caught_by_the_reference(rig32):
    """The check has teeth: reading another expert's slot is far outside the tolerance."""
    rig32.pool.load(rig32.store, {0: (0, 0), 1: (0, 1)})
    _set_input(rig32, 99)
    run_execution(rig32.runner, Execution.PARALLEL, 0, [(0, 1), (1, 0)], [])   # swapped slots
    ref = dense_reference(rig32.io.x, rig32.io.w, [rig32.store.expert(0, 0),
                                                   rig32.store.expert(0, 1)],
                          G.hidden, G.expert_intermediate)
    assert not close_to_reference(rig32.io.out, ref, torch.bfloat16)


def test_layer_partition_layers_equal_the_reference(rig32):
    _set_input(rig32, 5)
    routed = [4, 2]
    ref = dense_reference(rig32.io.x, rig32.io.w, [rig32.store.expert(2, e) for e in routed],
                          G.hidden, G.expert_intermediate)
    run_cpu_layer(rig32.runner, 2, routed)
    assert torch.allclose(rig32.io.out, ref, rtol=1e-5, atol=1e-6)
    rig32.pool.load(rig32.store, {4: (2, 4), 5: (2, 2)})
    run_gpu_layer(rig32.runner, [4, 5])
    assert torch.allclose(rig32.io.out, ref, rtol=1e-5, atol=1e-6)


def test_cost_selected_rejects_impossible_split(rig32):
    with pytest.raises(ValueError):
        run_execution(rig32.runner, Execution.COST_SELECTED, 0, [], [(0, 1)], 2)


def test_tolerances_cover_every_model_dtype():
    assert set(TOLERANCE) == {torch.bfloat16, torch.float16, torch.float32}


# --- residency mechanisms against the replay ----------------------------------------------------
def _simulate(trace, order, residency, K):
    """Drive a residency state over the trace as the executor does (no torch work)."""
    g = trace.model
    hist = np.zeros((trace.n_prompts, g.n_layers, g.top_k + 1), np.int64)
    ins = np.zeros_like(hist)
    st = make_state(residency, order, K)
    for p in range(trace.n_prompts):
        st.reset()
        for t in range(trace.prompt_start[p], trace.prompt_start[p + 1]):
            for l in range(g.n_layers):
                hits, _ = st.lookup(l, trace.routed[t, l])
                hist[p, l, len(hits)] += 1
                if residency is not Residency.FIXED and st.prefetch(l, trace.predicted[t, l]):
                    ins[p, l, len(hits)] += 1
    return hist, ins


SMALL = ModelGeometry(name="small", n_layers=4, n_experts=8, top_k=2, hidden=16,
                      expert_intermediate=8, dtype_bytes=2, n_shared_experts=0, dense_layers=0,
                      n_heads=2, n_kv_heads=1, head_dim=8, vocab=32, non_expert_bytes=1000)


@pytest.mark.parametrize("residency", list(Residency))
def test_states_match_replay_at_every_k(residency):
    trace = synthesize(SMALL, prompts=3, tokens=40, seed=4, predictor_accuracy=0.6)
    order = fill_order(synthesize(SMALL, prompts=2, tokens=30, seed=5))
    for K in range(SMALL.n_experts + 1):
        hist, ins = _simulate(trace, order, residency, K)
        rc = replay(trace, order, residency, K)
        assert np.array_equal(hist, rc.hist[0]), (residency, K)
        assert np.array_equal(ins, rc.ins[0]), (residency, K)


def test_states_match_replay_on_the_tiny_trace():
    tr = tiny_trace()
    order = fill_order(tr)
    for residency in Residency:
        for K in range(G.n_experts + 1):
            hist, ins = _simulate(tr, order, residency, K)
            rc = replay(tr, order, residency, K)
            assert np.array_equal(hist, rc.hist[0]) and np.array_equal(ins, rc.ins[0])


def test_per_layer_evicts_lru_and_cross_layer_breaks_ties_by_lower_layer():
    order = np.tile(np.arange(4), (3, 1))           # rank r = expert r in every layer
    st = make_state(Residency.MUTABLE_PER_LAYER, order, 2)   # experts 0, 1 resident
    st.lookup(1, [1, 3])                              # hit on 1 -> expert 0 is now LRU
    assert st.prefetch(0, [1, 2]) == (2, 2)           # 1 resident: skip; 2 replaces 0 (slot 2)
    assert st.slot_of[1].tolist() == [-1, 3, 2, -1]
    x = make_state(Residency.MUTABLE_CROSS_LAYER, order, 2)
    # every layer's rank-1 expert has stamp -2: the victim is layer 0's (not the executing 1)
    assert x.prefetch(1, [3]) == (1, 3)
    assert x.slot_of[0, 1] == -1 and x.slot_of[2, 3] == 1
    assert make_state(Residency.FIXED, order, 2).prefetch(0, [3]) is None
    assert make_state(Residency.MUTABLE_PER_LAYER, order, 4).prefetch(0, [3]) is None  # K = E


def test_prefetch_step_moves_the_weights(acc):
    rig = Rig.build(acc, G, torch.float32, pool_slots=G.n_layers * 2, max_context=8)
    order = np.tile(np.arange(G.n_experts), (G.n_layers, 1))
    st = make_state(Residency.MUTABLE_PER_LAYER, order, 2)
    rig.pool.load(rig.store, st.assignment())
    assert prefetch_step(rig.runner, rig.shared, st, 0, [5]) is True
    rig.runner.resident([])                          # waits for the pending copy
    rig.runner.finish()
    for s, (l, e) in st.assignment().items():
        assert torch.equal(rig.pool.slot(s), rig.store.expert(l, e)), (s, l, e)
    assert prefetch_step(rig.runner, rig.shared, st, 0, [5]) is False   # now resident


# --- timing ---------------------------------------------------------------------------------------
def test_timing_statistics_by_hand():
    t = Timing((4.0, 1.0, 3.0, 2.0, 5.0))
    assert (t.median_us, t.p25_us, t.p75_us) == (3.0, 2.0, 4.0)
    assert Timing((-2.0, 1.0)).clamped().samples_us == (0.0, 1.0)


def test_until_stable_stops_when_settled_or_capped():
    calls = []

    def const():
        calls.append(1)
        return 10.0
    t = until_stable(const, StopRule(warmup=2, min_samples=5, max_samples=50, batch=3))
    assert len(t.samples_us) == 5 and len(calls) == 7   # warm-up samples are discarded
    seq = iter(range(1, 1000))
    t = until_stable(lambda: float(next(seq)) * 100,
                     StopRule(warmup=0, min_samples=3, max_samples=12, batch=3, rel_tol=0.01,
                              abs_tol_us=0.0))
    assert len(t.samples_us) == 12                       # a drifting median never settles


def test_round_robin_interleaves_and_stops_each_by_its_rule():
    order = []

    def sampler(i, value):
        def s():
            order.append(i)
            return value
        return s
    rules = [StopRule(warmup=0, min_samples=3, max_samples=50, batch=2),
             StopRule(warmup=0, min_samples=6, max_samples=50, batch=2)]
    finished = []
    a, b = round_robin([sampler(0, 5.0), sampler(1, 7.0)], rules, budget_seconds=60,
                       done=finished.append)
    assert len(a.samples_us) == 3 and len(b.samples_us) == 6 and finished == [0, 1]
    assert order[:6] == [0, 1, 0, 1, 0, 1]          # in turns while both run


def test_round_robin_min_seconds_and_budget(sleepless_clock):
    clock = sleepless_clock("cope_core.mechanisms.timing")    # a sample takes 10 ms, exactly

    def slow():
        clock.advance(0.01)
        return 1.0
    rule = StopRule(warmup=0, min_samples=3, max_samples=1000, batch=2)
    t, = round_robin([slow], [rule], budget_seconds=60, min_seconds=0.15)
    # a settled median waits for min_seconds: the 16th sample starts at 0.15 s, and the median
    # is checked every 2 samples from the 3rd: the 17th ends it
    assert len(t.samples_us) == 17
    capped = StopRule(warmup=0, min_samples=3, max_samples=6, batch=2)
    t, = round_robin([slow], [capped], budget_seconds=60, min_seconds=10)
    assert len(t.samples_us) == 6                   # max_samples always ends it
    noisy = iter(range(1, 10_000))

    def unsettled():
        clock.advance(0.001)
        return float(next(noisy)) ** 2
    t, = round_robin([unsettled], [rule], budget_seconds=0.0)
    assert len(t.samples_us) == 3                   # over budget: stop at 3 samples


class _Recorder:
    """Stands in for ExpertRunner and records the effective steps a strategy takes."""

    def __init__(self):
        self.calls = []

    def _rec(self, name, *args):
        self.calls.append((name, *args))
        return name

    def begin(self):
        self._rec("begin")

    def to_host(self):
        return self._rec("to_host")

    def stage(self, layer, staged):
        if staged:
            self._rec("stage", layer, tuple(staged))
        return [f"ev{i}" for i in range(len(staged))]

    def resident(self, hits):
        self._rec("resident", tuple(hits))

    def staged(self, staged, events, each):
        if staged:
            self._rec("staged", tuple(staged), tuple(events), each)

    def side(self):
        self._rec("side")

    def host(self, layer, cpu, ready):
        self._rec("host", layer, tuple(cpu), ready)

    def finish(self):
        self._rec("finish")

    class acc:  # noqa: N801 - mimics runner.acc.compute.wait
        class compute:  # noqa: N801
            @staticmethod
            def wait(event):
                pass


def _steps(fn, *args):
    r = _Recorder()
    fn(r, *args)
    return r.calls


def test_identical_schedules_are_the_same_steps():
    """What the profiler's same_schedule relies on: cost_selected at c = m is parallel, at
    c = 0 ready_first, and with no misses every strategy is parallel."""
    from cope_core.mechanisms.execution import (
        run_cost_selected,
        run_parallel,
        run_ready_first,
        run_wait_then_gpu,
    )
    from cope_core.profile.data import same_schedule
    hits, misses = [(0, 4)], [(1, 7), (2, 9)]
    assert _steps(run_cost_selected, 0, hits, misses, 2) == _steps(run_parallel, 0, hits, misses)
    assert _steps(run_cost_selected, 0, hits, misses, 0) == _steps(run_ready_first, 0, hits,
                                                                    misses)
    assert _steps(run_cost_selected, 0, hits, misses, 1) != _steps(run_parallel, 0, hits, misses)
    full = [(0, 4), (1, 5), (2, 6)]
    ref = _steps(run_parallel, 0, full, [])
    for fn in (run_wait_then_gpu, run_ready_first):
        assert _steps(fn, 0, full, []) == ref
    assert _steps(run_cost_selected, 0, full, [], 0) == ref
    assert _steps(run_wait_then_gpu, 0, hits, misses) != _steps(run_ready_first, 0, hits, misses)
    k = 3
    assert same_schedule(("schedule", "cost_selected", 1, 2, 0, -1, -1), k) == \
        ("schedule", "parallel", 1, 2, 0, -1, -1)
    assert same_schedule(("schedule", "cost_selected", 1, 0, 2, -1, -1), k) == \
        ("schedule", "ready_first", 1, 0, 2, -1, -1)
    assert same_schedule(("schedule", "wait_then_gpu", 3, 0, 0, -1, -1), k) == \
        ("schedule", "parallel", 3, 0, 0, -1, -1)
    for row in (("schedule", "wait_then_gpu", 1, 0, 2, -1, -1),
                ("schedule", "cost_selected", 1, 1, 1, -1, -1), ("layer", "cpu_layer", -1, -1,
                                                                 -1, -1, -1)):
        assert same_schedule(row, k) == row
