"""Shared work per part (cope.profile/2): what a profile may price, the composition on hand-worked
numbers and the file versions. Whether a cut's profile predicts the whole model as well as the
whole model's own profile is a measurement, run by benchmarks/bench_shared_transfer.py (it was a
timed test here until it failed on an AMD EPYC VM, see that file)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest
from tiny import tiny_geometry, tiny_profile, tiny_trace

from cope_core import parquet_io
from cope_core.errors import CopeInputError
from cope_core.estimate.predict import predict
from cope_core.trace.data import Trace

G = tiny_geometry()                                   # 3 MoE layers, no dense block, top-2 of 6


def _with(trace: Trace, **geometry) -> Trace:
    return dataclasses.replace(trace, model=dataclasses.replace(trace.model, **geometry))


def _refused(fn, *args, **kw) -> str:
    with pytest.raises(CopeInputError) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


# --- what a profile may price ------------------------------------------------------------------
@pytest.mark.parametrize("key,value", [("n_heads", 8), ("n_kv_heads", 4), ("head_dim", 32),
                                       ("vocab", 1000), ("n_shared_experts", 1),
                                       ("hidden", 128), ("dtype_bytes", 4)])
@pytest.mark.parametrize("parts", [False, True])
def test_other_shapes_are_refused(key, value, parts):
    msg = _refused(predict, _with(tiny_trace(), **{key: value}), tiny_profile(parts=parts), [2])
    assert f"field 'model.{key}': profile has {key}={getattr(G, key)} but the trace's model " \
           f"has {value}" in msg


@pytest.mark.parametrize("key,value", [("n_layers", 5), ("dense_layers", 1)])
def test_whole_token_profiles_need_the_same_layer_counts(key, value):
    tr = tiny_trace()
    if key == "n_layers":  # a trace with 5 layers of routing: layers 1 and 2 again
        pred = np.concatenate([tr.predicted, tr.predicted[:, 1:]], 1)
        pred[:, -1] = -1
        tr = dataclasses.replace(tr, model=dataclasses.replace(G, n_layers=5), predicted=pred,
                                 routed=np.concatenate([tr.routed, tr.routed[:, 1:]], 1))
    else:
        tr = _with(tr, **{key: value})
    msg = _refused(predict, tr, tiny_profile(), [2])
    assert f"profile has {key}={getattr(G, key)} but the trace's model has {value} (its shared " \
           "rows are whole tokens of the profiled model: re-profile" in msg
    if key == "n_layers":          # the same trace is priced by a profile per part
        assert np.isfinite(predict(tr, tiny_profile(parts=True), [2])["tpot_us"]).all()
    else:                          # but dense blocks need a dense_block row
        msg = _refused(predict, tr, tiny_profile(parts=True), [2])
        assert "has 1 dense blocks but the profiled model has none" in msg


# --- composition -------------------------------------------------------------------------------
def test_composition_by_hand():
    # at 8 threads (scale 1): moe_block 30 + ctx/128, head 10; at 4 threads everything x2
    prof = tiny_profile(parts=True)
    op = prof.resolve(8)
    np.testing.assert_allclose(op.shared_context, [128, 1024])
    np.testing.assert_allclose(op.shared_us, [3 * 31 + 10, 3 * 38 + 10])
    five = prof.resolve(8, model=G.with_layers(5))
    np.testing.assert_allclose(five.shared_us, [5 * 31 + 10, 5 * 38 + 10])
    np.testing.assert_allclose(prof.resolve(4, model=G.with_layers(5)).shared_us,
                               [2 * (5 * 31 + 10), 2 * (5 * 38 + 10)])
    # with a dense block: dense_block 20 + ctx/256 per dense block
    gd = dataclasses.replace(G, dense_layers=1)
    dense = tiny_profile(parts=True, geometry=gd)
    np.testing.assert_allclose(dense.resolve(8, model=dataclasses.replace(gd, dense_layers=2,
                                                                          n_layers=4)).shared_us,
                               [4 * 31 + 2 * 20.5 + 10, 4 * 38 + 2 * 24 + 10])


def test_predict_prices_the_traced_layer_count():
    tr = tiny_trace()                         # contexts 10, 11, 12 (prompt 3) and 20, 21
    df = predict(tr, tiny_profile(parts=True), [2], cpu_threads=8, draws=0)
    # clamped below 128: moe_block = 31 for every token; 3 blocks + head = 103 per token
    assert df["shared_us"].tolist() == pytest.approx([103.0] * len(df))
    # the draws of the uncertainty go through the same composition: intervals around it
    dr = predict(tr, tiny_profile(parts=True), [2], cpu_threads=8, draws=200)
    assert (dr["tpot_lo_us"] <= dr["tpot_us"]).all() and (dr["tpot_us"] <= dr["tpot_hi_us"]).all()


# --- file versions -----------------------------------------------------------------------------
def test_versions_round_trip_and_must_match_their_rows(tmp_path):
    for parts, schema in ((False, "cope.profile/1"), (True, "cope.profile/2")):
        path = tmp_path / f"{parts}.parquet"
        parquet_io.write_profile(tiny_profile(parts=parts), path)
        back = parquet_io.read_profile(path)
        assert parquet_io.read_metadata(path)["schema"] == schema == back.schema
        assert back.shared_in_parts is parts
    t = pq.read_table(tmp_path / "True.parquet")
    meta = t.schema.metadata[b"cope"].replace(b"cope.profile/2", b"cope.profile/1")
    pq.write_table(t.replace_schema_metadata({b"cope": meta}), tmp_path / "bad.parquet")
    msg = _refused(parquet_io.read_profile, tmp_path / "bad.parquet")
    assert "field 'schema': a cope.profile/1 file holds per-part shared rows, which are " \
           "cope.profile/2's" in msg


@pytest.mark.parametrize("edit,says", [
    (lambda df: df[df.name != "head"], "0 shared/head rows, expected one"),
    (lambda df: df.assign(context=np.where(df.name == "head", 0, df.context)),
     "expected -1 (unused by shared/head)"),
    (lambda df: df.assign(name=np.where((df.name == "moe_block") & (df.context == 128),
                                        "decode", df.name)),
     "both shared/decode and per-part shared rows"),
])
def test_bad_part_rows(tmp_path, edit, says):
    prof = tiny_profile(parts=True)
    bad = dataclasses.replace(prof, table=edit(prof.table).reset_index(drop=True))
    assert says in _refused(parquet_io.write_profile, bad, tmp_path / "p.parquet")
