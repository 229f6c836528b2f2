"""llama.cpp's own MoE expert cache: MiB -> slots, the replay kernels against hand-worked traces
and the plain-Python reference, the pricing, the search and its flags
(docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

import itertools
import json
import shlex

import naive_moe_cache as naive
import numpy as np
import pytest

from cope_core import parquet_io
from cope_core.errors import CopeInputError
from cope_core.geometry import GIB, MIB, get_model
from cope_core.llamacpp import LlamaFlags
from cope_core.llamacpp.cache import _cache_kernels
from cope_core.llamacpp.cache.cache_search import (
    cache_costs,
    compare,
    search_cache,
    search_space,
)
from cope_core.llamacpp.cache.moe_cache import (
    CacheConfig,
    CacheVersion,
    alloc_size,
    cache_layout,
    cache_mib_for_bytes,
    replay_cache,
)

EX = "data/examples/"
LRU, CLS = CacheVersion.LRU, CacheVersion.CLASS_LRU


def _one_layer(tokens, E, slots, version, share=0.0, prompts=None, persist=True, clock=0,
               order=0):
    """The kernel on a one-layer, one-group cache; counts per prompt as dicts."""
    routed = np.array(tokens, np.int16)[:, None, :]
    T, k = routed.shape[0], routed.shape[2]
    starts = np.array(prompts or [0, T], np.int64)
    cnt = np.zeros((1, starts.size - 1, k + 1, k + 1), np.int64)
    _cache_kernels._cache_sweep(routed, starts, np.zeros((1, 1), np.int64), np.array([1]),
                                np.zeros((1, 1), np.int64), np.array([0, slots]),
                                np.array([0, 2]), np.array([0 if version is LRU else 1]),
                                np.array([share]), persist, E, clock, order, cnt)
    return [{(h, c): int(n) for (h, c), n in np.ndenumerate(cnt[0, p]) if n}
            for p in range(starts.size - 1)]


# --- hand-worked traces -------------------------------------------------------------------------
def test_lru_hits_are_touched_in_routed_order_then_misses_take_the_head():
    # 3 slots, top-2. After [0,1] and [2,0] the list is (e1, e0, e2). A token [1,0] touches e1
    # then e0, so [3,4] evicts e2 and e1 and e0 survives; [0,1] touches e0 then e1, so e0 goes.
    a = _one_layer([[0, 1], [2, 0], [1, 0], [3, 4], [0, 2]], 5, 3, LRU)[0]
    b = _one_layer([[0, 1], [2, 0], [0, 1], [3, 4], [0, 2]], 5, 3, LRU)[0]
    assert a == {(0, 0): 2, (1, 0): 2, (2, 0): 1}
    assert b == {(0, 0): 3, (1, 0): 1, (2, 0): 1}


def test_class_lru_keeps_a_frequent_expert_that_lru_evicts():
    # e0 used 5 times (score ~4.95, class 2), then e1 (class 0) fills the second slot; e2 must
    # evict: LRU takes e0 (older), the class-LRU e1 (age 1 / 2**0 > age 2 / 2**2)
    tokens = [[0]] * 5 + [[1], [2], [0]]
    assert _one_layer(tokens, 6, 2, LRU) == [{(0, 0): 4, (1, 0): 4}]
    assert _one_layer(tokens, 6, 2, CLS) == [{(0, 0): 3, (1, 0): 5}]


def test_cpu_share_starts_once_the_cache_is_full_and_sends_the_coldest_misses():
    # F = 0.5, 2 slots, top-2: [0,1] fills; [2,3]: credit 1 -> e2 (tie on score: lower id) to the
    # CPU, e3 uploaded over e0; [0,1]: e1 hits, credit .5 -> e0 uploaded over e3; [2,3]: credit
    # 1.5 -> e2 on the CPU again, e3 uploaded over e1
    got = _one_layer([[0, 1], [2, 3], [0, 1], [2, 3]], 4, 2, CLS, 0.5)
    assert got == [{(0, 0): 1, (0, 1): 2, (1, 0): 1}]
    # F = 0 is the class-LRU without a CPU share: every miss uploaded
    assert all(c == 0 for (_, c) in _one_layer([[0, 1], [2, 3]] * 3, 4, 2, CLS, 0.0)[0])


def test_the_cache_persists_across_prompts_unless_asked_otherwise():
    tokens = [[0, 1], [0, 1]] * 2                       # two identical prompts of two tokens
    server = _one_layer(tokens, 4, 2, LRU, prompts=[0, 2, 4])
    fresh = _one_layer(tokens, 4, 2, LRU, prompts=[0, 2, 4], persist=False)
    assert server == [{(0, 0): 1, (2, 0): 1}, {(2, 0): 2}]
    assert fresh == [{(0, 0): 1, (2, 0): 1}] * 2


@pytest.mark.parametrize("seed", range(40))
def test_kernels_agree_with_the_plain_python_reference(seed):
    rng = np.random.default_rng(seed)
    T, L, E = int(rng.integers(5, 50)), int(rng.integers(1, 5)), int(rng.integers(4, 12))
    k = int(rng.integers(1, min(4, E) + 1))
    routed = np.stack([[rng.choice(E, k, replace=False) for _ in range(L)]
                       for _ in range(T)]).astype(np.int16)
    P = int(rng.integers(1, 4))
    starts = [0, *sorted(rng.choice(np.arange(1, T), P - 1, replace=False).tolist()), T]
    cached = sorted(rng.choice(L, int(rng.integers(1, L + 1)), replace=False).tolist())
    G = int(rng.integers(1, 3))
    groups = [int(rng.integers(0, G)) for _ in cached]
    slots = [int(rng.integers(k, k + 2 * E)) for _ in range(G)]
    off = np.array([0, *np.cumsum(slots)], np.int64)
    layers = np.zeros((1, L), np.int64)
    layers[0, :len(cached)] = cached
    grp = np.zeros((1, L), np.int64)
    grp[0, :len(cached)] = groups
    clocks = {"token": 0, "layer": 1, "layer-first": 2}
    for version, share, persist, (clock, order) in itertools.product(
            (LRU, CLS), (0.0, 0.5, 0.9), (True, False),
            itertools.product(clocks, ("coldest", "ascending"))):
        if version is LRU and (share or clock != "token" or order != "coldest"):
            continue
        cnt = np.zeros((1, P, k + 1, k + 1), np.int64)
        _cache_kernels._cache_sweep(routed, np.array(starts, np.int64), layers,
                                    np.array([len(cached)]), grp, off, np.array([0, off.size]),
                                    np.array([0 if version is LRU else 1]), np.array([share]),
                                    persist, E, clocks[clock], int(order == "ascending"), cnt)
        want = naive.replay(routed.tolist(), starts, cached, groups, slots, E, version.value,
                            share, persist, clock, order)
        for p in range(P):
            got = {(h, c): int(n) for (h, c), n in np.ndenumerate(cnt[0, p]) if n}
            assert got == want[p], (version, share, persist, clock, order, p)


# --- MiB -> slots -------------------------------------------------------------------------------
def test_alloc_size_pads_each_bank_once_and_counts_the_extra_slot():
    # 60-byte experts, 3 slots -> 4 per bank = 240 B, padded to 256, three banks
    assert alloc_size((60, 60, 60), 3) == 768
    assert alloc_size((128, 128, 256), 0) == 512


def test_slots_of_mixtral_bf16():
    g = get_model("mixtral-8x7b")        # BF16 banks of 4096 x 14336 x 2 B = 112 MiB each
    lay = cache_layout(g, 32, 4096)
    (grp,) = lay.groups
    assert grp.bank_bytes == (117440512,) * 3 and grp.layers == tuple(range(32))
    assert grp.n_slots == 11                   # 3 * 112 MiB * (11 + 1) = 4032 MiB <= 4096
    assert lay.cached_layers == tuple(range(32)) and lay.alloc_bytes == 4032 * MIB
    # 2 slots is the least a top-2 group may have: 3 * 112 * 3 = 1008 MiB
    assert cache_layout(g, 32, 1008).n_slots == 2
    assert cache_layout(g, 32, 1007).n_slots == 0
    assert cache_layout(g, 32, 1007).cached_layers == ()
    assert cache_layout(g, 32, 1007).uncached_cpu_layers == 32


def test_slots_of_deepseek_v2_lite_with_its_dense_prefix():
    g = get_model("deepseek-v2-lite")      # 1 dense block, 26 MoE layers, 64 experts, top-6
    lay = cache_layout(g, 10, 1024)
    assert lay.groups[0].bank_bytes == (2048 * 1408 * 2,) * 3
    assert lay.n_slots == 61                   # 17,301,504 B per slot: 62 * that <= 1 GiB
    assert lay.n_gpu == 16 and lay.cached_layers == tuple(range(10))
    # --n-cpu-moe counts the dense block too
    cfg = search_space(g, 16 * 64 * sum(g.layer_expert_bytes[:1]) + 1024 * MIB, n_cpu=[10],
                       versions=[LRU])
    assert {c.cache_mib for c in cfg} == {0, 1024}


def test_slots_of_the_shipped_q4_k_m_header_two_groups_split_by_host_bytes():
    g = parquet_io.read_trace(EX + "gguf-qwen3-30b-a3b-q4_k_m-trace.parquet").model
    lay = cache_layout(g, 48, 4096)
    a, b = lay.groups                      # Q6_K ffn_down on the use_more_bits layers, Q4_K else
    assert a.bank_bytes == (884736, 884736, 1290240) and b.bank_bytes == (884736,) * 3
    assert len(a.layers) == len(b.layers) == 24
    size = 4096 * MIB
    assert a.budget == int(size * 3059712 / (3059712 + 2654208))
    assert a.n_slots == a.budget // 3059712 - 1 == 750
    assert b.n_slots == b.budget // 2654208 - 1 == 750
    assert lay.alloc_bytes <= size
    assert cache_mib_for_bytes(g, 48, lay.alloc_bytes) <= 4096


# --- pricing and search --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    trace = parquet_io.read_trace(EX + "deepseek-v2-lite-4l-trace.parquet")
    profile = parquet_io.read_profile(EX + "deepseek-v2-lite-4l-cpu-emulated-profile.parquet")
    return trace, profile


def test_search_returns_the_brute_force_optimum_priced_by_hand(small):
    trace, profile = small
    g = trace.model
    layer = g.n_experts * g.layer_expert_bytes[0]
    budget = 2 * layer + 300 * MIB
    shares = (0.0, 0.5, 0.9)
    found = search_cache(trace, profile, budget, shares=shares)
    op = profile.resolve(model=g)
    tokens = trace.tokens_per_prompt
    shared = np.add.reduceat(op.shared_at(trace.context), trace.prompt_start[:-1]) / tokens
    sched = op.schedule[3]                       # cost_selected, [h, c]
    best = None
    for n in range(g.n_layers + 1):
        free = budget - (g.n_layers - n) * layer
        if free < 0:
            continue
        mib = int(free // MIB)
        while mib and cache_layout(g, n, mib).alloc_bytes > free:
            mib -= 1
        points = [(0, 0.0, LRU)] + ([(mib, 0.0, LRU)] + [(mib, f, CLS) for f in shares]
                                    if n and mib and cache_layout(g, n, mib).cached_layers
                                    else [])
        for m, f, v in points:
            lay = cache_layout(g, n, m)
            ref = naive.replay(trace.routed.tolist(), trace.prompt_start.tolist(),
                               list(lay.cached_layers), [0] * len(lay.cached_layers),
                               [lay.n_slots], g.n_experts, v.value, f) if m else \
                [{}] * trace.n_prompts
            tp = []
            for p in range(trace.n_prompts):
                cached = sum(cnt * (sched[h, c] + op.sync) for (h, c), cnt in ref[p].items())
                tp.append(shared[p] + cached / tokens[p] + lay.n_gpu * op.gpu_layer
                          + lay.uncached_cpu_layers * op.cpu_layer)
            t = float(np.mean(tp))
            if best is None or t < best[0] - 1e-9:
                best = (t, n, m, f, v)
    top = found.frame.loc[found.frame["tpot_us"].idxmin()]
    assert top.tpot_us == pytest.approx(best[0], rel=1e-9)
    assert (top.n_cpu, top.cache_mib, top.cpu_share) == best[1:4]
    assert len(found.frame) == len(search_space(g, budget, shares=shares))


def test_cache_costs_use_the_cost_selected_rows_and_one_sync(small):
    _, profile = small
    op = profile.resolve()
    c = cache_costs(op)
    k = op.top_k
    for h in range(k + 1):
        for cpu in range(k + 1 - h):
            assert c.lookup[h, cpu] == op.schedule[3, h, cpu] + op.sync
    assert c.lookup[k, 1] == 0.0


def test_compare_pairs_the_best_cache_with_layer_partition_and_the_matrix_winner(small):
    trace, profile = small
    g = trace.model
    K = 32
    found = search_cache(trace, profile, K * g.per_k_bytes)
    out = compare(found, trace, profile, "fixed/parallel", experts_per_layer=K, draws=200)
    assert [c.name for c in out][1:] == ["layer_partition at K = 32",
                                         "the Policy Matrix's winner fixed/parallel"]
    assert all(c.lo_us <= c.tpot_us * 1.5 and c.lo_us <= c.hi_us for c in out)
    assert all(0.0 <= c.cache_faster <= 1.0 for c in out[1:])
    lp = found.frame[(found.frame.cache_mib == 0)
                     & (found.frame.n_cpu == g.n_layers - K * g.n_layers // g.n_experts)]
    assert out[1].tpot_us == pytest.approx(float(lp.tpot_us.iloc[0]))


# --- bad input ------------------------------------------------------------------------------------
def test_impossible_budgets_and_bad_settings_are_one_line_errors(small):
    trace, profile = small
    with pytest.raises(CopeInputError, match="no --n-cpu-moe fits"):
        search_cache(trace, profile, -1.0)
    with pytest.raises(CopeInputError, match="share in \\[0, 1\\)"):
        CacheConfig(1, 100, 1.0, CLS)
    with pytest.raises(CopeInputError, match="only with the class-LRU"):
        CacheConfig(1, 100, 0.5, LRU)
    with pytest.raises(CopeInputError, match="must be in \\[0, 4\\]"):
        cache_layout(trace.model, 5, 100)
    with pytest.raises(CopeInputError, match="whole number of MiB"):
        cache_layout(trace.model, 1, -3)
    with pytest.raises(CopeInputError, match="no llama.cpp cache configuration"):
        replay_cache(trace, [])


# --- flags: a replay of the cited common/arg.cpp entries -----------------------------------------
def _parse_cache_flags(argv: list[str]) -> dict:
    """``--moe-cache-mib N`` (b11480 common/arg.cpp: an int, ``< 0`` is "invalid value", stored as
    ``value * 1024 * 1024`` bytes) and ``--moe-cache-cpu-share F`` (b12191 docs/moe-cache.md: a
    share, default 0); the placement flags the b11434 binary parses for real (test_runtimes)."""
    out = {"moe_cache_size": 0, "cpu_share": 0.0}
    it = iter(argv)
    for a in it:
        if a == "--moe-cache-mib":
            v = int(next(it))
            if v < 0:
                raise ValueError("invalid value")
            out["moe_cache_size"] = v * 1024 * 1024
        elif a == "--moe-cache-cpu-share":
            f = float(next(it))
            if not 0.0 <= f < 1.0:
                raise ValueError("invalid value")
            out["cpu_share"] = f
        elif a == "--n-cpu-moe":
            out["n_cpu_moe"] = int(next(it))
    return out


@pytest.mark.parametrize("share", [0.0, 0.5, 0.98])
def test_flags_round_trip_through_the_argument_rules(share):
    text = LlamaFlags.placed(28, 8, 12, cache_mib=5000, cpu_share=share).text()
    got = _parse_cache_flags(shlex.split(text))
    assert got == {"moe_cache_size": 5000 * MIB, "cpu_share": share, "n_cpu_moe": 12}
    assert "--moe-cache-cpu-share" in text if share else "--moe-cache-cpu-share" not in text


def test_search_of_the_shipped_q4_k_m_example_prices_every_fitting_placement():
    trace = parquet_io.read_trace(EX + "gguf-qwen3-30b-a3b-q4_k_m-trace.parquet")
    profile = parquet_io.read_profile(EX + "gguf-qwen3-30b-a3b-q4_k_m-rtx4090-analytic.parquet")
    g = trace.model
    budget = g.expert_budget_bytes(16 * GIB)
    found = search_cache(trace, profile, budget, versions=[LRU], n_cpu=[6, 48])
    df = found.frame
    assert set(df.n_cpu) == {6, 48}
    assert (df.cache_bytes <= budget - df.n_cpu.map(
        lambda n: g.n_experts * sum(g.layer_expert_bytes[n:]))).all()
    full = df[(df.n_cpu == 48) & (df.cache_mib > 0)].iloc[0]
    assert full.hits + full.uploads == pytest.approx(48 * g.top_k)
    assert 0 < full.hit_rate < 1
    # CPU misses only with a share
    assert (df.cpu_misses == 0).all()


# --- the runtime's own counters -------------------------------------------------------------------
def _c_printf(fmt: str, *args) -> str:
    """A C format string of llama-moe-cache.cpp written by Python (%zu, %d and %.Nf alike)."""
    return fmt.replace("%zu", "%d").replace("%2zu", "%2d") % args


def _server_log(groups, hits, misses, mib) -> str:
    """What llama-server prints about its cache, from the format strings of
    src/llama-moe-cache.cpp @4b060f27 (the constructor's two lines and log_stats)."""
    lines = ["llama_context: constructing llama_context",
             _c_printf("%s: %10s MoE cache size = %8.2f MiB for %.2f MiB of host experts",
                       "impl", "CUDA0", 4093.91, 8896.5)]
    for n, t, s in groups:
        lines.append(_c_printf("%s: %2zu layers, %s: %5d slots (%.1f%%)", "impl", n, t, s,
                               100.0 * s / (n * 128)))
    lines.append("main: server is listening on http://127.0.0.1:8080")
    lines.append(_c_printf("llama_moe_cache: %s: hits = %zu, misses = %zu, hit rate = %.2f%%, "
                           "uploaded = %.2f MiB", "ubatch <= 8", hits, misses,
                           100.0 * hits / (hits + misses), mib))
    lines.append(_c_printf("llama_moe_cache: %s: hits = %zu, misses = %zu, hit rate = %.2f%%, "
                           "uploaded = %.2f MiB", "ubatch  > 8", 5, 7, 41.67, 1.5))
    return "\n".join(lines) + "\n"


def test_the_exit_counters_are_read_from_the_format_strings_lines():
    from cope_core.llamacpp.cache.server_log import parse_cache_log
    log = parse_cache_log(_server_log([(24, "q6_K", 750), (24, "q4_K", 750)], 300, 100, 12.5))
    assert log.groups == ((24, "q6_K", 750), (24, "q4_K", 750))
    assert log.decode == (300, 100, 12.5) and log.hit_rate == 0.75
    assert log.size_mib == 4093.91
    with pytest.raises(CopeInputError, match="ubatch <= 8"):
        parse_cache_log("llama_context: nothing about a cache\n", "server.log")


def test_trace_stats_compares_a_server_log_with_the_replay(tmp_path, capsys):
    from cope_core.cli.main import main
    trace_path = EX + "gguf-qwen3-30b-a3b-q4_k_m-trace.parquet"
    trace = parquet_io.read_trace(trace_path)
    counts = replay_cache(trace, [CacheConfig(48, 4096, 0.0, CLS)])
    per = counts.per_token(trace.tokens_per_prompt)
    hits = int(round(float((per["hits"][0] * trace.tokens_per_prompt).sum())))
    ups = int(round(float((per["uploads"][0] * trace.tokens_per_prompt).sum())))
    log = tmp_path / "server.log"
    log.write_text(_server_log([(24, "q6_K", 750), (24, "q4_K", 750)], hits, ups, 1.0))
    code = main(["trace", "stats", trace_path, "--llamacpp-log", str(log), "--n-cpu-moe", "48",
                 "--moe-cache-mib", "4096", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["predicted_slots"] == out["logged_slots"] == [750, 750]
    assert out["predicted_hit_rate"] == pytest.approx(out["logged_hit_rate"])
    code = main(["trace", "stats", trace_path, "--llamacpp-log", str(log)])
    assert code == 2 and "--n-cpu-moe" in capsys.readouterr().err
