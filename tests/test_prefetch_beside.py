"""A prefetch priced beside the CPU experts of its layer: the optional ``prefetch`` rows with
``cpu = c`` (docs/formats.md), their interpolation, COPE's per-execution charge, and the
fallback to the resident-layer row for profiles without them."""
from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from tiny import TINY_OPERATING_POINTS, tiny_geometry, tiny_profile, tiny_trace

from cope_core import parquet_io, predict
from cope_core.errors import CopeInputError
from cope_core.estimate.costs import atomic_costs, cope_costs
from cope_core.profile.data import Profile, beside_counts, beside_keys

MPL, MCL = "mutable_per_layer", "mutable_cross_layer"
OP = TINY_OPERATING_POINTS[0]


def _ops(beside: dict[int, float]) -> dict:
    """q = 0 costs 5, q = 1 beside a resident layer 100, beside c CPU misses ``beside[c]``."""
    ops = {}
    for r in (MPL, MCL):
        ops[("prefetch", r, -1, -1, -1, 0)] = 5.0
        ops[("prefetch", r, -1, -1, -1, 1)] = 100.0
        for c, v in beside.items():
            ops[("prefetch", r, -1, c, -1, 1)] = v
    return ops


def _drop(prof: Profile, c: int) -> Profile:
    t = prof.table
    keep = ~((t["kind"] == "prefetch") & (t["cpu"] == c))
    return replace(prof, table=t[keep].reset_index(drop=True))


def test_beside_counts_are_half_and_all_the_routed_experts():
    assert beside_counts(1) == [1]
    assert beside_counts(2) == [1, 2]
    assert beside_counts(6) == [3, 6]
    assert beside_counts(8) == [4, 8]
    assert len(beside_keys(2)) == 4            # two residencies x two counts


def test_measured_counts_are_taken_and_others_interpolated():
    prof = tiny_profile(_ops({1: 130.0, 2: 190.0}), beside=True)
    op = prof.resolve(*OP)
    np.testing.assert_array_equal(op.prefetch_beside[MPL], [100.0, 130.0, 190.0])
    only_all = _drop(prof, 1).resolve(*OP)                 # c = 1 halfway between 0 and 2
    np.testing.assert_array_equal(only_all.prefetch_beside[MCL], [100.0, 145.0, 190.0])
    only_half = _drop(prof, 2).resolve(*OP)                # beyond the highest: held
    np.testing.assert_array_equal(only_half.prefetch_beside[MCL], [100.0, 130.0, 130.0])
    none = tiny_profile(_ops({})).resolve(*OP)             # no rows: the resident-layer cost
    np.testing.assert_array_equal(none.prefetch_beside[MPL], [100.0, 100.0, 100.0])


def test_cope_charges_each_execution_beside_its_cpu_experts():
    prof = tiny_profile(_ops({1: 130.0, 2: 190.0}), beside=True)
    op = prof.resolve(*OP)
    lc = cope_costs(op)
    k = tiny_geometry().top_k
    for r in (MPL, MCL):
        ins = lc.pf_insert[r]
        # parallel: every miss on the CPU (c = k - h), less the q = 0 step
        np.testing.assert_array_equal(ins[0], [190.0 - 5, 130.0 - 5, 100.0 - 5])
        np.testing.assert_array_equal(ins[1], [95.0] * (k + 1))       # wait_then_gpu
        np.testing.assert_array_equal(ins[2], [95.0] * (k + 1))       # ready_first
        want = [[100.0, 130.0, 190.0][c] - 5 for c in lc.split]       # cost_selected's share
        np.testing.assert_array_equal(ins[3], want)
        assert lc.pf_step[r] == 5.0
    # the atomic simulation keeps its isolated op, whatever the rows beside
    assert atomic_costs(op).pf_insert[MPL].tolist() == atomic_costs(
        tiny_profile(_ops({})).resolve(*OP)).pf_insert[MPL].tolist()


def test_a_profile_without_the_rows_prices_as_before():
    lc = cope_costs(tiny_profile(_ops({})).resolve(*OP))
    np.testing.assert_array_equal(lc.pf_insert[MPL], np.full((4, 3), 95.0))


def test_prefetches_beside_cpu_misses_raise_the_mutable_parallel_tpot_only():
    tr = tiny_trace()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = predict(tr, tiny_profile(_ops({})), [2], draws=0).set_index("candidate")
        more = predict(tr, tiny_profile(_ops({1: 130.0, 2: 190.0}), beside=True), [2],
                       draws=0).set_index("candidate")
    for cand in base.index:
        res, _, exe = cand.partition("/")
        if res in (MPL, MCL) and exe in ("parallel", "cost_selected") \
                and (more.loc[cand, "prefetches"] > 0):
            assert more.loc[cand, "tpot_us"] >= base.loc[cand, "tpot_us"], cand
        elif res not in (MPL, MCL) or exe in ("wait_then_gpu", "ready_first"):
            assert more.loc[cand, "tpot_us"] == base.loc[cand, "tpot_us"], cand
    assert (more["tpot_us"] > base["tpot_us"]).any()
    # drawn profiles price the rows beside CPU misses too: every candidate's interval holds
    # its point estimate, and the mutable parallel ones moved with the rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        drawn = predict(tr, tiny_profile(_ops({1: 130.0, 2: 190.0}), beside=True), [2],
                        draws=200).set_index("candidate")
    assert (drawn["tpot_lo_us"] <= drawn["tpot_us"]).all()
    assert (drawn["tpot_us"] <= drawn["tpot_hi_us"]).all()
    np.testing.assert_array_equal(drawn["tpot_us"], more["tpot_us"])


def test_rows_beside_cpu_misses_round_trip_and_bad_ones_are_one_line(tmp_path):
    prof = tiny_profile(_ops({1: 130.0, 2: 190.0}), beside=True)
    path = tmp_path / "p.parquet"
    parquet_io.write_profile(prof, path)
    back = parquet_io.read_profile(path)
    np.testing.assert_array_equal(back.resolve(*OP).prefetch_beside[MPL], [100.0, 130.0, 190.0])
    t = prof.table
    extra = t[(t["kind"] == "prefetch") & (t["cpu"] == 2)].copy()
    extra["cpu"] = 3                                      # beyond top_k
    table = pd.concat([t, extra], ignore_index=True)
    with pytest.raises(CopeInputError) as err:
        Profile(table=table, model=prof.model, platform=prof.platform).resolve(*OP)
    assert "cpu 1..2" in str(err.value) and "\n" not in str(err.value)
    t = prof.table.copy()
    t.loc[(t["kind"] == "prefetch") & (t["cpu"] == 1), "count"] = 0
    bad = tmp_path / "bad.parquet"
    with pytest.raises(CopeInputError) as err:          # refused on write, as on read
        parquet_io.write_profile(replace(prof, table=t), bad)
    msg = str(err.value)
    assert "bad.parquet" in msg and "cpu" in msg and "count=0" in msg and "\n" not in msg
