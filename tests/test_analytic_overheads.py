"""Overheads, efficiencies and GPU shares of analytic profiles, worked out by hand
(docs/design.md#overheads-and-efficiencies), and the model uncertainty they carry."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from tiny import (
    ROUND_GEOMETRY,
    ROUND_OVERHEADS,
    ROUND_SPEC,
    exact,
    row_us,
    tiny_trace,
)

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate import predict
from cope_core.platforms import PlatformSpec, platform_spec, roofline_only
from cope_core.profile import analytic as an
from cope_core.profile.analytic import analytic_profile

# launch 5, sync 10, transfer latency 2, CPU dispatch 20, half the peak on the GPU, the CPU and
# the link for weights, 4 kernels per expert group, 10 per block (tests/tiny.py)
G, SPEC, OVER = ROUND_GEOMETRY, ROUND_SPEC, ROUND_OVERHEADS
# at 4 threads: GPU expert 30 / 0.5 = 60 us, a group of n: 60 n + 4 * 5
#   CPU expert: FLOP 3e6 / (4 * 5e9 * 0.5) = 300, bytes 3e6 / (1.5e10 * 0.5) = 400 -> 400 us,
#   n experts: 400 n + 20; copy: 3e6 / (1e10 * 0.5) = 600 + 2 per expert; activation (the raw
#   link: small transfers): 2 * (0.2 + 2) = 4.4


@pytest.fixture(scope="module")
def over():
    return analytic_profile(G, OVER, cpu_threads=[4], contexts=(0,), gpu_shares=(50, 100))


def test_atomic_rows_pay_their_latency(over):
    t = over.table[over.table["gpu_share"] == 100]
    assert row_us(t, 4, "atomic", "gpu_expert", count=0) == 0.0
    assert row_us(t, 4, "atomic", "gpu_expert", count=1) == exact(80.0)
    assert row_us(t, 4, "atomic", "gpu_expert", count=2) == exact(140.0)
    assert row_us(t, 4, "atomic", "cpu_expert", count=2) == exact(820.0)
    assert row_us(t, 4, "atomic", "stage", count=2) == exact(1204.0)
    assert row_us(t, 4, "atomic", "act_copy", count=1) == exact(4.4)
    assert row_us(t, 4, "atomic", "sync", count=1) == exact(10.0)
    assert row_us(t, 4, "atomic", "merge", count=1) == exact(5.0)
    # an insertion: the slot index update (a transfer: 2) and the weights' copy
    assert row_us(t, 4, "atomic", "prefetch", count=1) == exact(604.0)


def test_schedule_rows_by_hand(over):
    t = over.table[over.table["gpu_share"] == 100]
    # parallel 1 hit + 1 CPU: max(80, 400 + 20 + 4.4) + sync 10 + merge 5
    assert row_us(t, 4, "schedule", "parallel", hits=1, cpu=1) == exact(439.4)
    # every expert resident: one launch group, nothing to join
    assert row_us(t, 4, "schedule", "parallel", hits=2, cpu=0) == exact(140.0)
    # wait-then-GPU 1 + 1: copy 602, sync 10, then both on the GPU in one group 140
    assert row_us(t, 4, "schedule", "wait_then_gpu", hits=1, cpu=0) == exact(752.0)
    # ready-first 1 + 1: max(resident 80, copy 602) + staged group 80 + sync 10
    assert row_us(t, 4, "schedule", "ready_first", hits=1, cpu=0) == exact(692.0)
    # cost-selected 0 hits, 1 CPU, 1 staged: max(424.4, 602) + 80 + 10 + 5
    assert row_us(t, 4, "schedule", "cost_selected", hits=0, cpu=1) == exact(697.0)
    # layer partition: whole layer on the CPU with its joins, or on the GPU
    assert row_us(t, 4, "layer", "cpu_layer") == exact(820.0 + 4.4 + 10 + 5)
    assert row_us(t, 4, "layer", "gpu_layer") == exact(140.0)
    # the predictor's two launches at every layer; a prefetched expert adds what its index
    # update and copy (2 + 602) outlast the resident layer (140) and the next block's shared
    # work at context 4096 (2 * 28.464 + 10 * 5 = 106.928), and the wait (10)
    assert row_us(t, 4, "prefetch", "mutable_per_layer", count=0) == exact(10.0)
    assert row_us(t, 4, "prefetch", "mutable_per_layer", count=1) == \
        exact(10.0 + 604.0 - 140.0 - 106.928 + 10.0)


def test_prefetch_beside_cpu_misses_by_hand():
    prof = analytic_profile(G, OVER, cpu_threads=[1, 4], contexts=(0,), gpu_shares=(100,))
    t = prof.table
    # every CPU-miss count has its row: computed, not interpolated
    beside = t[(t["kind"] == "prefetch") & (t["cpu"] >= 1)]
    assert sorted(set(zip(beside["cpu_threads"], beside["name"], beside["cpu"]))) == [
        (th, n, c) for th in (1, 4) for n in ("mutable_cross_layer", "mutable_per_layer")
        for c in (1, 2)]
    assert set(beside["count"]) == {1}
    # 1 thread, 1 CPU miss: the CPU expert is FLOP-bound (3e6 / 2.5e9 = 1200 us) and reads host
    # memory at 2.5 GB/s; with the copy's 5 GB/s that is the host's 7.5 GB/s, so nothing slows.
    # The lane (1200 + 20 + 4.4) outlasts the insertion (2 + 600 + 2): only the predictor (10)
    # and the wait (10) are left
    assert row_us(t, 1, "prefetch", "mutable_per_layer", cpu=1, count=1) == exact(20.0)
    # beside a fully resident layer the same copy is mostly exposed
    assert row_us(t, 1, "prefetch", "mutable_per_layer", count=1) == \
        exact(10.0 + 604.0 - 140.0 - 106.928 + 10.0)
    # 4 threads, 1 CPU miss: bytes-bound (400 us, 7.5 GB/s) + the copy's 5 GB/s = 12.5 GB/s on a
    # 7.5 GB/s host: both run at 0.6 until the CPU's 400 us of work end at 666.67; the copy's
    # remaining 200 us then run alone (end 870.67 with the two latencies). The lane grows by
    # 266.67 (424.4 -> 691.07), the layer with it; the copy outlasts the layer, its join (15)
    # and the next block (106.928) by 57.67
    lane = 424.4 + 400 / 0.6 - 400
    exposed = 400 / 0.6 + 200 + 4 - (lane + 10 + 5 + 106.928)
    assert row_us(t, 4, "prefetch", "mutable_per_layer", cpu=1, count=1) == \
        exact(10.0 + 10.0 + (lane - 424.4) + exposed)
    # 4 threads, 2 CPU misses: 800 us of CPU work at the same 12.5 GB/s demand; the copy's 600
    # us of work end first, at 600 / 0.6 = 1000 (hidden: the lane is longer), and the CPU's last
    # 200 us run alone, ending at 1200: the lane grows by 400
    assert row_us(t, 4, "prefetch", "mutable_per_layer", cpu=2, count=1) == \
        exact(10.0 + 10.0 + 400.0)
    assert row_us(t, 4, "prefetch", "mutable_cross_layer", cpu=2, count=1) == \
        row_us(t, 4, "prefetch", "mutable_per_layer", cpu=2, count=1)


def test_the_estimator_prices_a_prefetch_beside_its_cpu_misses():
    """With the rows, a parallel layer with a CPU miss pays only what its lane cannot hide."""
    from cope_core.estimate.costs import cope_costs
    prof = analytic_profile(G, OVER, cpu_threads=[1], contexts=(0,), gpu_shares=(100,))
    lc = cope_costs(prof.resolve(1, 100.0))
    ins = lc.pf_insert["mutable_per_layer"]
    # pf_insert = beside row - the predictor (charged at every layer as pf_step)
    assert lc.pf_step["mutable_per_layer"] == exact(10.0)
    assert ins[0, 1] == exact(20.0 - 10.0)                    # parallel, 1 hit, 1 CPU miss
    assert ins[0, 2] == exact(604.0 - 140.0 - 106.928 + 10.0)  # parallel, all hits
    assert ins[1, 1] == ins[0, 2]                               # wait-then-GPU: no CPU misses


def test_shared_rows_pay_their_launches(over):
    t = over.table[over.table["gpu_share"] == 100]
    # the roofline's 12.08 at half efficiency, plus 10 launches of 5
    assert row_us(t, 4, "shared", "moe_block", context=0) == exact(2 * 12.08 + 50.0)
    assert row_us(t, 4, "shared", "dense_block", context=0) == exact(2 * 72.0 + 50.0)
    # head: 2 * 10 of work, norm and LM head launches, the token's read-back synchronisation
    assert row_us(t, 4, "shared", "head") == exact(20.0 + 10.0 + 10.0)


def test_gpu_share_scales_throughput_not_latency(over):
    half = over.table[over.table["gpu_share"] == 50]
    full = over.table[over.table["gpu_share"] == 100]
    assert over.operating_points() == [(4, 50.0), (4, 100.0)]
    assert row_us(half, 4, "atomic", "gpu_expert", count=2) == exact(2 * 120.0 + 20.0)
    assert row_us(half, 4, "shared", "moe_block", context=0) == exact(4 * 12.08 + 50.0)
    assert row_us(half, 4, "shared", "head") == exact(40.0 + 10.0 + 10.0)
    for name in ("cpu_expert", "stage"):          # the CPU and the link keep their speed
        assert row_us(half, 4, "atomic", name, count=2) == row_us(full, 4, "atomic", name, count=2)
    for name in ("sync", "merge", "act_copy"):
        assert row_us(half, 4, "atomic", name, count=1) == row_us(full, 4, "atomic", name, count=1)
    spec = OVER.at_share(50)
    assert spec.gpu_flops == OVER.gpu_flops / 2 and spec.gpu_bandwidth == OVER.gpu_bandwidth / 2
    assert spec.gpu_launch_us == OVER.gpu_launch_us and spec.link_bandwidth == OVER.link_bandwidth
    with pytest.raises(CopeInputError, match="GPU share"):
        OVER.at_share(0)


def test_roofline_only_has_no_overheads():
    bare = roofline_only(OVER)
    assert (bare.gpu_launch_us, bare.gpu_sync_us, bare.link_latency_us, bare.cpu_dispatch_us) \
        == (0.0, 0.0, 0.0, 0.0)
    assert bare.gpu_efficiency == bare.cpu_efficiency == 1.0
    c = an.consts(bare, 4)
    assert an.gpu_experts(G, c, 0) == 0.0 and an.cpu_experts(G, c, 0) == 0.0


def test_spec_fields_checked_and_old_specs_read():
    old = {k: v for k, v in SPEC.to_dict().items()
           if k not in ("gpu_launch_us", "gpu_sync_us", "link_latency_us", "cpu_dispatch_us",
                        "gpu_efficiency", "cpu_efficiency", "gpu_kernels_per_expert_group",
                        "gpu_kernels_per_block")}
    assert PlatformSpec.from_dict(old) == PlatformSpec(**old)     # written before the overheads
    for key, bad in (("gpu_efficiency", 1.5), ("gpu_launch_us", -1.0),
                     ("gpu_kernels_per_block", 0), ("cpu_efficiency", 0.0)):
        with pytest.raises(CopeInputError) as e:
            PlatformSpec.from_dict(SPEC.to_dict() | {key: bad}, source="s.json")
        assert e.value.field == f"spec.{key}" and "s.json" in str(e.value)
    assert PlatformSpec.from_dict(SPEC.to_dict() | {"gpu_sync_us": 0}).gpu_sync_us == 0


def test_the_catalog_specs_carry_the_documented_defaults():
    s = platform_spec("a100-80gb")
    for f in ("gpu_launch_us", "gpu_sync_us", "link_latency_us", "cpu_dispatch_us",
              "gpu_efficiency", "cpu_efficiency"):
        assert getattr(s, f) == PlatformSpec.__dataclass_fields__[f].default


# --- the model's uncertainty ----------------------------------------------------------------
def test_draws_perturb_constants_shared_by_every_row(over):
    rows, _ = over.operating_point_rows(4, 100.0)
    d = an.analytic_draws(G, OVER, rows, 4000, np.random.default_rng(1))
    point = rows["median_us"].to_numpy()
    assert d.shape == (len(rows), 4000)
    # medians of log-normal factors with median 1: the draws centre on the point values
    kinds, cpus = rows["kind"].to_numpy(), rows["cpu"].to_numpy()
    beside = (kinds == "prefetch") & (cpus >= 1)
    # (a prefetch beside CPU misses is a difference of maxima near its kinks, whose median
    # under draws need not be its point value: checked below against its parts instead)
    np.testing.assert_allclose(np.median(d, axis=1)[~beside], point[~beside], rtol=0.03,
                               atol=1e-9)
    # one factor per constant per draw, shared by every row: rows that are the same operation
    # agree in every draw, and costs linear in n stay linear (rows drawn independently would not)
    kinds, names = rows["kind"].to_numpy(), rows["name"].to_numpy()
    count = rows["count"].to_numpy()

    def at(name, n):
        return np.flatnonzero((kinds == "atomic") & (names == name) & (count == n))[0]
    np.testing.assert_array_equal(d[at("gpu_expert", 2)], d[at("staged_gpu_expert", 2)])
    np.testing.assert_allclose(d[at("stage", 2)], 2 * d[at("stage", 1)], rtol=1e-12)
    # an insertion is one copy and the index update's transfer latency, in every draw
    assert (d[at("prefetch", 1)] > d[at("stage", 1)]).all()
    # in every draw a prefetch beside CPU misses pays at least its predictor and its wait
    pred = np.flatnonzero((kinds == "prefetch") & (count == 0))[0]
    assert (d[beside] >= d[pred] + d[at("sync", 1)] - 1e-9).all()
    # the throughput spread: a CPU row's log-sd is the stated one (plus its dispatch share)
    c1 = at("cpu_expert", 2)
    assert np.std(np.log(d[c1])) == pytest.approx(an.THROUGHPUT_SPREAD, rel=0.1)


def test_analytic_predictions_have_intervals():
    tr = tiny_trace()
    prof = analytic_profile(tr.model, platform_spec("a100-80gb"), cpu_threads=[8],
                            gpu_shares=(100,))
    df = predict(tr, prof, [2], tr, cpu_threads=8, draws=200)
    assert (df["tpot_hi_us"] > df["tpot_lo_us"]).all()
    assert "model uncertainty" in df.attrs["uncertainty"]["profile_spread"]
    assert "profile" in df.attrs["uncertainty"]["sources"]
    # the same seed gives the same intervals; no draws gives none
    again = predict(tr, prof, [2], tr, cpu_threads=8, draws=200)
    np.testing.assert_array_equal(df["tpot_lo_us"], again["tpot_lo_us"])
    assert predict(tr, prof, [2], tr, cpu_threads=8, draws=0)["tpot_lo_us"].isna().all()


def test_an_analytic_profile_without_overheads_draws_nothing():
    tr = tiny_trace()
    prof = analytic_profile(tr.model, platform_spec("a100-80gb"), cpu_threads=[8],
                            gpu_shares=(100,))
    spec = {k: v for k, v in prof.platform["spec"].items() if k != "gpu_launch_us"}
    old = dataclasses.replace(prof, platform=prof.platform | {"spec": spec})
    df = predict(tr, old, [2], tr, cpu_threads=8, draws=200)
    assert df.attrs["uncertainty"]["profile_spread"].startswith("none")


# --- the command line --------------------------------------------------------------------------
def _files(tmp_path):
    tr = tiny_trace()
    parquet_io.write_trace(tr, tmp_path / "t.parquet")
    return tr, tmp_path / "t.parquet"


def test_predict_chooses_the_gpu_share(tmp_path, capsys):
    tr, trace = _files(tmp_path)
    prof = tmp_path / "p.parquet"
    assert main(["profile", "--analytic", "--gpu", "a100-80gb", "--trace", str(trace), "--threads",
                 "8", "--gpu-shares", "20,100", "-o", str(prof)]) == 0
    assert "GPU shares ['20 %', '100 %']" in capsys.readouterr().out
    lp = {}
    for share in ("20", "100"):
        assert main(["predict", "--trace", str(trace), "--calibration", str(trace), "--profile",
                     str(prof), "-K", "2", "--gpu-share", share, "--draws", "0", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        lp[share] = next(r["tpot_us"] for r in rows if r["candidate"] == "layer_partition")
        assert main(["predict", "--trace", str(trace), "--calibration", str(trace), "--profile",
                     str(prof), "-K", "2", "--gpu-share", share, "--draws", "0"]) == 0
        assert f"gpu_share={share} " in capsys.readouterr().out.splitlines()[0]
    assert lp["20"] > lp["100"]         # a fifth of the GPU makes the GPU layers slower
    code = main(["predict", "--trace", str(trace), "--profile", str(prof), "-K", "2",
                 "--gpu-share", "50"])
    err = capsys.readouterr().err
    assert code == 2 and "gpu_share" in err and len(err.strip().splitlines()) == 1


def test_measured_profiles_refuse_gpu_shares(tmp_path, capsys):
    _, trace = _files(tmp_path)
    code = main(["profile", "--trace", str(trace), "--gpu-shares", "50", "-o",
                 str(tmp_path / "p.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and "--gpu-shares" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.parquet").exists()
