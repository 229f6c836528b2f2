"""The size cliff of llama.cpp's MoE cache and the readings of the class-LRU's inferred rules:
hand-worked traces, property tests of the bounds and of the search, the record's spread
(docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cope_core import parquet_io
from cope_core.errors import CopeInputError
from cope_core.geometry import GIB
from cope_core.llamacpp import READINGS, CacheVersion, cache_layout
from cope_core.llamacpp.answer.cache_record import CacheRecord, llamacpp_record, record_of
from cope_core.llamacpp.cache import _cache_kernels
from cope_core.llamacpp.cache.cache_cliff import below_cliff, cliff_mib, cliff_slots, group_cliffs
from cope_core.llamacpp.cache.cache_readings import ReadingTpot, class_lru_readings, spread
from cope_core.llamacpp.cache.cache_search import Contender, search_cache, search_space

LRU, CLS = CacheVersion.LRU, CacheVersion.CLASS_LRU
CLOCKS = (_cache_kernels.TOKEN_CLOCK, _cache_kernels.LAYER_CLOCK, _cache_kernels.LAYER_CLOCK_FIRST)
Q4 = "data/examples/gguf-qwen3-30b-a3b-q4_k_m-"
SMALL = "data/examples/deepseek-v2-lite-4l-"


def _group(tokens, E, slots, version, share=0.0, clock=0, order=0):
    """The kernel with every layer of ``tokens`` (T x L x k) in one group of ``slots`` slots, one
    prompt; the counts as a dict {(hits, cpu misses): lookups}."""
    routed = np.array(tokens, np.int16)
    T, L, k = routed.shape
    cnt = np.zeros((1, 1, k + 1, k + 1), np.int64)
    _cache_kernels._cache_sweep(routed, np.array([0, T], np.int64),
                                np.arange(L, dtype=np.int64)[None, :], np.array([L]),
                                np.zeros((1, L), np.int64), np.array([0, slots]),
                                np.array([0, 2]), np.array([version.kernel]), np.array([share]),
                                True, E, clock, order, cnt)
    return {(h, c): int(n) for (h, c), n in np.ndenumerate(cnt[0, 0]) if n}


def _hits(counts):
    return sum(h * n for (h, _), n in counts.items())


# --- hand-worked ------------------------------------------------------------------------------
def test_cliff_slots_by_rule():
    assert cliff_slots(LRU, 1, 8) == 8                  # one layer: top_k slots can hit
    assert cliff_slots(LRU, 2, 2) == 3                  # (2 - 1) * 2 + 1
    assert cliff_slots(LRU, 24, 8) == 185               # a 24-layer group of Qwen3-30B-A3B
    assert cliff_slots(CLS, 3, 2) == 3                  # top_k + 1 without a CPU share
    assert cliff_slots(CLS, 3, 2, 0.5) == 2             # with one: top_k
    assert cliff_slots(CLS, 1, 2) == 2


def test_lru_at_the_working_set_less_one_lookup_never_hits_and_one_slot_more_does():
    # two layers route experts 0 and 1 at every token, top-2. At 2 slots B's lookup evicts A's
    # experts and A's evicts B's: 0 hits. At 3 slots (list LRU -> MRU after token 0: a1 b0 b1):
    # A hits a1 and uploads a0 over b0, B hits b1 and uploads b0 over a1, and so on: from the
    # second token every lookup keeps exactly one expert of its layer's last
    tokens = [[[0, 1], [0, 1]]] * 6
    assert _group(tokens, 2, 2, LRU) == {(0, 0): 12}
    assert _group(tokens, 2, 3, LRU) == {(0, 0): 2, (1, 0): 10}


def test_class_lru_keeps_a_frequent_expert_below_the_lru_cliff():
    # three layers, top-2: A routes 0 and 1 at every token, B and C new experts each time. A's
    # scores climb a class; B's and C's stay in class 0, so with 3 slots B evicts C's old
    # expert and one of A's (ties to the lower class), C evicts B's (class 0 before class 1)
    # and one of A's experts is still cached when A comes back: one hit per token from the
    # third, under every clock. The LRU needs 5 slots; at 3 and 4 it never hits.
    tokens = [[[0, 1], [2 + 2 * t, 3 + 2 * t], [20 + 2 * t, 21 + 2 * t]] for t in range(8)]
    for clock in CLOCKS:
        assert _group(tokens, 40, 3, CLS, clock=clock) == {(0, 0): 19, (1, 0): 5}
        assert _group(tokens, 40, 2, CLS, clock=clock) == {(0, 0): 24}
    assert _hits(_group(tokens, 40, 3, LRU)) == _hits(_group(tokens, 40, 4, LRU)) == 0


def test_the_shipped_q4_k_m_header_cliffs():
    g = parquet_io.read_trace(Q4 + "trace.parquet").model
    # -cmoe: two groups of 24 layers; the LRU needs 185 slots each, from 1014 MiB
    (a, b) = group_cliffs(g, 48, LRU)
    assert (len(a.layers), a.slots, a.mib) == (24, 185, 1014)
    assert (len(b.layers), b.slots, b.mib) == (24, 185, 1014)
    assert [x.n_slots for x in cache_layout(g, 48, 1014).groups] == [185, 185]
    assert [x.n_slots for x in cache_layout(g, 48, 1013).groups] == [184, 184]
    assert cliff_mib(g, 48, LRU) == 1014 and cliff_mib(g, 48, CLS) == 55
    # --n-cpu-moe 7: the six Q6_K layers (41 slots from 141 MiB) and the seventh alone, which
    # gets a seventh of the budget and its 8 slots from 181 MiB
    assert [(len(c.layers), c.slots, c.mib) for c in group_cliffs(g, 7, LRU)] == [
        (6, 41, 141), (1, 8, 181)]
    assert cliff_mib(g, 7, LRU) == 141
    # 361 MiB at -cmoe (65 slots a group) is below the LRU's cliff, not the class-LRU's
    lay = cache_layout(g, 48, 361)
    assert below_cliff(g, lay, LRU) and not below_cliff(g, lay, CLS)


# --- properties -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_layers=st.integers(2, 4), k=st.integers(1, 3),
       E=st.integers(4, 9))
def test_no_hit_below_the_cliff_on_any_trace(seed, n_layers, k, E):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(2, 30))
    # skewed routing (a few experts most of the time) so that hits are likely where possible
    p = rng.dirichlet(np.full(E, 0.3))
    tokens = [[rng.choice(E, k, replace=False, p=p).tolist() for _ in range(n_layers)]
              for _ in range(T)]
    lru_below = cliff_slots(LRU, n_layers, k) - 1
    assert _hits(_group(tokens, E, lru_below, LRU)) == 0
    for r in READINGS:
        counts = _group(tokens, E, k, CLS, clock=CLOCKS[["token", "layer", "layer-first"]
                                                          .index(r.clock)],
                        order=int(r.cpu_order == "ascending"))
        assert _hits(counts) == 0                        # top_k slots, no CPU share


@settings(max_examples=40, deadline=None)
@given(gib=st.floats(0.0, 18.0), n_shares=st.integers(1, 6))
def test_the_search_never_returns_a_size_below_the_cliff(gib, n_shares):
    g = parquet_io.read_trace(Q4 + "trace.parquet").model
    shares = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98)[:n_shares]
    try:
        configs = search_space(g, gib * GIB, shares=shares)
    except CopeInputError:                               # nothing fits this budget
        return
    for c in configs:
        if c.cache_mib:
            assert not below_cliff(g, cache_layout(g, c.n_cpu, c.cache_mib), c.version,
                                   c.cpu_share), c


@pytest.fixture(scope="module")
def q4():
    return (parquet_io.read_trace(Q4 + "trace.parquet"),
            parquet_io.read_profile(Q4 + "rtx4090-analytic.parquet"))


def test_a_sweep_keeps_sizes_below_the_cliff_marked_and_never_picks_them(q4):
    trace, profile = q4
    found = search_cache(trace, profile, 20 * GIB, n_cpu=[48], cache_mib=[361, 1013, 1014, 4096],
                   versions=(LRU,))
    df = found.frame.set_index("cache_mib")
    assert df.loc[361, "hits"] == 0 and df.loc[1013, "hits"] == 0   # the LRU below its cliff
    assert df.loc[1014, "hits"] > 0
    assert df.loc[[361, 1013], "below_cliff"].all() and not df.loc[[1014, 4096],
                                                                   "below_cliff"].any()
    assert not found.best()["below_cliff"].any()


# --- the record's readings ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def record():
    rec = llamacpp_record(parquet_io.read_trace(SMALL + "trace.parquet"),
                          parquet_io.read_profile(SMALL + "cpu-emulated-profile.parquet"),
                          parquet_io.read_trace(SMALL + "calibration.parquet"),
                          experts_per_layer=16, vram_gib=None, matrix_winner="fixed/parallel",
                          cpu_threads=2, gpu_share=100.0)
    assert rec is not None
    return rec


def test_the_record_replays_the_class_lru_under_every_reading(record):
    cls = next(b for b in record.best if b.candidate == "llamacpp_cache/classlru")
    assert [r.reading for r in record.rule_readings] == [r.label for r in READINGS]
    ours = record.rule_readings[0]
    assert ours.reading == "token clock, coldest to the CPU"
    assert ours.tpot_us == pytest.approx(cls.tpot_us, rel=1e-12)
    assert ours.hits == pytest.approx(cls.hits, rel=1e-12)
    assert record.best[0] is cls                         # its interval covers every reading
    lo, hi = record.versus[0].tpot_ci_us
    assert all(lo <= r.tpot_us <= hi for r in record.rule_readings)


def test_an_interval_narrower_than_the_readings_is_widened_to_them():
    trace = parquet_io.read_trace(SMALL + "trace.parquet")
    profile = parquet_io.read_profile(SMALL + "cpu-emulated-profile.parquet")
    found = search_cache(trace, profile, 1.03125 * GIB, cpu_threads=2, gpu_share=100.0)
    readings = class_lru_readings(found, trace, profile)
    best = found.best().iloc[0]
    assert best["candidate"] == "llamacpp_cache/classlru"
    t = float(best["tpot_us"])
    slower = ReadingTpot("layer clock, ascending to the CPU", t + 5.0, 1.0)
    faster = ReadingTpot("layer-first clock, coldest to the CPU", t - 3.0, 2.0)
    rec = record_of(found, [Contender(str(best["candidate"]), t, t - 1.0, t + 1.0, None)],
                    readings=readings[:1] + (slower, faster))
    assert rec.versus[0].tpot_ci_us == (t - 3.0, t + 5.0)
    assert spread(rec.rule_readings) == (faster, slower)
    # without readings (or when the best is not the class-LRU's) the interval is the draws'
    assert record_of(found, [Contender("x", t, t - 1.0, t + 1.0, None)]).versus[0].tpot_ci_us \
        == (t - 1.0, t + 1.0)


def test_a_record_written_before_the_readings_reads_back(record):
    d = json.loads(json.dumps(record.to_dict()))
    d.pop("rule_readings")
    again = CacheRecord.from_dict(d)
    assert again is not None and again.rule_readings == ()
    d["rule_readings"] = [{"reading": "token clock", "tpot_us": -1.0, "hits": 0.0}]
    with pytest.raises(CopeInputError, match=r"rule_readings\[0\]\.tpot_us"):
        CacheRecord.from_dict(d)


# --- the app's llama.cpp view -----------------------------------------------------------------
def test_the_view_states_the_cliff_and_the_readings(record):
    from cope_core.app.llamacpp_view import verdict
    g = parquet_io.read_trace(SMALL + "trace.parquet").model
    text = verdict(record, g)
    cached = next(b for b in record.best if b.cache_mib)
    lru = cliff_mib(g, cached.cpu_layers, LRU)
    assert f"LRU {lru} MiB" in text and "no size below is recommended" in text
    assert "inferred" in text and record.rule_readings[0].reading in text
    assert "inferred" not in verdict(record)            # no geometry: no notes


def test_the_cache_size_figure_crosses_sizes_below_the_cliff_and_draws_each_rules(q4):
    from cope_core.app.llamacpp_view import cache_size_figure
    trace, profile = q4
    frame = search_cache(trace, profile, 20 * GIB, n_cpu=[48], cache_mib=[361, 1014],
                   versions=(LRU,)).frame
    frame.attrs["cliff_mib"] = {v.value: cliff_mib(trace.model, 48, v) for v in CacheVersion}
    fig = cache_size_figure(frame)
    (lru,) = [t for t in fig.data if t.name == "lru"]
    assert list(lru.x) == [361, 1014] and list(lru.marker.symbol) == ["x", "circle"]
    lines = {s.x0 for s in fig.layout.shapes if s.line.dash == "dot"}
    assert lines == {1014, 55}


def test_predict_json_carries_the_readings_on_the_class_lru_row(record):
    from cope_core.cli.cache_report import json_rows
    trace = parquet_io.read_trace(SMALL + "trace.parquet")
    rows = {r["candidate"]: r for r in json_rows(record, None, trace, 16, 2)}
    assert rows["llamacpp_cache/classlru"]["rule_readings"] == \
        record.to_dict()["rule_readings"]
    assert "rule_readings" not in rows.get("llamacpp_cache/lru", {})


# --- the readings, hand-worked ----------------------------------------------------------------
def test_the_clocks_disagree_on_which_layer_to_spare():
    # two layers in one group, top-1, 2 slots. B routes 7 at tokens 0-2 (its score reaches
    # class 1), A a new expert each token. At token 3 A uploads 3 over its own 2, then B's miss
    # (6) must evict 3 (class 0) or 7 (class 1). Token clock: 3 was used this token (age 0,
    # score 0), 7 a token ago (age 1 / 2 = 0.5): 7 goes, and at token 4 both 3 and 6 hit.
    # Layer clock (ticked after each lookup): A's clock has moved on, so 3 is a lookup old
    # (1 / 1 = 1 > 0.5): 3 goes; at token 4 A misses 3 (evicting 6, class 0, on the tie at
    # 1) and B misses 6: no hit. Layer clock ticked first reads 3 as age 0, as the token clock.
    tokens = [[[0], [7]], [[1], [7]], [[2], [7]], [[3], [6]], [[3], [6]]]
    token, layer, first = CLOCKS
    assert _group(tokens, 8, 2, CLS, clock=token) == {(0, 0): 6, (1, 0): 4}
    assert _group(tokens, 8, 2, CLS, clock=layer) == {(0, 0): 8, (1, 0): 2}
    assert _group(tokens, 8, 2, CLS, clock=first) == {(0, 0): 6, (1, 0): 4}


def test_the_cpu_share_orders_disagree_on_which_miss_to_upload():
    # one layer, top-2, 2 slots, share 0.5. Token 1 [2,3]: both unseen, 2 (lower id) to the
    # CPU under either order, 3 uploaded over 0. Token 2 [2,4]: one to the CPU: the coldest is
    # 4 (never used; 2 was used on the CPU), the lowest id is 2. Coldest uploads 2 over 1, so
    # token 3 [2,3] hits both; ascending uploads 4, so token 3 hits 3 and uploads 2 (credit 0.5)
    tokens = [[[0, 1]], [[2, 3]], [[2, 4]], [[2, 3]]]
    assert _group(tokens, 6, 2, CLS, 0.5, order=_cache_kernels.COLDEST) == {
        (0, 0): 1, (0, 1): 2, (2, 0): 1}
    assert _group(tokens, 6, 2, CLS, 0.5, order=_cache_kernels.ASCENDING) == {
        (0, 0): 1, (0, 1): 2, (1, 0): 1}


# --- the spread on every row that shows a configuration (issue 39) ----------------------------
def test_every_row_shows_its_rules_spread_the_class_lru_s_alone(record):
    import dataclasses

    from cope_core.app.llamacpp_view import best_table
    from cope_core.cli.cache_report import json_rows
    from cope_core.export.llamacpp import cache_lines
    from cope_core.llamacpp import llamacpp_answer, row_spread, spread_text
    g = parquet_io.read_trace(SMALL + "trace.parquet").model
    lo = min(r.tpot_us for r in record.rule_readings)
    hi = max(r.tpot_us for r in record.rule_readings)
    want = f"{lo / 1e3:.3f}-{hi / 1e3:.3f} ms under {len(READINGS)} readings"
    by = {b.candidate: b for b in record.best}
    cls = by["llamacpp_cache/classlru"]
    assert [r.tpot_us for r in row_spread(record, cls)] == [lo, hi]
    assert spread_text(record, cls) == want
    assert all(row_spread(record, b) is None and spread_text(record, b) == ""
               for b in record.best if b is not cls)
    # the class-LRU not the best: its row among "the other kinds" still carries the spread
    other = dataclasses.replace(record, best=tuple(b for b in record.best if b is not cls)
                                + (cls,))
    for rec in (record, other):
        table = best_table(rec, g, 2).set_index("kind")["inferred rules"]
        assert [table[k] for k in table.index if "classlru" in k] == [want]
        assert {table[k] for k in table.index if "classlru" not in k} <= {"none inferred", "—"}
        text = "\n".join(cache_lines(llamacpp_answer(rec, g, 2), rec, g))
        assert text.count(want) == 1
    assert f"; {want})" in next(ln for ln in cache_lines(llamacpp_answer(other, g, 2), other, g)
                                if ln.startswith("# the fastest of each other kind"))
    rows = {r["candidate"]: r for r in json_rows(other, None, parquet_io.read_trace(
        SMALL + "trace.parquet"), 16, 2)}
    assert rows["llamacpp_cache/classlru"]["rule_spread_us"] == [lo, hi]
    assert "rule_spread_us" not in rows.get("llamacpp_cache/lru", {})
