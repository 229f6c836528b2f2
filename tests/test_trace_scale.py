"""Traces at scale: the streaming reader (row groups, shards, prompt selection), the parts writer,
the numba id checks against a plain-Python reference, the parallel synthesizer, reservoir
sampling and the hot-set verdict."""
from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from tiny import tiny_geometry, tiny_trace

from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.geometry import get_model
from cope_core.parquet_io import read_trace, trace_prompts, write_trace, write_trace_parts
from cope_core.trace._kernels import (
    DUPLICATE,
    LAST_LAYER,
    OUT_OF_RANGE,
    PAD_INSIDE,
    first_list_problem,
)
from cope_core.trace.data import Trace
from cope_core.trace.sample import reservoir_sample
from cope_core.trace.stats import hot_set
from cope_core.trace.synth import synthesize, synthesize_parts

ARRAYS = ("prompt_ids", "prompt_start", "context", "routed", "predicted")
SMALL = get_model("olmoe-1b-7b").with_layers(3)


def same_trace(a: Trace, b: Trace) -> None:
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.metadata() == b.metadata()


def _message(fn, *args, **kw) -> str:
    with pytest.raises(CopeInputError) as info:
        fn(*args, **kw)
    return str(info.value)


# --- the id-list kernel against a plain-Python reference ----------------------------------------
def _reference_problems(ids: np.ndarray, E: int, padded: bool, last_empty: bool) -> list[int]:
    n, L, W = ids.shape
    found = [-1] * 5
    for t, l in itertools.product(range(n), range(L)):
        row, lst = t * L + l, ids[t, l].tolist()
        vals = [v for v in lst if not (padded and v == -1)]
        checks = {OUT_OF_RANGE: any(not 0 <= v < E for v in vals),
                  DUPLICATE: len({v for v in vals if 0 <= v < E})
                  < len([v for v in vals if 0 <= v < E]),
                  PAD_INSIDE: padded and any(v != -1 for v in lst[lst.index(-1):])
                  if -1 in lst else False,
                  LAST_LAYER: last_empty and l == L - 1 and bool(vals)}
        for kind, bad in checks.items():
            if bad and found[kind] < 0:
                found[kind] = row
    return found


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.integers(2, 6),
       st.booleans(), st.data())
def test_list_kernel_equals_reference(n, L, W, E, padded, data):
    ids = np.array(data.draw(st.lists(st.integers(-2, E), min_size=n * L * W,
                                      max_size=n * L * W)), np.int16).reshape(n, L, W)
    got = first_list_problem(ids, E, padded=padded, last_empty=padded).tolist()
    assert got == _reference_problems(ids, E, padded, padded)


# --- streaming reader ---------------------------------------------------------------------------
def _corrupt(table: pa.Table, row: int, column: str, value) -> pa.Table:
    rows = table.to_pylist()
    rows[row][column] = value
    return pa.Table.from_pylist(rows, schema=table.schema)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([("layer", 2), ("layer", 5), ("token", 4), ("prompt", 1), ("context", -3),
                        ("context", 99), ("routed", [1, 1]), ("routed", [0, 9]),
                        ("routed", [1]), ("predicted", [3, 3]), ("predicted", [0, 1, 2, 3])]),
       st.integers(0, 14), st.sampled_from([1, 2, 4, 7]))
def test_first_problem_does_not_depend_on_row_groups(tmp_path_factory, corruption, row, group):
    """The same message whether the file is one row group or many: the checks carry their state
    from one row group to the next."""
    tmp = tmp_path_factory.mktemp("rg")
    write_trace(tiny_trace(), tmp / "ok.parquet")
    table = pq.read_table(tmp / "ok.parquet")
    bad = _corrupt(table, row, *corruption)
    pq.write_table(bad, tmp / "one.parquet")
    pq.write_table(bad, tmp / "many.parquet", row_group_size=group)
    try:
        read_trace(tmp / "one.parquet")
    except CopeInputError as exc:
        one = str(exc).replace("one.parquet", "X")
    else:
        one = None
    try:
        read_trace(tmp / "many.parquet")
    except CopeInputError as exc:
        many = str(exc).replace("many.parquet", "X")
    else:
        many = None
    assert one == many


