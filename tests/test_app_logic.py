"""The explorer's pure logic (cope_core.app): split predictions, budgets and break-even regions,
timelines, input views, example discovery and the figures' data, without Streamlit."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tiny import tiny_geometry, tiny_measurements, tiny_profile, tiny_trace

from cope_core import parquet_io, predict
from cope_core.app import (
    dataset,
    figures,
    figures_inputs,
    figures_timeline,
    inputs,
    settings,
    whatif,
)
from cope_core.app.timeline import execution_timeline, layer_partition_timelines
from cope_core.errors import CopeInputError
from cope_core.estimate.costs import atomic_costs, estimators_for
from cope_core.estimate.predict import OptimisticPredictionWarning, price, replay_counts
from cope_core.geometry import GIB, get_model
from cope_core.matrix import CANDIDATE_IDS, EXECUTIONS, Execution, matrix_table, residencies_of
from cope_core.platforms import platform_spec, roofline_only
from cope_core.profile.analytic import analytic_profile
from cope_core.trace.stats import trace_stats
from cope_core.trace.synth import synthesize

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "data" / "examples"


def _profile_with_spec():
    """The tiny profile with a valid platform spec, so the roofline estimator runs too."""
    prof = tiny_profile()
    return dataclasses.replace(prof, platform=dict(prof.platform,
                                                   spec=platform_spec("h100").to_dict()))


def _split_predict(trace, profile, ks, calibration, estimator, cands, op=(None, None)):
    # the two library steps the app caches apart
    counts = replay_counts(trace, calibration, ks, residencies_of(cands))
    return price(trace, profile, counts, ks, cpu_threads=op[0], gpu_share=op[1],
                 estimator=estimator, candidates=cands, calibrated=calibration is not None)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        if a[col].dtype == object and isinstance(a[col].iloc[0], np.ndarray):
            for x, y in zip(a[col], b[col]):
                np.testing.assert_array_equal(x, y)
        else:
            pd.testing.assert_series_equal(a[col], b[col])
    assert a.attrs == b.attrs


# --- split predictions = predict ------------------------------------------------------------------
@pytest.mark.parametrize("estimator", ["cope", "atomic", "hrm"])
@pytest.mark.parametrize("ks", [[0], [2], [0, 1, 2, 3, 4, 5, 6]])
@pytest.mark.parametrize("cands", [list(CANDIDATE_IDS), ["layer_partition"],
                                   ["mutable_cross_layer/ready_first", "fixed/parallel"]])
def test_split_prediction_equals_predict(estimator, ks, cands):
    tr, cal = tiny_trace(), tiny_trace()
    prof = _profile_with_spec()
    for op in [(None, None), (4, 50.0)]:
        ref = predict(tr, prof, ks, calibration=cal, estimator=estimator, candidates=cands,
                      cpu_threads=op[0], gpu_share=op[1])
        _same(_split_predict(tr, prof, ks, cal, estimator, cands, op), ref)


def test_split_prediction_warns_without_calibration_like_predict():
    tr, prof = tiny_trace(), tiny_profile()
    with pytest.warns(OptimisticPredictionWarning):
        ref = predict(tr, prof, [1, 3], estimator="cope")
    with pytest.warns(OptimisticPredictionWarning):
        got = _split_predict(tr, prof, [1, 3], None, "cope", list(CANDIDATE_IDS))
    _same(got, ref)


def test_split_prediction_equals_predict_on_the_shipped_example():
    tr = parquet_io.read_trace(EXAMPLES / "qwen3-30b-a3b-trace.parquet")
    cal = parquet_io.read_trace(EXAMPLES / "qwen3-30b-a3b-calibration.parquet")
    prof = parquet_io.read_profile(EXAMPLES / "qwen3-30b-a3b-rtx4090-analytic.parquet")
    ks = [0, 17, 48, 127, 128]
    _same(_split_predict(tr, prof, ks, cal, "cope", list(CANDIDATE_IDS), (8, 100.0)),
          predict(tr, prof, ks, calibration=cal, cpu_threads=8))


# --- budgets and break-even -----------------------------------------------------------------------
def test_budget_and_k_round_trip():
    g = get_model("qwen3-30b-a3b")
    for k in range(g.n_experts + 1):
        b = whatif.budget_gib(g, k)
        assert whatif.k_for_budget(g, b) == k
        if k:
            assert whatif.k_for_budget(g, b - 1e-6) == k - 1
    lo, hi = whatif.budget_range(g)
    assert lo - whatif.BUDGET_STEP < whatif.budget_gib(g, 0) <= lo       # the first step K = 0 fits
    assert whatif.k_for_budget(g, lo) == 0 and hi >= whatif.budget_gib(g, g.n_experts) + 1
    with pytest.raises(CopeInputError, match="GiB that K = 0 needs"):
        whatif.k_for_budget(g, lo - whatif.BUDGET_STEP)
    assert whatif.k_for_budget(g, hi) == g.n_experts


def test_default_budget_is_the_gpu_memory_capped_at_half_the_experts():
    g = get_model("qwen3-30b-a3b")
    assert whatif.default_budget(g, {"gpu": "rtx4090"}) == 24.0          # 24 GiB card
    cap = whatif.budget_gib(g, 64)
    h100 = whatif.default_budget(g, {"gpu": "h100"})                     # 80 GiB > cap
    assert h100 <= cap < h100 + whatif.BUDGET_STEP
    assert whatif.default_budget(g, {"gpu": "unknown"}) == h100


def _sweep(winners: list[str]) -> pd.DataFrame:
    rows = []
    for k, w in enumerate(winners):
        for c in ("a", "b", "c"):
            rows.append({"experts_per_layer": k, "candidate": c, "winner": c == w})
    return pd.DataFrame(rows)


def test_winner_regions_and_break_even_words():
    g = tiny_geometry()
    regions = whatif.winner_regions(_sweep(["a", "a", "b", "b", "b", "c", "c"]), g)
    gib = [g.vram_for_experts_per_layer(k) / GIB for k in range(7)]
    assert regions == [whatif.Region("a", 0, 1, gib[0], gib[2]),
                       whatif.Region("b", 2, 4, gib[2], gib[5]),
                       whatif.Region("c", 5, 6, gib[5], None)]
    assert whatif.break_even_sentences(regions) == [
        f"a wins below {gib[2]:.2f} GiB (K = 0 … 1)",
        f"b wins from {gib[2]:.2f} GiB to {gib[5]:.2f} GiB (K = 2 … 4)",
        f"c wins from {gib[5]:.2f} GiB (K = 5 … 6)"]
    table = whatif.break_even_budgets(regions)
    assert table["experts_per_layer"].tolist() == [2, 5]
    assert table[["from", "to"]].values.tolist() == [["a", "b"], ["b", "c"]]
    one = whatif.winner_regions(_sweep(["b"] * 7), g)
    assert whatif.break_even_sentences(one) == ["b wins at every budget (K = 0 … 6)"]


def test_regions_of_a_real_sweep_cover_every_k_once():
    tr, prof = tiny_trace(), tiny_profile()
    sw = predict(tr, prof, range(7), calibration=tr)
    regions = whatif.winner_regions(sw, tr.model)
    covered = [k for r in regions for k in range(r.k_from, r.k_to + 1)]
    assert covered == list(range(7))
    for r in regions:
        for k in range(r.k_from, r.k_to + 1):
            sub = sw[sw.experts_per_layer == k]
            assert sub.loc[sub.tpot_us.idxmin(), "candidate"] == r.candidate


def test_candidate_ids_and_chunks():
    assert whatif.candidate_ids(["fixed"], ["parallel", "ready_first"], True) == [
        "layer_partition", "fixed/parallel", "fixed/ready_first"]
    assert whatif.candidate_ids([], ["parallel"], False) == []
    assert len(whatif.candidate_ids([r for r in ("fixed", "mutable_per_layer",
                                                 "mutable_cross_layer")],
                                    [e.value for e in EXECUTIONS], True)) == 13
    chunks = whatif.k_chunks(128)
    assert [k for c in chunks for k in c] == list(range(129))


def test_winner_sentence_names_ties_and_margins():
    df = pd.DataFrame({"candidate": ["x", "y", "z"], "tpot_us": [1000.0, 1000.0, 1500.0],
                       "rank": [1, 2, 3]})
    w = whatif.winner_of(df)
    assert (w.candidate, w.runner_up, w.margin_pct) == ("x", "y", 0.0)
    assert "tied with y" in w.sentence()
    w = whatif.winner_of(df.iloc[[0, 2]].assign(rank=[1, 2]))
    assert w.margin_pct == pytest.approx(50.0) and "50.0% ahead of z" in w.sentence()


# --- timelines ------------------------------------------------------------------------------------
def test_timelines_on_hand_worked_costs():
    op = tiny_profile().resolve(8, 100.0)        # R n, C 5n, S 4n, G n, A .5, F .25, M .125
    assert execution_timeline(op, "parallel", 1).total_us == 5.875          # max(1, 5+.5)+.375
    assert execution_timeline(op, "ready_first", 1).total_us == 5.375       # max(1, 4)+1+.375
    assert execution_timeline(op, "wait_then_gpu", 1).total_us == 6.375     # 4+1+1+.375
    assert execution_timeline(op, "ready_first", 0).total_us == 10.375      # 8+2+.375
    cpu, gpu = layer_partition_timelines(op)
    assert (cpu.total_us, gpu.total_us) == (10.875, 2.125)
    assert (cpu.measured_us, gpu.measured_us) == (op.cpu_layer, op.gpu_layer)
    rf = execution_timeline(op, "ready_first", 1)
    starts = {s.label: s.start_us for s in rf.segments}
    assert starts["R[1] resident experts"] == starts["S[1] stage weights"] == 0.0
    assert starts["G[1] staged experts"] == 4.0


@pytest.mark.parametrize("profile", ["tiny", "analytic"])
def test_timeline_end_is_the_atomic_estimate_and_measured_is_the_schedule(profile):
    if profile == "tiny":
        op = tiny_profile().resolve(4, 50.0)
    else:
        op = analytic_profile(get_model("olmoe-1b-7b"), platform_spec("h100")).resolve(8, 100.0)
    ac = atomic_costs(op)
    for ei, e in enumerate(EXECUTIONS):
        for h in range(op.top_k + 1):
            tl = execution_timeline(op, e, h)
            assert tl.total_us == pytest.approx(ac.moe[ei, h], rel=1e-12, abs=1e-12)
            assert tl.hits + tl.cpu + tl.staged == op.top_k
            assert tl.measured_us == op.schedule[ei, h, tl.cpu]
            assert all(s.end_us >= s.start_us >= 0 for s in tl.segments)


def test_timeline_rejects_impossible_hits():
    with pytest.raises(ValueError):
        execution_timeline(tiny_profile().resolve(), Execution.PARALLEL, 3)


# --- input views ----------------------------------------------------------------------------------
def test_popularity_share_by_hand():
    tr = tiny_trace()
    share = inputs.popularity_share(tr)
    np.testing.assert_allclose(share.sum(axis=1), tr.model.top_k)  # every token routes top_k
    assert share[0, 0] == 4 / 5                              # expert 0 at layer 0: 4 of 5 tokens
    s = inputs.popularity_share(tr, sort=True)
    assert (np.diff(s, axis=1) <= 0).all()
    np.testing.assert_array_equal(s, -np.sort(-share, axis=1))


def test_recall_frame_is_the_stats_module_recall_per_layer_pair():
    tr = parquet_io.read_trace(EXAMPLES / "deepseek-v2-lite-trace.parquet")
    st = trace_stats(tr)
    f = inputs.recall_frame(st)
    assert f.columns.tolist() == ["layer", "predictor", "previous token", "popularity"]
    assert f["layer"].tolist() == list(range(tr.model.n_layers - 1))    # pairs l -> l + 1
    np.testing.assert_array_equal(f["predictor"], st.recall)
    np.testing.assert_array_equal(f["previous token"], st.recall_previous_token)
    np.testing.assert_array_equal(f["popularity"], st.recall_popularity)
    # a trace without predictions: only the baselines
    f = inputs.recall_frame(dataclasses.replace(st, recall=None))
    assert f.columns.tolist() == ["layer", "previous token", "popularity"]
    hand = dataclasses.replace(st, recall=[1.0, 0.5], recall_previous_token=[0.25, 0.0],
                               recall_popularity=[0.5, 0.75])
    assert inputs.recall_frame(hand).to_dict("list") == {
        "layer": [0, 1], "predictor": [1.0, 0.5], "previous token": [0.25, 0.0],
        "popularity": [0.5, 0.75]}


def test_atomic_frame_of_an_analytic_profile_is_its_roofline():
    g = get_model("qwen3-30b-a3b")
    spec = platform_spec("rtx4090")
    bare = roofline_only(spec)
    op = analytic_profile(g, bare).resolve(16, 100.0)
    f = inputs.atomic_frame(op, g, bare)
    assert len(f) == 4 * (g.top_k + 1)
    np.testing.assert_allclose(f["profile_us"], f["roofline_us"], rtol=1e-12)
    # with overheads and efficiencies below the peak every operation costs more than its roofline
    f = inputs.atomic_frame(analytic_profile(g, spec).resolve(16, 100.0), g, spec)
    work = f[f["n"] > 0]
    assert (work["profile_us"] > work["roofline_us"]).all()
    nospec = inputs.atomic_frame(tiny_profile().resolve(), tiny_geometry(), None)
    assert nospec["roofline_us"].isna().all()
    assert nospec.query("op == 'cpu_expert' and n == 2")["profile_us"].item() == 10.0


def test_schedule_grid_and_split():
    op = tiny_profile().resolve(8, 100.0)
    grid = inputs.schedule_grid(op)
    assert grid.shape == (3, 3)
    assert np.isnan(grid[2, 1]) and np.isnan(grid[1, 2])     # c > m does not exist
    assert grid[0, 1] == 10 * 2 + 0 + 0.5                    # h=0, c=1, u=1
    np.testing.assert_array_equal(inputs.chosen_split(op), [0, 0, 0])  # CPU costs .5 more


def test_measured_pairs_and_metrics_against_a_plain_reference():
    tr, prof, meas = tiny_trace(), _profile_with_spec(), tiny_measurements()
    assert estimators_for(tiny_profile()) == ["cope", "atomic"]   # its spec is partial
    pairs = {e: inputs.measured_pairs(tr, prof, tr, meas, e) for e in estimators_for(prof)}
    assert list(pairs) == ["cope", "atomic", "hrm"]
    ref = predict(tr, prof, 2, calibration=tr, cpu_threads=8, gpu_share=100.0)
    p = pairs["cope"].set_index(["prompt", "candidate"])
    errors = []
    for ci, (cand, tp) in enumerate(zip(ref.candidate, ref.prompt_tpot_us)):
        for pid, pred in zip((3, 7), tp):
            measured = 1000.0 + 10 * ci + pid + 0.25           # mean of trials 0 and 1
            assert p.loc[(pid, cand), "predicted_us"] == pred
            assert p.loc[(pid, cand), "measured_us"] == measured
            errors.append(abs(pred - measured) / measured)
    scores = inputs.score(pairs)
    table = inputs.metrics_table(scores)
    assert table["estimator"].tolist() == ["cope", "atomic", "hrm"]
    assert table.loc[0, "MAPE %"] == pytest.approx(100 * np.mean(errors))
    assert table.loc[0, "pairs"] == 26
    drill = inputs.prompt_drilldown(pairs, 7)
    assert drill["candidate"].tolist() == list(CANDIDATE_IDS)
    assert drill[["cope_us", "atomic_us", "hrm_us"]].notna().all().all()
    assert (drill["measured_us"] == [1000.0 + 10 * i + 7.25 for i in range(13)]).all()


# --- examples, dataset, settings ------------------------------------------------------------------
def test_scan_examples_groups_by_model_and_skips_junk(tmp_path):
    parquet_io.write_trace(tiny_trace(), tmp_path / "tiny-trace.parquet")
    parquet_io.write_trace(tiny_trace(), tmp_path / "tiny-calibration.parquet")
    parquet_io.write_profile(tiny_profile(), tmp_path / "tiny-prof.parquet")
    parquet_io.write_measurements(tiny_measurements(), tmp_path / "tiny-meas.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    parquet_io.write_trace(tiny_trace(), tmp_path / "lonely.parquet")   # no profile: not usable
    exs = dataset.scan_examples(tmp_path)
    assert len(exs) == 1
    e = exs[0]
    assert e.name == "tiny"
    assert [Path(p).name for p in e.traces] == ["lonely.parquet", "tiny-trace.parquet"]
    assert [Path(p).name for p in e.calibrations] == ["tiny-calibration.parquet"]
    assert [Path(p).name for p in e.profiles] == ["tiny-prof.parquet"]
    assert [Path(p).name for p in e.measurements] == ["tiny-meas.parquet"]
    assert dataset.scan_examples(tmp_path / "missing") == []


def test_a_cut_catalog_model_is_its_own_example(tmp_path):
    full = get_model("olmoe-1b-7b")
    for name, g in (("full", full), ("cut", full.with_layers(2))):
        parquet_io.write_trace(synthesize(g, prompts=1, tokens=2, seed=1),
                               tmp_path / f"{name}-trace.parquet")
        parquet_io.write_profile(analytic_profile(g, platform_spec("rtx4090"), cpu_threads=[1]),
                                 tmp_path / f"{name}-prof.parquet")
    exs = {e.name: e for e in dataset.scan_examples(tmp_path)}
    assert sorted(exs) == ["olmoe-1b-7b", "olmoe-1b-7b · 2 MoE layers"]
    assert [Path(p).name for p in exs["olmoe-1b-7b · 2 MoE layers"].traces] == ["cut-trace.parquet"]
    assert [Path(p).name for p in exs["olmoe-1b-7b"].profiles] == ["full-prof.parquet"]
    assert dataset.example_name({"name": "tiny", "n_layers": 3}) == "tiny"
    assert dataset.example_name({"n_layers": 3}) is None


def test_shipped_examples_are_found_and_labelled():
    exs = {e.name: e for e in dataset.scan_examples(EXAMPLES)}
    assert {"qwen3-30b-a3b", "deepseek-v2-lite"} <= set(exs)
    e = exs["qwen3-30b-a3b"]
    tr = parquet_io.read_trace(e.traces[0])
    prof = parquet_io.read_profile(e.profiles[0])
    ds = dataset.assemble("k", tr, parquet_io.read_trace(e.calibrations[0]), prof, None, {})
    assert dataset.provenance(ds) == ("qwen3-30b-a3b · SYNTHETIC trace · ANALYTIC profile "
                                      "(rtx4090)")
    assert dataset.profile_label(prof) == (
        "ANALYTIC profile (rtx4090: published peak numbers with efficiencies and overheads "
        "fitted on the COPE paper's A100 winners; a what-if, not measured)")
    old = dict(prof.platform["spec"])
    old.pop("gpu_launch_us")       # a profile written before the overheads: the pure roofline
    assert "pure roofline" in dataset.profile_label(
        dataclasses.replace(prof, platform=prof.platform | {"spec": old}))
    assert not ds.problems and not ds.notes


def test_assemble_drops_and_reports_what_does_not_fit():
    tr = tiny_trace()
    other = parquet_io.read_trace(EXAMPLES / "deepseek-v2-lite-trace.parquet")
    qprof = parquet_io.read_profile(EXAMPLES / "qwen3-30b-a3b-rtx4090-analytic.parquet")
    ds = dataset.assemble("k", tr, other, qprof, tiny_measurements(get_model("olmoe-1b-7b")), {})
    assert ds.calibration is None and "calibration trace not used" in ds.notes[0]
    assert len(ds.problems) == 1 and "top_k" in ds.problems[0]
    assert "differs from the trace's" in ds.measurement_problem


def test_settings_parse_and_format():
    got = settings.parse_query({"vram": "24.5", "est": "atomic", "res": "mutable_per_layer,fixed",
                                "lp": "0", "hits": "3", "cell": "fixed/parallel",
                                "bogus": "1", "exe": "nonsense", "vram2": "x"})
    assert got == {"vram": 24.5, "est": "atomic", "res": ["fixed", "mutable_per_layer"],
                   "lp": False, "hits": 3, "cell": "fixed/parallel"}
    assert settings.parse_query({"est": "magic", "vram": "nan", "lp": "yes"}) == {}
    assert settings.parse_query({"vram": ["1", "2"]}) == {"vram": 2.0}
    for name, value in got.items():
        assert settings.parse_query({name: settings.format_setting(name, value)})[name] == value
    assert settings.op_key(32, 100.0) == "32@100"


# --- figures --------------------------------------------------------------------------------------
def test_policy_figures_carry_the_predictions():
    tr, prof = tiny_trace(), tiny_profile()
    df = predict(tr, prof, 2, calibration=tr)
    fig = figures.tpot_bars(df)
    experts = fig.data[1]
    order = df.sort_values("rank", ascending=False)
    np.testing.assert_allclose(experts.x, order["experts_us"] / 1e3)
    assert experts.y[-1].startswith("★ ")                     # the winner is the top row
    assert experts.y[-1][2:] == df.loc[df["rank"] == 1, "candidate"].item()

    heat = figures.matrix_heatmap(df, matrix_table())
    z = np.array(heat.data[0].z, dtype=float)
    assert z[0, 0] == pytest.approx(df.set_index("candidate").loc["fixed/parallel",
                                                                   "tpot_us"] / 1e3)
    assert "Fiddler" in heat.data[0].text[0][3] and "new (COPE)" in heat.data[0].text[0][2]

    sw = predict(tr, prof, range(7), calibration=tr)
    regions = whatif.winner_regions(sw, tr.model)
    sweep_fig = figures.tpot_vs_budget(sw, tr.model, regions, current_gib=0.01, current_k=2)
    # 13 candidate lines and the winner's 95 % band (two traces)
    assert [t.name for t in sweep_fig.data[2:]] == list(CANDIDATE_IDS)
    band = sweep_fig.data[1]
    assert band.name == "winner's 95 % band" and band.fill == "tonexty"
    win = sw[sw["winner"]].sort_values("experts_per_layer")
    np.testing.assert_allclose(band.y, win["tpot_lo_us"] / 1e3)
    np.testing.assert_allclose(sweep_fig.data[0].y, win["tpot_hi_us"] / 1e3)
    assert len(sweep_fig.layout.shapes) == len(regions) + 1
    lp = next(t for t in sweep_fig.data if t.name == "layer_partition")
    np.testing.assert_allclose(lp.x, [whatif.budget_gib(tr.model, k) for k in range(7)])


def test_input_figures():
    tl = [execution_timeline(tiny_profile().resolve(), e, 1) for e in ("ready_first",
                                                                       "wait_then_gpu")]
    fig = figures_timeline.timeline_figure(tl)
    bars = [t for t in fig.data if t.type == "bar"]
    assert sum(len(t.x) for t in bars) == sum(1 for x in tl for s in x.segments
                                              if s.duration_us > 0)
    ends = [t.x[0] for t in fig.data if t.type == "scatter" and "composed" in t.name]
    assert ends == [tl[0].total_us, tl[1].total_us]

    tr, prof, meas = tiny_trace(), tiny_profile(), tiny_measurements()
    pairs = {"cope": inputs.measured_pairs(tr, prof, tr, meas, "cope")}
    sc = figures_inputs.pvm_scatter(pairs)
    band = sc.data[0]
    assert band.fill == "toself"
    ident = sc.data[1]
    assert list(ident.x) == list(ident.y)
    points = [t for t in sc.data[2:]]
    assert sum(len(t.x) for t in points) == 26
    heat = figures_inputs.popularity_heatmap(inputs.popularity_share(tr), False)
    np.testing.assert_allclose(np.array(heat.data[0].z), inputs.popularity_share(tr))
    assert math.isclose(sum(np.array(heat.data[0].z)[0]), 2.0)


def test_a_sweeps_replay_prices_any_of_its_k_and_refuses_others():
    # one replay over K = 0..4 priced at K = 3 (or 3 then 1) is the prediction at those K, never
    # the histograms of the sweep's first K
    tr = tiny_trace()
    prof = tiny_profile()
    counts = replay_counts(tr, tr, [0, 1, 2, 3, 4])
    for ks in ([3], [3, 1]):
        got = price(tr, prof, counts, ks, draws=0)
        _same(got, price(tr, prof, replay_counts(tr, tr, ks), ks, draws=0))
        assert list(got["experts_per_layer"].unique()) == sorted(ks)
    with pytest.raises(CopeInputError, match="K=5") as e:
        price(tr, prof, replay_counts(tr, tr, [1, 2]), [5], draws=0)
    assert e.value.field == "experts_per_layer"


def test_winner_skips_equivalents_and_says_how_sure():
    df = pd.DataFrame({"candidate": ["fixed/parallel", "fixed/cost_selected", "layer_partition"],
                       "rank": [1, 2, 3], "experts_per_layer": [4, 4, 4],
                       "tpot_us": [1000.0, 1000.0, 1500.0],
                       "tpot_lo_us": [900.0, 900.0, 1400.0], "tpot_hi_us": [1100.0, 1100.0, 1600.0],
                       "equivalent_to": [None, "fixed/parallel", None]})
    df.attrs["uncertainty"] = {"per_k": {4: {"win_probability": 0.6, "contender":
                                              "layer_partition", "contender_probability": 0.4}}}
    w = whatif.winner_of(df)
    # the same policy (cost_selected with every miss on the CPU) is not the runner-up
    assert (w.runner_up, w.margin_pct) == ("layer_partition", 50.0)
    assert (w.tpot_lo_us, w.tpot_hi_us, w.win_probability) == (900.0, 1100.0, 0.6)
    assert not w.sure
    assert w.sentence() == ("fixed/parallel wins at 1.000 ms/token · 1000.0 tokens/s (95 % "
                            "interval [0.900, 1.100] "
                            "with the model's measured error), 50.0% ahead of layer_partition "
                            "(1.500 ms/token); it is fastest in 60 % of draws, layer_partition "
                            "in 40 % — not a confident pick")
    bare = df.drop(columns=["tpot_lo_us", "tpot_hi_us"]).assign(equivalent_to=None)
    bare.attrs = {}                      # a prediction without draws
    plain = whatif.winner_of(bare)
    assert plain.sure and plain.runner_up == "fixed/cost_selected" and plain.win_probability is None


def test_unsure_budget_ranges():
    g = get_model("olmoe-1b-7b")
    sw = pd.DataFrame({"experts_per_layer": range(g.n_experts + 1)})
    wp = {k: 0.9 for k in range(g.n_experts + 1)} | {1: 0.5, 2: 0.79, g.n_experts: 0.7}
    sw.attrs["uncertainty"] = {"per_k": {k: {"win_probability": v} for k, v in wp.items()}}
    got = whatif.uncertain_ranges(sw, g)
    top = g.n_experts
    assert got == [(whatif.budget_gib(g, 1), whatif.budget_gib(g, 3), 1, 2),
                   (whatif.budget_gib(g, top), whatif.budget_gib(g, top) + whatif.BUDGET_STEP,
                    top, top)]
    sw.attrs = {}
    assert whatif.uncertain_ranges(sw, g) == []
    # with the paired draws' verdict, the unsure budgets are its ties (the winner's sentence)
    tie = {"tied": True, "leader": "fixed/parallel", "rival": "layer_partition",
           "leader_share": 0.9, "beats_rival": 0.9}
    sw.attrs["uncertainty"] = {"per_k": {k: {"win_probability": 0.5,
                                             "verdict": tie | {"tied": k == 3}}
                                         for k in range(g.n_experts + 1)}}
    assert whatif.uncertain_ranges(sw, g) == [(whatif.budget_gib(g, 3), whatif.budget_gib(g, 4),
                                               3, 3)]


# --- the Export page (issue 38) -------------------------------------------------------------------
def test_export_tabs_lead_with_a_command_and_name_the_uploaded_model_file():
    from cope_core.app import export_view
    from cope_core.export import EXPORT_FORMATS
    order = [f.name for f in export_view.tab_order(EXPORT_FORMATS)]
    assert order[0] == "llama.cpp" and order[-1] == "json"
    assert sorted(order) == sorted(f.name for f in EXPORT_FORMATS)
    text = ("# notes\n# more\nllama-server -m MODEL.gguf -ngl 99 --n-cpu-moe 38\n"
            "# or the same placement as an explicit tensor override:\n"
            "llama-server -m MODEL.gguf -ot 'x=CPU'\n")
    assert export_view.lead_command(text, "bash") == (
        "llama-server -m MODEL.gguf -ngl 99 --n-cpu-moe 38", 1)
    assert export_view.lead_command('{"a": 1}\n', "json") == ('{"a": 1}', 0)
    assert export_view.uploaded_model_file({"model": "upload my model.gguf"}) == "my model.gguf"
    assert export_view.uploaded_model_file({"model": "upload config.json"}) is None
    assert export_view.uploaded_model_file({"trace": "example t.parquet"}) is None
    named = export_view.with_model_file(text, "my model.gguf")
    assert "llama-server -m 'my model.gguf' -ngl 99" in named and "MODEL.gguf" not in named
    assert export_view.with_model_file(text, None) == text
