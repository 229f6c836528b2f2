"""Round trips and every malformed-input case of cope_core.parquet_io."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import put, raw, tiny_geometry, tiny_measurements, tiny_profile, tiny_trace

from cope_core.errors import CopeInputError
from cope_core.parquet_io import (
    Measurements,
    detect_schema,
    read_measurements,
    read_metadata,
    read_profile,
    read_trace,
    write_measurements,
    write_profile,
    write_trace,
)
from cope_core.profile.data import Profile

TRACE_ARRAYS = ("prompt_ids", "prompt_start", "context", "routed", "predicted")


# --- helpers ------------------------------------------------------------------------------------
def edit_rows(table: pa.Table, fn) -> pa.Table:
    """Apply ``fn`` to the table as a list of row dicts, keeping the column types."""
    rows = table.to_pylist()
    rows = fn(rows) or rows
    return pa.Table.from_pylist(rows, schema=table.schema)


def set_col(table: pa.Table, name: str, array) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, array)


def expect_error(reader, path: Path, field: str | None, *needles: str) -> str:
    with pytest.raises(CopeInputError) as info:
        reader(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    if field is not None:
        assert f"field '{field}'" in msg, msg
        assert info.value.field == field
    for needle in needles:
        assert needle in msg, msg
    return msg


@pytest.fixture
def trace_file(tmp_path) -> Path:
    path = tmp_path / "trace.parquet"
    write_trace(tiny_trace(), path)
    return path


@pytest.fixture
def profile_file(tmp_path) -> Path:
    path = tmp_path / "profile.parquet"
    write_profile(tiny_profile(), path)
    return path


@pytest.fixture
def measurements_file(tmp_path) -> Path:
    path = tmp_path / "measurements.parquet"
    write_measurements(tiny_measurements(), path)
    return path


# --- round trips --------------------------------------------------------------------------------
def test_trace_round_trip(tmp_path):
    trace = tiny_trace()
    path = tmp_path / "sub" / "dir" / "t.parquet"  # parents are created
    write_trace(trace, path)
    back = read_trace(path)
    for name in TRACE_ARRAYS:
        a, b = getattr(trace, name), getattr(back, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    assert back.metadata() == trace.metadata()
    assert back.model == trace.model and back.path == str(path)
    assert read_metadata(path) == trace.metadata()
    assert detect_schema(path) == "cope.trace/1"


def test_trace_file_layout(trace_file):
    table = pq.read_table(trace_file)
    assert table.column_names == ["prompt", "token", "layer", "context", "routed", "predicted"]
    assert table.schema.field("layer").type == pa.int16()
    assert table.schema.field("routed").type.value_type == pa.int16()
    assert table.num_rows == 5 * 3
    assert table.column("prompt").to_pylist()[:6] == [3] * 6
    assert table.column("token").to_pylist()[:6] == [0, 0, 0, 1, 1, 1]
    assert table.column("layer").to_pylist()[:6] == [0, 1, 2, 0, 1, 2]
    assert table.column("predicted").to_pylist()[:3] == [[2, 3], [4], []]


def test_trace_without_predictions_round_trips(tmp_path):
    t = tiny_trace()
    bare = type(t)(model=t.model, prompt_ids=t.prompt_ids, prompt_start=t.prompt_start,
                   context=t.context, routed=t.routed,
                   predicted=np.zeros(t.routed.shape[:2] + (0,), np.int16), predictor=None)
    write_trace(bare, tmp_path / "b.parquet")
    back = read_trace(tmp_path / "b.parquet")
    assert back.predicted.shape == (5, 3, 0) and back.predictor is None


def test_prompts_written_in_id_order(tmp_path):
    t = tiny_trace()
    swapped = type(t)(model=t.model, prompt_ids=np.array([7, 3], np.int32),
                      prompt_start=np.array([0, 3, 5], np.int64), context=t.context,
                      routed=t.routed, predicted=t.predicted)
    write_trace(swapped, tmp_path / "s.parquet")
    back = read_trace(tmp_path / "s.parquet")
    assert back.prompt_ids.tolist() == [3, 7] and back.prompt_start.tolist() == [0, 2, 5]
    order = [3, 4, 0, 1, 2]
    assert np.array_equal(back.routed, t.routed[order])
    assert np.array_equal(back.predicted, t.predicted[order])
    assert np.array_equal(back.context, t.context[order])


def test_large_trace_round_trip(tmp_path):
    from cope_core.geometry import get_model
    from cope_core.trace.data import Trace
    g = get_model("deepseek-v2-lite")
    n, rng = 4000, np.random.default_rng(1)
    routed = np.argsort(rng.random((n, g.n_layers, g.n_experts)), axis=2)[:, :, :g.top_k]
    pred = np.argsort(rng.random((n, g.n_layers, g.n_experts)), axis=2)[:, :, :3]
    pred[:, -1] = -1
    pred[::2, :, 1:] = -1
    starts = np.arange(0, n + 1, 400, dtype=np.int64)
    t = Trace(model=g, prompt_ids=np.arange(len(starts) - 1, dtype=np.int32), prompt_start=starts,
              context=(np.arange(n) % 400 + 32).astype(np.int32),
              routed=routed.astype(np.int16), predicted=pred.astype(np.int16))
    write_trace(t, tmp_path / "big.parquet")
    back = read_trace(tmp_path / "big.parquet")
    for name in TRACE_ARRAYS:
        assert np.array_equal(getattr(t, name), getattr(back, name)), name


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_random_trace_round_trip(tmp_path_factory, data):
    import dataclasses

    from cope_core.trace.data import Trace
    L, E = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 9))
    k, W = data.draw(st.integers(1, E)), data.draw(st.integers(0, E))
    counts = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    n = sum(counts)
    order = np.argsort(rng.random((n, L, E)), axis=2).astype(np.int16)
    pred = order[:, :, ::-1][:, :, :W].copy()
    pred[rng.random((n, L, W)).cumsum(axis=2) > 0.6 * W] = -1  # ragged suffix padding
    pred[:, L - 1] = -1
    g = dataclasses.replace(tiny_geometry(), n_layers=L, n_experts=E, top_k=k)
    t = Trace(model=g, prompt_ids=np.arange(len(counts), dtype=np.int32) * 5,
              prompt_start=np.r_[0, np.cumsum(counts)].astype(np.int64),
              context=rng.integers(0, 1000, n).astype(np.int32),
              routed=order[:, :, :k].copy(), predicted=pred)
    path = tmp_path_factory.mktemp("rt") / "t.parquet"
    write_trace(t, path)
    back = read_trace(path)
    width = int((pred >= 0).sum(axis=2).max())
    assert np.array_equal(back.predicted, pred[:, :, :width])
    for name in TRACE_ARRAYS[:-1]:
        assert np.array_equal(getattr(t, name), getattr(back, name)), name


def test_profile_round_trip(tmp_path):
    prof = tiny_profile()
    write_profile(prof, tmp_path / "p.parquet")
    back = read_profile(tmp_path / "p.parquet")
    pd.testing.assert_frame_equal(back.table, prof.table)
    assert back.metadata() == prof.metadata()
    assert back.operating_points() == [(4, 50.0), (8, 100.0)]
    assert back.resolve().schedule.shape == (4, 3, 3)


def test_write_profile_casts_loose_dtypes(tmp_path):
    prof = tiny_profile()
    loose = prof.table.astype({c: "int64" for c in ("hits", "cpu", "staged", "count", "context",
                                                    "cpu_threads", "samples")})
    loose = loose.astype({"gpu_share": "float64", "kind": "category"})
    write_profile(Profile(table=loose, model=prof.model, platform=prof.platform),
                  tmp_path / "p.parquet")
    pd.testing.assert_frame_equal(read_profile(tmp_path / "p.parquet").table, prof.table)
    assert detect_schema(tmp_path / "p.parquet") == "cope.profile/1"


def test_profile_hand_costs(tmp_path):
    prof = tiny_profile({("schedule", "parallel", 0, 2, 0, -1): 7.0,
                         (4, 50.0, "layer", "gpu_layer", -1, -1, -1, -1): 99.0})
    write_profile(prof, tmp_path / "p.parquet")
    back = read_profile(tmp_path / "p.parquet")
    assert back.resolve(8).schedule[0, 0, 2] == 7.0 and back.resolve(8).gpu_layer == 20.0
    assert back.resolve(4).gpu_layer == 99.0
    flat = tiny_profile(lambda row: 1.0)
    assert (flat.table["median_us"] == 1.0).all()


def test_profile_analytic_absent_reads_false(profile_file, tmp_path):
    table, meta = raw(profile_file)
    meta.pop("analytic")
    assert read_profile(put(tmp_path / "x.parquet", table, meta)).analytic is False


def test_profile_accepts_wider_integer_types(profile_file, tmp_path):
    table, meta = raw(profile_file)
    table = set_col(table, "hits", table.column("hits").cast(pa.int64()))
    table = set_col(table, "samples", table.column("samples").cast(pa.uint8()))
    back = read_profile(put(tmp_path / "x.parquet", table, meta))
    assert back.table["hits"].dtype == np.int16 and back.table["samples"].dtype == np.int32


def test_measurements_round_trip(tmp_path):
    m = tiny_measurements()
    write_measurements(m, tmp_path / "m.parquet")
    back = read_measurements(tmp_path / "m.parquet")
    assert isinstance(back, Measurements)
    pd.testing.assert_frame_equal(back.table, m.table)
    assert back.metadata() == m.metadata() and back.model == tiny_geometry()


# --- file-level problems ------------------------------------------------------------------------
@pytest.mark.parametrize("reader", [read_trace, read_profile, read_measurements, read_metadata])
def test_missing_file(tmp_path, reader):
    expect_error(reader, tmp_path / "nope.parquet", None, "not found")


def test_not_parquet(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_text("prompt,token\n0,0\n")
    expect_error(read_trace, path, None, "not a readable Parquet file")


def test_truncated(trace_file):
    data = trace_file.read_bytes()
    trace_file.write_bytes(data[: len(data) // 2])
    expect_error(read_trace, trace_file, None, "not a readable Parquet file")


def test_directory(tmp_path):
    expect_error(read_profile, tmp_path, None, "not a file")
    # a folder is a sharded trace: an empty one says what it should hold
    expect_error(read_trace, tmp_path, None, "no .parquet files")


def test_no_cope_metadata(trace_file):
    table, _ = raw(trace_file)
    expect_error(read_trace, put(trace_file, table, None), "cope", "cope.trace/1")


def test_bad_json(trace_file):
    table, _ = raw(trace_file)
    pq.write_table(table.replace_schema_metadata({b"cope": b"{not json"}), trace_file)
    expect_error(read_trace, trace_file, "cope", "not valid JSON")


def test_metadata_without_schema(trace_file):
    table, meta = raw(trace_file)
    meta.pop("schema")
    expect_error(read_trace, put(trace_file, table, meta), "cope.schema")


def test_wrong_schema_version(trace_file):
    table, meta = raw(trace_file)
    meta["schema"] = "cope.trace/2"
    expect_error(read_trace, put(trace_file, table, meta), "schema", "'cope.trace/2'",
                 "expected cope.trace/1")


def test_profile_where_trace_expected(profile_file):
    expect_error(read_trace, profile_file, "schema",
                 "this is a cope.profile/1 file, expected cope.trace/1")


def test_trace_where_profile_expected(trace_file):
    expect_error(read_profile, trace_file, "schema",
                 "this is a cope.trace/1 file, expected cope.profile/2 or cope.profile/1")


def test_trace_where_measurements_expected(trace_file):
    expect_error(read_measurements, trace_file, "schema", "expected cope.measurements/1")


def test_geometry_missing_key(trace_file):
    table, meta = raw(trace_file)
    del meta["model"]["top_k"]
    expect_error(read_trace, put(trace_file, table, meta), "model", "top_k")


def test_geometry_missing(trace_file):
    table, meta = raw(trace_file)
    del meta["model"]
    expect_error(read_trace, put(trace_file, table, meta), "model", "missing key")


def test_bad_trace_source(trace_file):
    table, meta = raw(trace_file)
    meta["source"] = "invented"
    expect_error(read_trace, put(trace_file, table, meta), "source", "'invented'")


def test_bad_predictor_type(trace_file):
    table, meta = raw(trace_file)
    meta["predictor"] = "oracle"
    expect_error(read_trace, put(trace_file, table, meta), "predictor", "a JSON object or null")


# --- trace columns ------------------------------------------------------------------------------
def test_missing_column(trace_file):
    table, meta = raw(trace_file)
    expect_error(read_trace, put(trace_file, table.drop_columns(["context"]), meta), "context",
                 "missing column")


@pytest.mark.parametrize("name,array", [
    ("layer", lambda t: t.column("layer").cast(pa.float64())),
    ("prompt", lambda t: t.column("prompt").cast(pa.string())),
    ("routed", lambda t: t.column("routed").cast(pa.list_(pa.float32()))),
    ("predicted", lambda t: pa.array([["a"]] * t.num_rows)),
])
def test_wrong_column_type(trace_file, name, array):
    table, meta = raw(trace_file)
    expect_error(read_trace, put(trace_file, set_col(table, name, array(table)), meta), name,
                 "expected")


def test_all_empty_predicted_of_null_item_type_reads_as_no_predictions(trace_file, tmp_path):
    table, meta = raw(trace_file)
    empty = pa.Table.from_pandas(pd.DataFrame({"p": [[]] * table.num_rows})).column("p")
    assert str(empty.type) == "list<item: null>"          # what pandas infers for [[], [], ...]
    back = read_trace(put(tmp_path / "n.parquet", set_col(table, "predicted", empty), meta))
    ints = pa.array([[]] * table.num_rows, pa.list_(pa.int16()))
    ref = read_trace(put(tmp_path / "i.parquet", set_col(table, "predicted", ints), meta))
    assert back.predicted.shape == ref.predicted.shape == (5, 3, 0)
    assert back.predicted.dtype == np.int16
    assert np.array_equal(back.routed, tiny_trace().routed)


@pytest.mark.parametrize("lists,item,says", [
    ([[None]] + [[]] * 14, pa.null(), "row 0: null id inside the list, expected int16"),
    ([[]] * 15, pa.string(), "column type list<element: string>, expected list<int16>"),
    ([[]] * 14 + [["a"]], pa.string(), "column type list<element: string>, expected list<int16>"),
    ([[2.0]] + [[]] * 14, pa.float64(), "column type list<element: double>, expected list<int16>"),
])
def test_predicted_of_other_item_types_is_refused(trace_file, lists, item, says):
    table, meta = raw(trace_file)
    arr = pa.array(lists, pa.list_(item))
    msg = expect_error(read_trace, put(trace_file, set_col(table, "predicted", arr), meta),
                       "predicted")
    assert msg == f"{trace_file}: field 'predicted': {says}"


def test_wider_integer_types_are_accepted(trace_file, tmp_path):
    table, meta = raw(trace_file)
    table = set_col(table, "layer", table.column("layer").cast(pa.int64()))
    table = set_col(table, "context", table.column("context").cast(pa.uint16()))
    table = set_col(table, "routed", table.column("routed").cast(pa.large_list(pa.int32())))
    back = read_trace(put(tmp_path / "w.parquet", table, meta))
    assert np.array_equal(back.routed, tiny_trace().routed) and back.context.dtype == np.int32


def test_integer_that_does_not_fit(trace_file):
    table, meta = raw(trace_file)
    ctx = np.array(table.column("context").to_pylist(), np.int64)
    ctx[4] = 2**40
    expect_error(read_trace, put(trace_file, set_col(table, "context", pa.array(ctx)), meta),
                 "context", "row 4", "int32")


def test_null_value(trace_file):
    table, meta = raw(trace_file)
    ctx = table.column("context").to_pylist()
    ctx[7] = None
    expect_error(read_trace, put(trace_file, set_col(table, "context", pa.array(ctx, pa.int32())),
                                 meta), "context", "row 7", "null")


def test_null_inside_list(trace_file):
    table, meta = raw(trace_file)
    routed = table.column("routed").to_pylist()
    routed[5] = [1, None]
    arr = pa.array(routed, pa.list_(pa.int16()))
    expect_error(read_trace, put(trace_file, set_col(table, "routed", arr), meta), "routed",
                 "row 5", "null")


def test_empty_trace(trace_file):
    table, meta = raw(trace_file)
    expect_error(read_trace, put(trace_file, table.slice(0, 0), meta), "prompt", "no rows")


# --- trace rows ---------------------------------------------------------------------------------
def _edit(trace_file, fn):
    table, meta = raw(trace_file)
    return put(trace_file, edit_rows(table, fn), meta)


def _set(i, **values):
    def fn(rows):
        rows[i].update(values)
    return fn


def test_layer_out_of_range(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(2, layer=3)), "layer", "row 2", "0..2")


def test_routed_id_out_of_range(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(4, routed=[3, 6])), "routed", "row 4",
                 "[3, 6]", "0..5")


def test_routed_negative_id(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(0, routed=[-1, 2])), "routed", "row 0")


def test_routed_wrong_length(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(6, routed=[1, 2, 3])), "routed", "row 6",
                 "top_k = 2")


def test_routed_duplicated(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(9, routed=[4, 4])), "routed", "row 9",
                 "duplicated", "[4, 4]")


def test_predicted_out_of_range(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(3, predicted=[1, 17])), "predicted",
                 "row 3", "17", "0..5")


def test_predicted_not_distinct(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(3, predicted=[2, 1, 2])), "predicted",
                 "row 3", "duplicated", "[2, 1, 2]")


def test_predicted_at_last_layer(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(5, predicted=[0])), "predicted", "row 5",
                 "last layer")


def test_rows_not_sorted(trace_file):
    def swap(rows):
        rows[3], rows[6] = rows[6], rows[3]
    expect_error(read_trace, _edit(trace_file, swap), "token",
                 "row 4 (prompt 3, token 1, layer 1) follows row 3 (prompt 3, token 2, layer 0)",
                 "sorted")


def test_prompts_not_sorted(trace_file):
    def move(rows):
        return rows[9:] + rows[:9]
    expect_error(read_trace, _edit(trace_file, move), "prompt", "row 6", "sorted")


def test_layers_not_sorted(trace_file):
    def swap(rows):
        rows[0], rows[1] = rows[1], rows[0]
    expect_error(read_trace, _edit(trace_file, swap), "layer", "row 1", "sorted")


def test_missing_middle_layer(trace_file):
    def drop(rows):
        del rows[4]  # prompt 3, token 1, layer 1
    expect_error(read_trace, _edit(trace_file, drop), "layer", "row 4", "layer 1 is missing")


def test_missing_last_layer(trace_file):
    def drop(rows):
        del rows[14]  # prompt 7, token 1, layer 2: the file's final row
    expect_error(read_trace, _edit(trace_file, drop), "layer", "row 13", "layer 2 is missing")


def test_duplicated_layer(trace_file):
    def dup(rows):
        rows.insert(5, dict(rows[4]))
    expect_error(read_trace, _edit(trace_file, dup), "layer", "row 5", "duplicates")


def test_tokens_not_from_zero(trace_file):
    def shift(rows):
        for r in rows[9:]:
            r["token"] += 1
    expect_error(read_trace, _edit(trace_file, shift), "token", "row 9", "token 1, expected 0")


def test_tokens_with_gap(trace_file):
    def gap(rows):
        for r in rows[12:]:
            r["token"] = 2
    expect_error(read_trace, _edit(trace_file, gap), "token", "row 12", "token 2, expected 1")


def test_context_differs_between_layers(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(8, context=99)), "context", "row 8",
                 "context 99")


def test_negative_context(trace_file):
    expect_error(read_trace, _edit(trace_file, _set(0, context=-5)), "context", "row 0")


# --- profile rows -------------------------------------------------------------------------------
def _edit_profile(profile_file, i, **values):
    table, meta = raw(profile_file)
    return put(profile_file, edit_rows(table, _set(i, **values)), meta)


@pytest.mark.parametrize("col", ["median_us", "p25_us", "p75_us"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_profile_bad_cost(profile_file, col, value):
    expect_error(read_profile, _edit_profile(profile_file, 3, **{col: value}), col, "row 3",
                 "non-negative")


def test_profile_samples_below_one(profile_file):
    expect_error(read_profile, _edit_profile(profile_file, 2, samples=0), "samples", "row 2")


def test_profile_unknown_kind(profile_file):
    expect_error(read_profile, _edit_profile(profile_file, 5, kind="magic"), "kind", "row 5",
                 "'magic'")


def test_profile_unknown_name(profile_file):
    expect_error(read_profile, _edit_profile(profile_file, 0, name="paralel"), "name", "row 0",
                 "'paralel'")


def test_profile_sentinel_column(profile_file):
    # row 0 is a schedule row; context is not used there and must be -1
    expect_error(read_profile, _edit_profile(profile_file, 0, context=128), "context", "row 0",
                 "-1")


def test_profile_schedule_counts_must_sum_to_top_k(profile_file):
    expect_error(read_profile, _edit_profile(profile_file, 0, hits=1, cpu=2), "hits", "row 0",
                 "top_k = 2")


def test_profile_bad_gpu_share(profile_file):
    expect_error(read_profile, _edit_profile(profile_file, 1, gpu_share=0.0), "gpu_share",
                 "row 1")


def test_profile_duplicate_key(profile_file):
    table, meta = raw(profile_file)

    def dup(rows):
        rows.append(dict(rows[2], median_us=1.0))
    n = table.num_rows
    expect_error(read_profile, put(profile_file, edit_rows(table, dup), meta), "kind",
                 f"row {n} repeats row 2")


@pytest.mark.parametrize("drop", [0, 30])
def test_profile_missing_required_row(profile_file, drop):
    table, meta = raw(profile_file)

    def remove(rows):
        del rows[drop]
    expect_error(read_profile, put(profile_file, edit_rows(table, remove), meta), "kind",
                 "required rows missing")


def test_profile_missing_shared(tmp_path):
    prof = tiny_profile(contexts=())
    with pytest.raises(CopeInputError, match="shared/decode"):
        write_profile(prof, tmp_path / "p.parquet")


def test_profile_wrong_cost_type(profile_file):
    table, meta = raw(profile_file)
    table = set_col(table, "median_us", table.column("median_us").cast(pa.string()))
    expect_error(read_profile, put(profile_file, table, meta), "median_us", "expected float64")


def test_profile_float_in_integer_column(profile_file):
    table, meta = raw(profile_file)
    table = set_col(table, "samples", table.column("samples").cast(pa.float64()))
    expect_error(read_profile, put(profile_file, table, meta), "samples", "expected int32")


def test_profile_empty(profile_file):
    table, meta = raw(profile_file)
    expect_error(read_profile, put(profile_file, table.slice(0, 0), meta), "kind", "no rows")


def test_profile_missing_platform(profile_file):
    table, meta = raw(profile_file)
    del meta["platform"]
    expect_error(read_profile, put(profile_file, table, meta), "platform")


# --- measurements -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0.0, -3.0, float("nan"), float("inf")])
def test_measurement_bad_tpot(measurements_file, value):
    table, meta = raw(measurements_file)
    path = put(measurements_file, edit_rows(table, _set(6, tpot_us=value)), meta)
    expect_error(read_measurements, path, "tpot_us", "row 6", "positive")


def test_measurement_unknown_candidate(measurements_file):
    table, meta = raw(measurements_file)
    path = put(measurements_file, edit_rows(table, _set(1, candidate="fixed/teleport")), meta)
    expect_error(read_measurements, path, "candidate", "row 1", "'fixed/teleport'")


def test_measurement_K_out_of_range(measurements_file):
    table, meta = raw(measurements_file)
    path = put(measurements_file, edit_rows(table, _set(2, K=7)), meta)
    expect_error(read_measurements, path, "K", "row 2", "0..6")


def test_measurement_duplicate(measurements_file):
    table, meta = raw(measurements_file)

    def dup(rows):
        rows[1]["trial"] = 0
    path = put(measurements_file, edit_rows(table, dup), meta)
    expect_error(read_measurements, path, "trial", "row 1 repeats row 0")


def test_measurement_geometry_missing_key(measurements_file):
    table, meta = raw(measurements_file)
    del meta["model"]["n_experts"]
    expect_error(read_measurements, put(measurements_file, table, meta), "model", "n_experts")


# --- writing ------------------------------------------------------------------------------------
def test_refuses_to_overwrite(trace_file):
    before = trace_file.read_bytes()
    with pytest.raises(CopeInputError) as info:
        write_trace(tiny_trace(), trace_file)
    msg = str(info.value)
    assert str(trace_file) in msg and "--force" in msg and "\n" not in msg
    assert trace_file.read_bytes() == before


def test_overwrite_replaces(profile_file):
    write_profile(tiny_profile(lambda row: 2.0), profile_file, overwrite=True)
    assert (read_profile(profile_file).table["median_us"] == 2.0).all()


def test_failed_write_leaves_original(profile_file):
    before = profile_file.read_bytes()
    bad = tiny_profile()
    bad.table.loc[4, "median_us"] = -1.0
    with pytest.raises(CopeInputError, match="median_us"):
        write_profile(bad, profile_file, overwrite=True)
    assert profile_file.read_bytes() == before
    assert os.listdir(profile_file.parent) == [profile_file.name]  # no temp file left behind


def test_unserialisable_metadata_leaves_original(measurements_file):
    before = measurements_file.read_bytes()
    m = tiny_measurements()
    m = Measurements(table=m.table, model=m.model, platform={"bad": float("nan")})
    with pytest.raises(CopeInputError, match="cope"):
        write_measurements(m, measurements_file, overwrite=True)
    assert measurements_file.read_bytes() == before
    assert os.listdir(measurements_file.parent) == [measurements_file.name]


def test_write_measurements_rejects_unknown_candidate(tmp_path):
    m = tiny_measurements()
    m.table.loc[0, "candidate"] = "nonsense"
    with pytest.raises(CopeInputError, match="candidate"):
        write_measurements(m, tmp_path / "m.parquet")
    assert not (tmp_path / "m.parquet").exists()
