"""The llama.cpp cache replay's shortcuts (cope_core/llamacpp/cache/_cache_plan.py, issue 40):
the counts
of a configuration that never evicts are summed from one pass over the trace instead of
replayed, and the replayed ones are dealt to the threads by their work. Both must give exactly
the exhaustive replay's integers (every configuration through the kernel), for every rule,
reading and cache start, and the searches built on them exactly the same frames."""
from __future__ import annotations

import numpy as np
import pytest

from cope_core import parquet_io
from cope_core.geometry import GIB
from cope_core.llamacpp import search_cache
from cope_core.llamacpp.cache import _cache_kernels, moe_cache
from cope_core.llamacpp.cache._cache_plan import buckets, distinct_per_layer, first_use_counts
from cope_core.llamacpp.cache.moe_cache import (
    READINGS,
    TUNER_SHARES,
    CacheConfig,
    CacheVersion,
    cache_layout,
    cache_mib_for_bytes,
    replay_cache,
)

EX = "data/examples/"
LRU, CLS = CacheVersion.LRU, CacheVersion.CLASS_LRU


@pytest.fixture
def exhaustive(monkeypatch):
    """Within the test: no configuration counts as never evicting, so the kernel replays all."""
    def every_config_replayed():
        monkeypatch.setattr(moe_cache, "distinct_per_layer",
                            lambda routed, n_experts: np.full(routed.shape[1], 1 << 40))
    return every_config_replayed


@pytest.fixture
def replayed(monkeypatch):
    """The configurations the kernel replays, per call."""
    seen: list[list[int]] = []
    kernel = _cache_kernels._cache_buckets

    def spy(*args):
        seen.append(sorted(args[-2].tolist()))
        return kernel(*args)
    monkeypatch.setattr(_cache_kernels, "_cache_buckets", spy)
    return seen


def _configs(g, ns):
    """Per n: a cache of every expert (never evicts on any trace), one of about half of them
    and one at the smallest size that caches, under each rule (and a CPU share)."""
    out = []
    for n in ns:
        whole = cache_mib_for_bytes(g, n, 1e15)
        for mib in sorted({whole, whole // 2, whole // 8}):
            if mib and cache_layout(g, n, mib).cached_layers:
                out += [CacheConfig(n, mib, 0.0, LRU), CacheConfig(n, mib, 0.0, CLS),
                        CacheConfig(n, mib, 0.9, CLS)]
        out.append(CacheConfig(n, 0, 0.0, LRU))
    return out


@pytest.mark.parametrize("name, ns", [("deepseek-v2-lite-4l", (1, 2, 4)),
                                      ("olmoe-1b-7b", (3, 16)),
                                      ("mixtral-8x7b", (5, 32))])
@pytest.mark.parametrize("persist", [True, False])
def test_summed_counts_equal_the_replay_under_every_reading(name, ns, persist, exhaustive,
                                                          replayed):
    trace = parquet_io.read_trace(f"{EX}{name}-trace.parquet")
    configs = _configs(trace.model, ns)
    fast = [replay_cache(trace, configs, persist=persist, reading=r) for r in READINGS]
    cached = [i for i, c in enumerate(configs) if c.cache_mib]
    assert set(cached) - set().union(*replayed)     # the shortcut is exercised
    replayed.clear()
    exhaustive()
    for r, got in zip(READINGS, fast):
        want = replay_cache(trace, configs, persist=persist, reading=r)
        np.testing.assert_array_equal(got.cnt, want.cnt)
    assert replayed == [cached] * len(READINGS)


def test_one_reading_per_configuration_equals_each_reading_alone():
    trace = parquet_io.read_trace(f"{EX}olmoe-1b-7b-trace.parquet")
    g = trace.model
    cfg = CacheConfig(8, cache_mib_for_bytes(g, 8, 8 * 64 * g.layer_expert_bytes[0] / 4), 0.5,
                      CLS)
    both = replay_cache(trace, [cfg] * len(READINGS), reading=READINGS)
    for i, r in enumerate(READINGS):
        np.testing.assert_array_equal(both.cnt[i], replay_cache(trace, [cfg], reading=r).cnt[0])


@pytest.mark.parametrize("gib", [6.0, 12.0, 17.0, 40.0])
def test_search_frames_equal_the_exhaustive_search(gib, exhaustive):
    """The shipped Q4_K_M trace at budgets from a few host layers to every expert on the GPU
    (then each cache holds every expert of its layers and none is replayed)."""
    trace = parquet_io.read_trace(f"{EX}gguf-qwen3-30b-a3b-q4_k_m-trace.parquet")
    profile = parquet_io.read_profile(f"{EX}gguf-qwen3-30b-a3b-q4_k_m-rtx4090-analytic.parquet")
    kw = dict(n_cpu=(0, 2, 24, 47, 48), shares=TUNER_SHARES[:3])
    budget = trace.model.expert_budget_bytes(gib * GIB)
    fast = search_cache(trace, profile, budget, **kw)
    exhaustive()
    slow = search_cache(trace, profile, budget, **kw)
    cols = [c for c in slow.frame.columns if c != "prompt_tpot_us"]
    assert fast.frame[cols].equals(slow.frame[cols])
    np.testing.assert_array_equal(np.stack(fast.frame.prompt_tpot_us),
                                  np.stack(slow.frame.prompt_tpot_us))


def test_first_use_counts_by_hand():
    # one layer, top-2, 3 tokens in prompts [0, 2) and [2, 3): [0,1] [1,2] | [2,0]
    routed = np.array([[[0, 1]], [[1, 2]], [[2, 0]]], np.int16)
    starts = np.array([0, 2, 3])
    server = first_use_counts(routed, starts, 3, True)
    fresh = first_use_counts(routed, starts, 3, False)
    assert server[0].tolist() == [[1, 1, 0], [0, 0, 1]]     # [2,0] hits both on the server
    assert fresh[0].tolist() == [[1, 1, 0], [1, 0, 0]]      # a fresh prompt hits nothing
    assert distinct_per_layer(routed, 3).tolist() == [3]


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_buckets_deal_each_configuration_once_and_balance_the_work(threads):
    rng = np.random.default_rng(threads)
    weight = rng.integers(1, 100, 40).astype(float)
    run = sorted(rng.choice(40, 25, replace=False).tolist())
    start, order = buckets(run, weight, threads)
    assert sorted(order.tolist()) == run
    assert start[0] == 0 and start[-1] == len(run) and len(start) == min(threads, 25) + 1
    loads = [weight[order[a:b]].sum() for a, b in zip(start[:-1], start[1:])]
    assert max(loads) - min(loads) <= weight[run].max()
