"""How sure is the pick: prediction intervals, win probabilities, equivalent candidates, the
prompts a confident pick needs, and the noise-aware evaluation (regret, ties, coverage)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import tiny_measurements, tiny_profile, tiny_trace

from cope_core import parquet_io, predict
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.evaluate import evaluate, score
from cope_core.estimate.noise import measured_cells
from cope_core.estimate.uncertainty import confidence_lines, intervals, row_draws
from cope_core.matrix import CANDIDATE_IDS, get_candidate
from cope_core.profile.data import ProfileKey, same_schedule
from cope_core.profile.raw_samples import raw_key

A, B = get_candidate("fixed/parallel"), get_candidate("fixed/wait_then_gpu")


# --- win probability and equivalence on hand-made per-prompt TPOTs --------------------------------
def test_a_constant_lead_on_every_prompt_wins_every_draw():
    rng = np.random.default_rng(0)
    a = rng.uniform(100, 200, 12)
    frame, conf = intervals([a, a + 1.0], None, [A, B], 1000,
                            np.random.default_rng(1))
    assert frame["win_probability"].tolist() == [1.0, 0.0]
    assert conf.winner == A.id and conf.win_probability == 1.0
    assert conf.contender == B.id and conf.contender_probability == 0.0
    assert conf.prompts_for_confidence is None and conf.unreachable is None
    assert conf.gap_us == pytest.approx(1.0)
    # the interval is the bootstrap of the prompt mean: it holds the mean, within the prompts
    assert a.min() <= frame["tpot_lo_us"][0] <= a.mean() <= frame["tpot_hi_us"][0] <= a.max()


def test_a_symmetric_race_is_a_coin_toss():
    # differences +x and -x in pairs: the mean difference's bootstrap is symmetric about 0
    x = np.linspace(1.0, 3.0, 20)
    d = np.concatenate([x, -x])
    a = np.full(40, 500.0)
    draws = 4000
    frame, conf = intervals([a, a + d], None, [A, B], draws,
                            np.random.default_rng(2))
    se = np.sqrt(0.25 / draws)
    assert frame["win_probability"][0] == pytest.approx(0.5, abs=5 * se)
    assert frame["win_probability"].sum() == pytest.approx(1.0)
    assert conf.unreachable == "tie" and conf.prompts_for_confidence is None


def test_identical_candidates_are_equivalent_not_rivals():
    a = np.array([10.0, 12.0, 11.0])
    c = get_candidate("fixed/cost_selected")
    frame, conf = intervals([a, a + 5, a.copy()], None, [A, B, c], 500,
                            np.random.default_rng(3))
    assert frame["equivalent_to"].tolist() == [None, None, A.id]
    assert np.isnan(frame["win_probability"][2])
    assert frame["win_probability"][:2].sum() == pytest.approx(1.0)
    assert conf.contender == B.id


def test_prompts_needed_for_confidence_reach_it():
    # a small lead with prompt-to-prompt noise: too few prompts for 90 %; the estimate of how
    # many would do it, checked by repeating the same prompts that many times
    rng = np.random.default_rng(4)
    P = 10
    d = 0.3 + rng.normal(0.0, 2.0, P)
    d -= d.mean() - 0.3                       # mean lead exactly 0.3
    a = np.full(P, 100.0)
    frame, conf = intervals([a, a + d], None, [A, B], 2000,
                            np.random.default_rng(5))
    assert conf.win_probability < 0.9
    n = conf.prompts_for_confidence
    assert n is not None and n > P
    # with var(d)/n shrinking as 1/n: z_0.9 = 1.2816 -> n = var(d) / (mean / z)^2 (normal)
    want = np.var(d) / (0.3 / 1.2816) ** 2
    assert n == pytest.approx(want, rel=0.15)
    reps = int(np.ceil(n / P))
    big_a, big_d = np.tile(a, reps), np.tile(d, reps)
    frame, conf = intervals([big_a, big_a + big_d], None, [A, B], 2000,
                            np.random.default_rng(6))
    assert conf.win_probability >= 0.86


# --- predict ---------------------------------------------------------------------------------
def test_predict_columns_are_reproducible_and_consistent():
    tr, prof = tiny_trace(), tiny_profile()
    a = predict(tr, prof, [1, 2], calibration=tr, seed=7)
    b = predict(tr, prof, [1, 2], calibration=tr, seed=7)
    c = predict(tr, prof, [1, 2], calibration=tr, seed=8)
    for col in ("tpot_lo_us", "tpot_hi_us", "win_probability"):
        np.testing.assert_array_equal(a[col].to_numpy(), b[col].to_numpy())
    assert not np.array_equal(a["tpot_lo_us"].to_numpy(), c["tpot_lo_us"].to_numpy())
    assert (a["tpot_lo_us"] <= a["tpot_us"]).all() and (a["tpot_us"] <= a["tpot_hi_us"]).all()
    for _, sub in a.groupby("experts_per_layer"):
        rivals = sub[sub["equivalent_to"].isna()]
        assert rivals["win_probability"].sum() == pytest.approx(1.0)
        assert sub[sub["equivalent_to"].notna()]["win_probability"].isna().all()
    u = a.attrs["uncertainty"]
    assert u["draws"] == 1000 and u["seed"] == 7 and u["sources"] == ["prompts", "profile"]
    assert set(u["per_k"]) == {1, 2}


def test_a_k_has_the_same_numbers_whichever_k_are_predicted_with_it():
    # one number per question (issue 38): a sweep's row equals the prediction at that K alone,
    # so the app's pages (one K, or every K) and the CLI agree on interval and win share
    tr, prof = tiny_trace(), tiny_profile()
    cols = ["tpot_us", "tpot_lo_us", "tpot_hi_us", "draws_lo_us", "draws_hi_us",
            "win_probability"]
    together = predict(tr, prof, [0, 1, 2, 3], calibration=tr, seed=3)
    for k in (3, 1):
        alone = predict(tr, prof, k, calibration=tr, seed=3)
        row = together[together["experts_per_layer"] == k].reset_index(drop=True)
        np.testing.assert_array_equal(row[cols].to_numpy(), alone[cols].to_numpy())
        assert together.attrs["uncertainty"]["per_k"][k] == alone.attrs["uncertainty"]["per_k"][k]


def test_draws_zero_turns_the_bootstrap_off():
    tr, prof = tiny_trace(), tiny_profile()
    df = predict(tr, prof, 2, calibration=tr, draws=0)
    assert df["tpot_lo_us"].isna().all() and df["win_probability"].isna().all()
    assert df.attrs["uncertainty"]["draws"] == 0
    assert "--draws 0" in confidence_lines(df, 2)[0]
    with pytest.raises(CopeInputError, match="--draws"):
        predict(tr, prof, 2, calibration=tr, draws=-1)


def test_an_analytic_profile_draws_its_model_uncertainty():
    from cope_core.platforms import platform_spec
    from cope_core.profile.analytic import analytic_profile
    tr = tiny_trace()
    prof = analytic_profile(tr.model, platform_spec("h100"))
    df = predict(tr, prof, 2, calibration=tr)
    assert df.attrs["uncertainty"]["sources"] == ["prompts", "profile"]
    assert "model uncertainty of the analytic profile" in \
        df.attrs["uncertainty"]["profile_spread"]


def test_rows_timed_once_share_their_draw():
    # cost_selected with every miss on the CPU is parallel's measurement: identical draws,
    # so a candidate whose split puts every miss on the CPU stays equivalent under draws
    prof = tiny_profile()
    rows, _ = prof.operating_point_rows()
    values = row_draws(rows, prof.model.top_k, 200, np.random.default_rng(0))
    keys = [ProfileKey(*k) for k in rows[list(ProfileKey._fields)].itertuples(index=False)]
    pos = {k: i for i, k in enumerate(keys)}
    shared = [(i, pos[same_schedule(k, 2)]) for i, k in enumerate(keys)
              if same_schedule(k, 2) != k]
    assert shared
    for i, j in shared:
        np.testing.assert_array_equal(values[i], values[j])
    distinct = [i for i, k in enumerate(keys) if same_schedule(k, 2) == k]
    assert len({values[i][0] for i in distinct}) > len(distinct) // 2   # independent draws


def test_raw_samples_drive_their_rows():
    prof = tiny_profile()
    rows, _ = prof.operating_point_rows()
    key = ProfileKey(*rows[list(ProfileKey._fields)].iloc[0])
    threads, share = int(rows["cpu_threads"][0]), float(rows["gpu_share"][0])
    raw = {raw_key(key, threads, share): [5.0, 5.0, 5.0, 9.0, 9.0]}
    v = row_draws(rows, 2, 500, np.random.default_rng(0), raw)
    assert set(np.unique(v[0])) <= {5.0, 9.0}          # medians of resamples of the raw values
    assert 0.5 < np.mean(v[0] == 5.0) < 0.8


def test_profile_spread_widens_the_interval():
    tr = tiny_trace()
    tight = tiny_profile()
    wide = dataclasses.replace(tight, table=tight.table.assign(
        p25_us=tight.table["median_us"] * 0.5, p75_us=tight.table["median_us"] * 1.5))
    a = predict(tr, tight, 2, calibration=tr)
    b = predict(tr, wide, 2, calibration=tr)
    assert ((b["tpot_hi_us"] - b["tpot_lo_us"]) > (a["tpot_hi_us"] - a["tpot_lo_us"])).all()


# --- noise-aware evaluation -----------------------------------------------------------------------
def _cell_table(values: dict[str, list[list[float]]], K: int = 2) -> pd.DataFrame:
    """values[candidate][prompt][trial] -> a measurements table of one cell."""
    rows = [{"candidate": c, "prompt": p, "trial": t, "tpot_us": v, "K": K, "cpu_threads": 8,
             "gpu_share": 100.0}
            for c, per_prompt in values.items() for p, trials in enumerate(per_prompt)
            for t, v in enumerate(trials)]
    return pd.DataFrame(rows)


def test_regret_is_what_the_pick_costs():
    # the pick measured 3 % slower than the measured best, on every prompt and trial
    table = _cell_table({A.id: [[103.0, 103.0]] * 3, B.id: [[100.0, 100.0]] * 3})
    pairs = pd.DataFrame({"prompt": [0, 1, 2] * 2, "candidate": [A.id] * 3 + [B.id] * 3,
                          "predicted_us": [90.0] * 3 + [95.0] * 3,
                          "measured_us": [103.0] * 3 + [100.0] * 3, "K": 2, "cpu_threads": 8,
                          "gpu_share": 100.0})
    ev = score({"cope": pairs}, measured_cells(table, draws=500))["cope"]
    assert ev.noise.regret_mean_pct == pytest.approx(3.0)
    assert ev.noise.regret_max_pct == pytest.approx(3.0)
    assert ev.noise.top1_cells == (0, 1) and ev.noise.top1_within_noise == (0, 1)
    cell = ev.per_k[0]
    assert cell["predicted"] == A.id and cell["measured"] == B.id
    assert cell["measured_tied"] == [B.id] and cell["within_noise"] is False


def test_candidates_within_noise_are_tied():
    rng = np.random.default_rng(0)
    base = rng.normal(100.0, 2.0, (6, 4))
    noisy = base + rng.normal(0.0, 2.0, (6, 4))     # no systematic difference
    slower = base + 10.0
    table = _cell_table({A.id: noisy.tolist(), B.id: base.tolist(),
                         "fixed/ready_first": slower.tolist()})
    cells = measured_cells(table, draws=1000, seed=1).set_index("candidate")
    best = cells.index[cells["winner"]][0]
    assert cells["tied"].sum() == 2 and not cells.loc["fixed/ready_first", "tied"]
    assert best in (A.id, B.id)
    for _, r in cells.iterrows():
        assert r["tpot_lo_us"] <= r["tpot_us"] <= r["tpot_hi_us"]


def test_one_trial_of_one_prompt_ties_only_exact_equality():
    table = _cell_table({A.id: [[100.0]], B.id: [[100.0]], "fixed/ready_first": [[100.5]]})
    cells = measured_cells(table, draws=1000).set_index("candidate")
    assert cells["tied"].to_dict() == {A.id: True, B.id: True, "fixed/ready_first": False}
    assert cells.loc[A.id, "winner"] and not cells.loc[B.id, "winner"]   # tie rule
    assert (cells["tpot_lo_us"] == cells["tpot_us"]).all()                # nothing to resample


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.floats(50.0, 150.0), min_size=3, max_size=3), min_size=2,
                max_size=6), st.integers(0, 2**16))
def test_tie_aware_top1_is_at_least_the_strict_one(prompt_values, seed):
    rng = np.random.default_rng(seed)
    vals = np.array(prompt_values)                  # (prompts, 3 candidates)
    ids = [A.id, B.id, "fixed/ready_first"]
    table = _cell_table({c: [[v, v * (1 + 0.01 * rng.normal())] for v in vals[:, i]]
                         for i, c in enumerate(ids)})
    pred = vals * rng.uniform(0.8, 1.2, vals.shape)
    pairs = pd.DataFrame([{"prompt": p, "candidate": c, "predicted_us": pred[p, i],
                           "measured_us": float(np.median(table[(table.candidate == c)
                                                                & (table.prompt == p)].tpot_us)),
                           "K": 2, "cpu_threads": 8, "gpu_share": 100.0}
                          for p in range(len(vals)) for i, c in enumerate(ids)])
    ev = score({"cope": pairs}, measured_cells(table, draws=200, seed=seed))["cope"]
    assert ev.noise.top1_within_noise[0] >= ev.noise.top1_cells[0]
    assert ev.noise.regret_mean_pct >= 0 and ev.noise.regret_max_pct >= ev.noise.regret_mean_pct
    assert (ev.noise.regret_max_pct == 0) == (ev.noise.top1_cells[0] == 1)


def test_evaluate_reports_coverage_for_measured_profiles_only():
    from cope_core.platforms import platform_spec
    from cope_core.profile.analytic import analytic_profile
    tr, m = tiny_trace(), tiny_measurements()
    ev = evaluate(tr, tiny_profile(), m, tr, estimators=["cope", "atomic"])
    assert ev["cope"].noise.interval_coverage is not None
    assert 0.0 <= ev["cope"].noise.interval_coverage <= 1.0
    ana = evaluate(tr, analytic_profile(tr.model, platform_spec("h100")), m, tr,
                   estimators=["cope"])
    assert ana["cope"].noise.interval_coverage is None
    off = evaluate(tr, tiny_profile(), m, tr, estimators=["cope"], draws=0)
    assert off["cope"].noise.interval_coverage is None


# --- the command line ---------------------------------------------------------------------------
def test_predict_json_and_table_carry_the_confidence(capsys, files):
    args = ["predict", "--trace", str(files["trace"]), "--profile", str(files["profile"]),
            "--calibration", str(files["trace"]), "-K", "2"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"tpot_ci_us", "win_probability", "equivalent_to"} <= set(data[0])
    for d in data:
        lo, hi = d["tpot_ci_us"]
        assert lo <= d["tpot_us"] <= hi
    assert sum(d["win_probability"] for d in data if d["equivalent_to"] is None) == \
        pytest.approx(1.0)
    assert main(args) == 0
    out = capsys.readouterr().out
    win = next(line for line in out.splitlines() if line.startswith("winner:"))
    assert "[" in win and "of the paired draws" in win
    # the JSON carries the draws' spread alone too, inside the absolute interval
    for d in data:
        lo, hi = d["tpot_ci_us"]
        dlo, dhi = d["tpot_draws_ci_us"]
        assert lo <= dlo <= d["tpot_us"] <= dhi <= hi


@pytest.mark.parametrize("argv,needle", [
    (["--draws", "-1"], "--draws"),
    (["--draws", "x"], "--draws"),
])
def test_bad_draws_is_a_one_line_error(capsys, files, argv, needle):
    code = main(["predict", "--trace", str(files["trace"]), "--profile", str(files["profile"]),
                 "-K", "2", *argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_a_nan_iqr_in_a_profile_is_a_one_line_error(capsys, files):
    import pyarrow.parquet as pq
    t = pq.read_table(files["profile"])
    df = t.to_pandas()
    df.loc[3, "p75_us"] = np.nan
    import pyarrow as pa
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(
        t.schema.metadata), files["profile"])
    code = main(["predict", "--trace", str(files["trace"]), "--profile", str(files["profile"]),
                 "-K", "2"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert "p75_us" in err and "row 3" in err


def test_one_trial_measurements_evaluate_with_ties_by_equality(capsys, files):
    m = tiny_measurements()
    one = dataclasses.replace(m, table=m.table[m.table["trial"] == 0])
    parquet_io.write_measurements(one, files["measurements"], overwrite=True)
    code = main(["evaluate", "--trace", str(files["trace"]), "--profile", str(files["profile"]),
                 "--calibration", str(files["trace"]), "--measurements",
                 str(files["measurements"]), "--spec", "h100", "--json", "--per-k"])
    out = capsys.readouterr().out
    assert code == 0
    res = json.loads(out)["cope"]
    assert res["top1_within_noise"][1] == 1 and res["regret_pct"]["mean"] >= 0
    cell = res["per_k"][0]
    assert cell["measured_tied"] == [cell["measured"]]    # distinct values: no ties
    assert set(CANDIDATE_IDS) >= set(cell["measured_tied"])
