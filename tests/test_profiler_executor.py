"""The reference executor (exactness against a dense reference, the replay's cache states), the
measured profiler (a profile that predict accepts) and the CLI around them, plus evaluate's
per-K winner metric on hand-made numbers. Tiny geometries keep all of it fast."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from tiny import tiny_geometry, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.costs import profile_spec
from cope_core.estimate.metrics import winners_by_k
from cope_core.estimate.predict import predict
from cope_core.executor.decode import CandidateDecoder
from cope_core.executor.run import ExecutorSettings, measure
from cope_core.geometry import ModelGeometry
from cope_core.matrix import CANDIDATE_IDS, CANDIDATES, Residency, get_candidate
from cope_core.mechanisms import Accelerator, Rig, StopRule, host_threads
from cope_core.mechanisms.experts import close_to_reference, dense_reference
from cope_core.platforms import PlatformSpec
from cope_core.profile.data import beside_keys, required_keys
from cope_core.profile.measure import (
    Bench,
    ProfilerSettings,
    measure_cost_selected_split,
    measure_profile,
)
from cope_core.replay.engine import replay
from cope_core.trace.data import fill_order
from cope_core.trace.synth import synthesize

G = tiny_geometry()
QUICK = StopRule(warmup=1, min_samples=3, max_samples=5, batch=2, max_seconds=0.5)
SHARED_QUICK = StopRule(warmup=1, min_samples=3, max_samples=4, batch=1, max_seconds=0.5)


@pytest.fixture(scope="module")
def acc():
    with host_threads(1), Accelerator("cpu", 1) as a:
        yield a


def _decoders(rig, order, K, split):
    return [CandidateDecoder(rig, c, K, order, split) for c in CANDIDATES]


# --- exactness ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_candidate_equals_the_dense_reference(acc, dtype):
    tr = tiny_trace()
    order = fill_order(tr)
    rig = Rig.build(acc, G, dtype, pool_slots=G.n_layers * G.n_experts, max_context=32)
    split = np.array([1, 1, 0])          # h=0: 1 CPU + 1 staged; h=1: the miss on the CPU
    checked = 0
    for K in (0, 2, G.n_experts):
        for d in _decoders(rig, order, K, split):
            for p in range(tr.n_prompts):
                run = d.run_prompt(tr, p, record=True)
                assert len(run.records) == tr.tokens_per_prompt[p] * G.n_layers
                for r in run.records:
                    ref = dense_reference(r.x, r.w, [rig.store.expert(r.layer, e)
                                                     for e in r.routed],
                                          G.hidden, G.expert_intermediate)
                    assert close_to_reference(r.out, ref, dtype), (d.candidate.id, K, r.layer)
                    if dtype is torch.float32:
                        assert torch.allclose(r.out, ref, rtol=1e-5, atol=1e-6)
                    checked += 1
    assert checked == 3 * len(CANDIDATES) * tr.n_tokens * G.n_layers


def test_candidates_agree_with_each_other_token_by_token(acc):
    """Same routing, same weights: every candidate computes the same layer outputs."""
    tr = tiny_trace()
    order = fill_order(tr)
    rig = Rig.build(acc, G, torch.float32, pool_slots=G.n_layers * G.n_experts, max_context=32)
    outs = {}
    for d in _decoders(rig, order, 2, np.array([2, 0, 0])):
        outs[d.candidate.id] = torch.cat([r.out for r in d.run_prompt(tr, 0, record=True).records])
    ref = outs["layer_partition"]
    for cid, out in outs.items():
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6), cid


# --- the executor follows the replay --------------------------------------------------------------
SMALL = ModelGeometry(name="small", n_layers=4, n_experts=8, top_k=2, hidden=32,
                      expert_intermediate=16, dtype_bytes=2, n_shared_experts=1, dense_layers=1,
                      n_heads=2, n_kv_heads=1, head_dim=16, vocab=64, non_expert_bytes=10_000)


def test_executor_hit_counts_equal_the_replay(acc):
    trace = synthesize(SMALL, prompts=2, tokens=12, seed=7, predictor_accuracy=0.6)
    cal = synthesize(SMALL, prompts=2, tokens=12, seed=8)
    order = fill_order(cal)
    rig = Rig.build(acc, SMALL, torch.float32, pool_slots=SMALL.n_layers * SMALL.n_experts,
                    max_context=int(trace.context.max()))
    inserted = 0
    for K in (0, 1, 3, SMALL.n_experts):
        for r in Residency:
            d = CandidateDecoder(rig, get_candidate(f"{r.value}/ready_first"), K, order)
            rc = replay(trace, order, r, K)
            for p in range(trace.n_prompts):
                run = d.run_prompt(trace, p)
                assert np.array_equal(run.hist, rc.hist[0, p]), (r, K, p)
                assert np.array_equal(run.ins, rc.ins[0, p]), (r, K, p)
                inserted += int(run.ins.sum())
                # the slots really hold what the residency says after the prompt
                for s, (l, e) in d.state.assignment().items():
                    assert torch.equal(rig.pool.slot(s), rig.store.expert(l, e))
    assert inserted > 0   # the comparison covered real prefetches


# --- the measurement loop and `cope measure` ------------------------------------------------------
def test_measure_writes_every_candidate_prompt_trial(tmp_path):
    tr = tiny_trace()
    m = measure(tr, [2, 6], cpu_threads=[1], candidates=["fixed/parallel", "layer_partition",
                                                         "mutable_cross_layer/cost_selected"],
                settings=ExecutorSettings(trials=2, warmup_tokens=1), progress=False)
    t = m.table
    assert len(t) == 2 * 2 * 2 * 3
    assert list(t["candidate"].unique()) == ["layer_partition", "fixed/parallel",
                                             "mutable_cross_layer/cost_selected"]
    assert set(t["prompt"]) == {3, 7} and set(t["K"]) == {2, 6} and set(t["trial"]) == {0, 1}
    assert (t["tpot_us"] > 0).all() and (t["gpu_share"] == 100.0).all()
    assert m.platform["accelerator"] == "emulated" and m.platform["dtype"] == "bfloat16"
    parquet_io.write_measurements(m, tmp_path / "m.parquet")
    back = parquet_io.read_measurements(tmp_path / "m.parquet")
    assert back.platform["accelerator"] == "emulated" and len(back.table) == len(t)


@pytest.mark.parametrize("warm", [True, False])
def test_every_prompt_is_decoded_once_untimed_before_measuring(monkeypatch, warm):
    calls = []
    real = CandidateDecoder.run_prompt

    def spy(self, trace, p, **kw):
        calls.append((self.candidate.id, self.K, p, kw.get("tokens")))
        return real(self, trace, p, **kw)

    monkeypatch.setattr(CandidateDecoder, "run_prompt", spy)
    tr = tiny_trace()
    m = measure(tr, [2, 6], cpu_threads=[1, 2], candidates=["fixed/parallel", "layer_partition"],
                settings=ExecutorSettings(trials=1, warmup_tokens=1, warmup_prompts=warm),
                progress=False)
    full = [(c, K, p) for c, K, p, tokens in calls if tokens is None]
    timed = len(m.table)
    assert timed == 2 * 2 * 2 * 2                      # threads x K x candidates x prompts
    # per thread count: one untimed pass over both prompts with the first candidate at the first K;
    # per cell and trial one noise-floor run of the reference candidate on the first prompt
    assert len(full) == timed + (2 * 2 if warm else 0) + 4
    assert [c["reference"]["samples_us"] for c in m.quality["cells"]] and \
        all(len(c["reference"]["samples_us"]) == 2 for c in m.quality["cells"])
    if warm:
        assert full[:2] == [("layer_partition", 2, 0), ("layer_partition", 2, 1)]
    assert ("every prompt decoded once untimed" in m.notes) is warm


def test_measured_cost_selected_split_is_a_valid_share(acc):
    rig = Rig.build(acc, G, torch.bfloat16, pool_slots=4, max_context=8)
    split = measure_cost_selected_split(rig, 1)
    assert split.shape == (G.top_k + 1,)
    assert all(0 <= split[h] <= G.top_k - h for h in range(G.top_k + 1))


def test_a_prefetch_beside_more_cpu_misses_than_routed_is_refused(acc):
    rig = Rig.build(acc, G, torch.bfloat16, pool_slots=4, max_context=8)
    with pytest.raises(CopeInputError, match=r"expected 0\.\.2 CPU misses"):
        Bench(rig).prefetch(Residency.MUTABLE_PER_LAYER, 1, 8, cpu_misses=3)
    sample = Bench(rig).prefetch(Residency.MUTABLE_PER_LAYER, 1, 8, cpu_misses=G.top_k)
    assert np.isfinite(sample())         # a window with every routed expert on the CPU runs


# --- the profiler ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    settings = ProfilerSettings(cpu_threads=(1,), contexts=(16, 64), rule=QUICK,
                                shared_rule=SHARED_QUICK)
    prof, raw, seconds = measure_profile(G, settings, progress=False)
    path = tmp_path_factory.mktemp("prof") / "p.parquet"
    parquet_io.write_profile(prof, path)
    return prof, raw, seconds, path


@pytest.mark.slow
def test_profile_has_every_row_with_sane_statistics(measured):
    prof, raw, seconds, path = measured
    back = parquet_io.read_profile(path)
    assert back.analytic is False and seconds > 0
    t = back.table
    keys = {tuple(r) for r in t[["kind", "name", "hits", "cpu", "staged", "count", "context"]]
            .itertuples(index=False)}
    assert set(required_keys(G.top_k)) | set(beside_keys(G.top_k)) <= keys
    shared = t[t.kind == "shared"]
    assert sorted(shared[shared.name == "moe_block"]["context"]) == [16, 64]
    assert shared[shared.name == "head"]["context"].tolist() == [-1]
    assert back.schema == "cope.profile/2" and not (shared.name == "dense_block").any()
    assert (t["p25_us"] <= t["median_us"]).all() and (t["median_us"] <= t["p75_us"]).all()
    assert (t["samples"] >= 3).all() and len(raw) == len(t)
    assert all(len(v) == n for v, n in zip(raw.values(), t["samples"]))
    # the same code path is timed once: cost_selected with every miss on the CPU is parallel
    sched = t[t.kind == "schedule"].set_index(["name", "hits", "cpu", "staged"])["median_us"]
    for h in range(G.top_k + 1):
        m = G.top_k - h
        assert sched[("cost_selected", h, m, 0)] == sched[("parallel", h, m, 0)]
        assert sched[("cost_selected", h, 0, m)] == sched[("ready_first", h, 0, m)]
    assert sched[("wait_then_gpu", G.top_k, 0, 0)] == sched[("parallel", G.top_k, 0, 0)]


@pytest.mark.slow
def test_profile_platform_metadata(measured):
    prof = parquet_io.read_profile(measured[3])
    pl = prof.platform
    assert pl["accelerator"] == "emulated" and pl["gpu"] == "emulated"
    assert pl["torch"] == torch.__version__ and pl["dtype"] == "bfloat16"
    spec = PlatformSpec.from_dict(pl["spec"])
    assert spec == profile_spec(prof) and spec.source == "measured"
    assert spec.cpu_cores >= 1 and spec.link_bandwidth > 0 and spec.gpu_flops > 0


@pytest.mark.parametrize("estimator", ["cope", "atomic", "hrm"])
def test_predict_accepts_the_measured_profile(measured, estimator):
    prof = parquet_io.read_profile(measured[3])
    tr = tiny_trace()
    df = predict(tr, prof, [0, 2, 6], calibration=tr, estimator=estimator)
    assert len(df) == 3 * len(CANDIDATE_IDS)
    assert np.isfinite(df["tpot_us"]).all() and (df["tpot_us"] > 0).all()
    assert df.attrs["cpu_threads"] == 1 and df.attrs["gpu_share"] == 100.0


# --- CLI ------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_files(tmp_path):
    t = tmp_path / "t.parquet"
    parquet_io.write_trace(tiny_trace(), t)
    return tmp_path, t


@pytest.mark.slow
def test_cli_profile_measure_predict_evaluate(capsys, tiny_files):
    d, t = tiny_files
    p, m = d / "p.parquet", d / "m.parquet"
    # --busy-ok: this checks the files and the pipeline, not the machine (a suite that runs
    # other work beside it would be refused, tests/test_busy_profile.py checks that)
    assert main(["profile", "--trace", str(t), "--threads", "1", "--contexts", "16,64",
                 "--max-samples", "4", "--no-progress", "--raw-samples", str(d / "raw.json"),
                 "--busy-ok", "-o", str(p)]) == 0
    out = capsys.readouterr().out
    assert "MEASURED profile" in out and "profiling took" in out
    raw = json.loads((d / "raw.json").read_text())
    assert len(raw["samples_us"]) == len(parquet_io.read_profile(p).table)
    assert main(["predict", "--trace", str(t), "--profile", str(p), "-K", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 13
    assert main(["measure", "--trace", str(t), "-K", "2", "--threads", "1", "--trials", "1",
                 "--warmup-tokens", "0", "--profile", str(p), "--candidates",
                 "fixed/parallel,mutable_per_layer/cost_selected,layer_partition",
                 "--no-progress", "-o", str(m)]) == 0
    assert "measured winner" in capsys.readouterr().out
    assert len(parquet_io.read_measurements(m).table) == 3 * 2
    assert main(["evaluate", "--trace", str(t), "--profile", str(p), "--measurements", str(m),
                 "--calibration", str(t), "--per-k", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res) == {"cope", "atomic", "hrm", "measurement_quality"}
    assert [q["K"] for q in res.pop("measurement_quality")] == [2]
    for r in res.values():
        assert r["pairs"] == 6 and r["top1"][1] == 2 and len(r["per_k"]) == 1


@pytest.mark.parametrize("args,needle", [
    (["profile", "--pcie", "pcie4"], "--pcie only applies to --analytic"),
    (["profile", "--accel-threads", "0"], "--accel-threads"),
    (["measure", "-K", "9"], "out of range"),
    (["measure", "-K", "2", "--trials", "0"], "--trials"),
])
def test_cli_errors_are_one_line(capsys, tiny_files, args, needle):
    d, t = tiny_files
    code = main([*args, "--trace", str(t), "-o", str(d / "x.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_to_overwrite(capsys, tiny_files):
    d, t = tiny_files
    (d / "x.parquet").write_text("keep me")
    code = main(["measure", "--trace", str(t), "-K", "2", "-o", str(d / "x.parquet")])
    assert code == 2 and "--force" in capsys.readouterr().err
    assert (d / "x.parquet").read_text() == "keep me"


# --- evaluate's per-K winners on hand-made numbers ------------------------------------------------
def test_winners_by_k_by_hand():
    rows = [
        # K=1: prompt means predicted fp 15, lp 15 (tie -> layer_partition), measured fp 10, lp 20
        (1, 0, "fixed/parallel", 10.0, 8.0), (1, 1, "fixed/parallel", 20.0, 12.0),
        (1, 0, "layer_partition", 15.0, 20.0), (1, 1, "layer_partition", 15.0, 20.0),
        # K=2: predicted and measured both pick fixed/parallel; per-prompt winners differ
        (2, 0, "fixed/parallel", 10.0, 30.0), (2, 1, "fixed/parallel", 10.0, 10.0),
        (2, 0, "layer_partition", 30.0, 25.0), (2, 1, "layer_partition", 30.0, 30.0),
    ]
    pairs = pd.DataFrame(rows, columns=["K", "prompt", "candidate", "predicted_us",
                                        "measured_us"])
    w = winners_by_k(pairs, "cope")
    assert [(r["K"], r["predicted"], r["measured"], r["agree"]) for r in w] == [
        (1, "layer_partition", "fixed/parallel", False),
        (2, "fixed/parallel", "fixed/parallel", True)]
    # K=1 means: fp 15 vs 10 (50 %), lp 15 vs 20 (25 %) -> 37.5 %
    assert w[0]["mape_pct"] == pytest.approx(37.5)
    # K=2 means: fp 10 vs 20 (50 %), lp 30 vs 27.5 (1/11) -> (50 + 100/11) / 2
    assert w[1]["mape_pct"] == pytest.approx((50 + 100 / 11) / 2)


@pytest.mark.slow
def test_raw_samples_leave_a_users_tmp_file_alone(capsys, tiny_files):
    # the raw-samples JSON was written through X.tmp and silently replaced a user's file of
    # that name; now the temporary name is unique and hidden, and X.tmp is untouched
    d, t = tiny_files
    mine = d / "raw.tmp"
    mine.write_text("the user's own notes")
    assert main(["profile", "--trace", str(t), "--threads", "1", "--contexts", "16",
                 "--max-samples", "3", "--min-time", "0", "--no-progress", "--raw-samples",
                 str(d / "raw.json"), "--busy-ok", "-o", str(d / "p.parquet")]) == 0
    capsys.readouterr()
    assert mine.read_text() == "the user's own notes"
    assert json.loads((d / "raw.json").read_text())["samples_us"]
    assert sorted(p.name for p in d.iterdir()) == ["p.parquet", "raw.json", "raw.tmp",
                                                   "t.parquet"]


def test_run_order_shuffles_every_candidate_once_per_trial_and_prompt():
    from cope_core.executor.run import run_order
    orders = [run_order(13, t, p, seed=0) for t in range(3) for p in range(4)]
    assert all(sorted(o) == list(range(13)) for o in orders)
    assert run_order(13, 1, 2, seed=0) == run_order(13, 1, 2, seed=0)      # reproducible
    assert len({tuple(o) for o in orders}) == len(orders)                  # a fresh shuffle each
    assert run_order(13, 0, 0, seed=1) != run_order(13, 0, 0, seed=0)
    # no candidate always runs first: over 12 (trial, prompt) pairs several lead
    assert len({o[0] for o in orders}) > 3