def test_many_row_groups_read_back_exactly(tmp_path):
    tr = synthesize(SMALL, prompts=5, tokens=7, seed=2)
    for rows in (1, 5, 16, 10_000):
        write_trace(tr, tmp_path / f"r{rows}.parquet", row_group_rows=rows)
        assert pq.ParquetFile(tmp_path / f"r{rows}.parquet").num_row_groups == -(-105 // rows)
        same_trace(read_trace(tmp_path / f"r{rows}.parquet"), tr)


def test_last_token_cut_short_is_reported(tmp_path):
    write_trace(tiny_trace(), tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    pq.write_table(table.slice(0, 14), tmp_path / "cut.parquet", row_group_size=4)
    assert "row 13 (prompt 7, token 1, layer 1): layer 2 is missing" in _message(
        read_trace, tmp_path / "cut.parquet")


def test_selected_prompts(tmp_path):
    tr = synthesize(SMALL, prompts=6, tokens=3, seed=1)
    write_trace(tr, tmp_path / "t.parquet", row_group_rows=4)
    sub = read_trace(tmp_path / "t.parquet", prompts=[4, 1])
    assert sub.prompt_ids.tolist() == [1, 4]
    np.testing.assert_array_equal(sub.routed, tr.routed[np.r_[3:6, 12:15]])
    np.testing.assert_array_equal(sub.context, tr.context[np.r_[3:6, 12:15]])
    assert "prompt 9 is not in the trace" in _message(read_trace, tmp_path / "t.parquet",
                                                      prompts=[1, 9])


# --- shards -------------------------------------------------------------------------------------
def test_folder_of_shards_reads_as_one_trace(tmp_path):
    tr = synthesize(SMALL, prompts=6, tokens=4, seed=3)
    parts = list(synthesize_parts(SMALL, prompts=6, tokens=4, seed=3, part_rows=2 * 4 * 3))
    assert len(parts) == 3
    for i, p in enumerate(parts):
        write_trace(p, tmp_path / "shards" / f"part-{i}.parquet")
    (tmp_path / "shards" / "README.txt").write_text("not a shard")
    same_trace(read_trace(tmp_path / "shards"), dataclasses.replace(tr))
    ids, counts = trace_prompts(tmp_path / "shards")
    assert ids.tolist() == list(range(6)) and counts.tolist() == [12] * 6


def test_shards_that_disagree(tmp_path):
    a = synthesize(SMALL, prompts=2, tokens=3, seed=1)
    write_trace(a, tmp_path / "s" / "a.parquet")
    other = synthesize(SMALL.with_layers(2), prompts=1, tokens=3, seed=1)
    write_trace(other, tmp_path / "s" / "b.parquet")
    msg = _message(read_trace, tmp_path / "s")
    assert "b.parquet: field 'model'" in msg and "a.parquet" in msg
    write_trace(a, tmp_path / "s" / "b.parquet", overwrite=True)  # the same prompts again
    msg = _message(read_trace, tmp_path / "s")
    assert msg.startswith(str(tmp_path / "s" / "b.parquet") + ": field 'prompt': prompt 0 is "
                          "also in " + str(tmp_path / "s" / "a.parquet"))


# --- parts writer and the synthesizer ----------------------------------------------------------
def test_parts_write_the_same_file_as_one_trace(tmp_path):
    tr = synthesize(SMALL, prompts=5, tokens=6, seed=9, description="d")
    write_trace_parts(synthesize_parts(SMALL, prompts=5, tokens=6, seed=9, description="d",
                                       part_rows=40), tmp_path / "p.parquet")
    same_trace(read_trace(tmp_path / "p.parquet"), tr)


def test_parts_out_of_order_or_mixed_are_refused(tmp_path):
    a, b = list(synthesize_parts(SMALL, prompts=4, tokens=2, seed=1, part_rows=12))
    msg = _message(write_trace_parts, [b, a], tmp_path / "x.parquet")
    assert "ascending prompt ids" in msg and not (tmp_path / "x.parquet").exists()
    c = dataclasses.replace(b, description="other")
    assert "metadata" in _message(write_trace_parts, [a, c], tmp_path / "x.parquet")
    assert "no parts" in _message(write_trace_parts, [], tmp_path / "x.parquet")
    assert not list(tmp_path.iterdir())


def test_a_prompt_does_not_depend_on_how_many_are_made():
    few = synthesize(SMALL, prompts=2, tokens=5, seed=4)
    many = synthesize(SMALL, prompts=7, tokens=5, seed=4)
    np.testing.assert_array_equal(few.routed, many.routed[:10])
    np.testing.assert_array_equal(few.predicted, many.predicted[:10])
    np.testing.assert_array_equal(few.context, many.context[:10])


def test_heavy_skew_falls_back_to_popularity_order():
    g = dataclasses.replace(SMALL, n_experts=8, top_k=4)
    tr = synthesize(g, prompts=1, tokens=3, seed=0, skew=2000.0, reuse=0.0)
    # weights beyond the first rank underflow to 0: the draws take the most popular free ids
    counts = tr.popularity
    assert (np.sort(counts, axis=1)[:, ::-1][:, :4] == 3).all()


# --- reservoir sampling -------------------------------------------------------------------------
def test_reservoir_known_cases():
    assert reservoir_sample([np.arange(5)], 10, 0).tolist() == [0, 1, 2, 3, 4]
    a = reservoir_sample([np.arange(100, 140)], 5, 3)
    assert len(set(a.tolist())) == 5 and a.tolist() == sorted(a.tolist())
    assert np.array_equal(a, reservoir_sample([np.arange(100, 140)], 5, 3))
    with pytest.raises(CopeInputError):
        reservoir_sample([np.arange(3)], 0, 0)


def test_reservoir_does_not_depend_on_chunking():
    ids = np.arange(1000, 1100)
    whole = reservoir_sample([ids], 7, 11)
    assert np.array_equal(whole, reservoir_sample(np.array_split(ids, 9), 7, 11))


def test_reservoir_is_uniform():
    """Every 2-subset of 6 items equally likely: chi-square over 3,000 samples."""
    pairs = {p: 0 for p in itertools.combinations(range(6), 2)}
    for seed in range(3000):
        pairs[tuple(reservoir_sample([np.arange(3), np.arange(3, 6)], 2, seed).tolist())] += 1
    assert sps.chisquare(list(pairs.values())).pvalue > 1e-3


def test_cope_trace_sample(tmp_path, capsys):
    tr = synthesize(SMALL, prompts=20, tokens=3, seed=5)
    for i, p in enumerate(synthesize_parts(SMALL, prompts=20, tokens=3, seed=5, part_rows=45)):
        write_trace(p, tmp_path / "big" / f"{i:02d}.parquet")
    out = tmp_path / "s.parquet"
    assert main(["trace", "sample", str(tmp_path / "big"), "--prompts", "6", "--seed", "2",
                 "-o", str(out)]) == 0
    assert "6 of 20 prompts (18 of 60 decode tokens)" in capsys.readouterr().out
    s = read_trace(out)
    chosen = reservoir_sample([np.arange(20)], 6, 2)
    assert s.prompt_ids.tolist() == chosen.tolist()
    rows = np.concatenate([np.arange(3 * p, 3 * p + 3) for p in chosen])
    np.testing.assert_array_equal(s.routed, tr.routed[rows])
    assert "sample of 6 of 20 prompts (reservoir, seed 2)" in s.description
    assert main(["trace", "sample", str(tmp_path / "big"), "--prompts", "6", "-o",
                 str(out)]) == 2  # no --force: nothing overwritten


# --- hot set ------------------------------------------------------------------------------------
def _trace_of(routed: np.ndarray) -> Trace:
    n, L, k = routed.shape
    g = dataclasses.replace(tiny_geometry(), n_layers=L, n_experts=8, top_k=k)
    return Trace(model=g, prompt_ids=np.array([0], np.int32),
                 prompt_start=np.array([0, n], np.int64), context=np.zeros(n, np.int32),
                 routed=routed.astype(np.int16), predicted=np.empty((n, L, 0), np.int16))


def test_hot_set_known_answers():
    # every token routes experts 0 and 1 of 8: a 25 % cache (2 experts) catches all of them
    hot = hot_set(_trace_of(np.tile([[[0, 1]]], (10, 1, 1))))
    assert hot.ks == (1, 2, 4) and hot.caught == (0.5, 1.0, 1.0)
    assert hot.uniform == (0.125, 0.25, 0.5) and hot.kind == "pays"
    assert hot.verdict.startswith("a 25 % cache (2 of 8 experts per layer) catches 100% of "
                                  "routed experts, 4.0x uniform: caching pays")
    # each expert equally often: the cache catches exactly its uniform share
    flat = hot_set(_trace_of(np.array([[[2 * i % 8, (2 * i + 1) % 8]] for i in range(8)])))
    assert flat.caught == (0.125, 0.25, 0.5) and flat.kind == "none"
    assert flat.verdict.startswith("no exploitable hot set: a 25 % cache (2 of 8 experts per "
                                   "layer) catches 25% against 25% uniform")
    # from a calibration that ranks other experts first, the same hot trace gains nothing
    cal = _trace_of(np.tile([[[6, 7]]], (4, 1, 1)))
    assert hot_set(_trace_of(np.tile([[[0, 1]]], (10, 1, 1))), cal).caught[1] == 0.0


def test_stats_json_has_the_hot_set(tmp_path, capsys):
    write_trace(synthesize(SMALL, prompts=2, tokens=10, seed=1, skew=1.5), tmp_path / "t.parquet")
    assert main(["trace", "stats", str(tmp_path / "t.parquet"), "--json"]) == 0
    hs = json.loads(capsys.readouterr().out)["hot_set"]
    assert hs["kind"] == "pays" and [c["experts_per_layer"] for c in hs["caches"]] == [6, 16, 32]
    assert main(["trace", "stats", str(tmp_path / "t.parquet")]) == 0
    assert "hot set: a 25 % cache (16 of 64 experts per layer)" in capsys.readouterr().out


def test_a_calibration_trace_of_the_same_synthetic_model():
    """Same seed, other prompt ids: the same popularity ranking (a hot set the calibration finds),
    other routing; a different seed is another model, whose ranking tells nothing."""
    g = get_model("qwen3-30b-a3b").with_layers(4)
    tr = synthesize(g, prompts=8, tokens=64, seed=7, skew=1.0)
    cal = synthesize(g, prompts=8, tokens=64, seed=7, skew=1.0, first_prompt=8)
    other = synthesize(g, prompts=8, tokens=64, seed=8, skew=1.0)
    assert cal.prompt_ids.tolist() == list(range(8, 16))
    assert not np.array_equal(cal.routed, tr.routed)
    same, foreign = hot_set(tr, cal), hot_set(tr, other)
    assert same.kind == "pays" and same.caught[1] > 0.45
    assert foreign.caught[1] < 0.35
    np.testing.assert_array_equal(cal.routed[:64], synthesize(g, prompts=9, tokens=64, seed=7,
                                                              skew=1.0).routed[-64:])


def test_the_hot_set_table_in_the_docs_is_current():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "hot_sets.py"
    spec = importlib.util.spec_from_file_location("hot_sets", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc, now = mod.doc_rows(), mod.rows()
    if not mod.REALDATA.is_dir():  # the real trace is not shipped: compare the shipped rows
        doc = [r for r in doc if not r.startswith(mod.REAL_ROW)]
    assert doc == now
