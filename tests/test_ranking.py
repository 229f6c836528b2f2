"""One runner-up rule (``cope_core.estimate.ranking``): hand-worked cases, and the CLI, the app
and the exports naming the same runner-up on every shipped example."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cope_core.app import whatif
from cope_core.app.dataset import scan_examples
from cope_core.cli.main import main
from cope_core.estimate import predict
from cope_core.estimate.ranking import (
    Verdict,
    fastest_first,
    frame_runner_up,
    most_likely_fastest,
    policy_of,
    runner_up,
)
from cope_core.estimate.uncertainty import confidence_lines
from cope_core.export.build import build_policy
from cope_core.export.policy import Policy, policy_json
from cope_core.matrix import CANDIDATE_IDS
from cope_core.parquet_io import read_profile, read_trace

ROOT = Path(__file__).resolve().parents[1]
LP, FP, FC, MP = ("layer_partition", "fixed/parallel", "fixed/cost_selected",
                  "mutable_per_layer/parallel")


def test_ties_keep_the_canonical_order_whatever_the_mapping_order():
    t = {FC: 5.0, MP: 7.0, FP: 5.0, LP: 6.0}
    assert fastest_first(t) == [FP, FC, LP, MP]


def test_the_runner_up_skips_the_winners_own_policy():
    t = {FP: 5.0, FC: 5.0, LP: 6.0, MP: 7.0}
    assert runner_up(t) == FC                         # without equivalences: the next id
    assert runner_up(t, {FC: FP}) == LP               # cost_selected IS parallel here
    assert runner_up(t, {FC: FP}, chosen=FC) == LP    # seen from the equivalent one too
    assert runner_up(t, {FC: FP}, chosen=LP) == FP    # a slower choice: the fastest other
    assert runner_up(t, {FC: FP, LP: None}, chosen=MP) == FP
    assert policy_of(FC, {FC: FP}) == FP and policy_of(LP, {FC: FP}) == LP


def test_no_runner_up_when_every_other_candidate_is_the_same_policy():
    t = {FP: 5.0, FC: 5.0}
    assert runner_up(t, {FC: FP}) is None
    assert runner_up({FP: 5.0}) is None
    with pytest.raises(ValueError):
        runner_up({})


@given(st.dictionaries(st.sampled_from(CANDIDATE_IDS), st.integers(0, 4), min_size=1),
       st.lists(st.integers(0, 12), min_size=13, max_size=13))
def test_the_runner_up_is_the_fastest_candidate_of_another_policy(times, links):
    ids = sorted(times, key=CANDIDATE_IDS.index)
    # equivalences as predict makes them: each candidate is its own policy or an earlier root's
    eq: dict[str, str | None] = {}
    for i, c in enumerate(ids):
        j = links[i] % (i + 1)
        eq[c] = ids[j] if j < i and eq[ids[j]] is None else None
    win = fastest_first(times)[0]
    ru = runner_up(times, eq)
    if ru is None:
        assert all(policy_of(c, eq) == policy_of(win, eq) for c in times)
        return
    assert policy_of(ru, eq) != policy_of(win, eq)
    for c in times:   # whatever ranks before the runner-up is the winner's policy
        if (times[c], CANDIDATE_IDS.index(c)) < (times[ru], CANDIDATE_IDS.index(ru)):
            assert policy_of(c, eq) == policy_of(win, eq), (c, ru)


def test_frame_runner_up_reads_the_prediction_frame():
    df = pd.DataFrame({"candidate": [LP, FP, FC], "tpot_us": [6.0, 5.0, 5.0],
                       "equivalent_to": [None, None, FP], "experts_per_layer": 3})
    assert frame_runner_up(df).candidate == LP
    with pytest.raises(ValueError, match="more than one K"):
        frame_runner_up(pd.concat([df, df.assign(experts_per_layer=4)]))


def _cli_runner_up(capsys, trace, calibration, profile, K) -> str | None:
    argv = ["predict", "--trace", trace, "--profile", profile, "-K", str(K)]
    if calibration:
        argv += ["--calibration", calibration]
    assert main(argv) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("runner-up:")]
    assert len(line) == 1, line
    return None if line[0].startswith("runner-up: none") else line[0].split()[1]


def test_cli_app_and_export_name_the_same_runner_up_on_every_shipped_example(capsys):
    seen = 0
    for ex in scan_examples(ROOT / "data" / "examples"):
        tr, prof = read_trace(ex.traces[0]), read_profile(ex.profiles[0])
        cal = read_trace(ex.calibrations[0]) if ex.calibrations else None
        g = tr.model
        K = whatif.k_for_budget(g, whatif.default_budget(g, prof.platform))
        app = whatif.winner_of(predict(tr, prof, [K], cal)).runner_up
        cli = _cli_runner_up(capsys, ex.traces[0], ex.calibrations[0] if cal else None,
                             ex.profiles[0], K)
        pol = build_policy(tr, prof, cal, experts_per_layer=K)
        export = None if pol.runner_up is None else pol.runner_up[0]
        assert app == cli == export, (ex.name, K, app, cli, export)
        # and the record says so after a round trip through its JSON
        again = Policy.from_dict(json.loads(policy_json(pol)))
        assert again.runner_up == pol.runner_up
        seen += 1
    assert seen >= 5


def test_readme_example_names_a_different_policy_as_runner_up(capsys, monkeypatch):
    """README command 1's example: fixed/cost_selected is fixed/parallel at K = 29 (every miss on
    the CPU), so the runner-up is the layer partition."""
    ex = ROOT / "data" / "examples"
    text = (ROOT / "scripts" / "quickstart.sh").read_text()
    args = re.search(r"cope predict (.*?)\n(?!\s)", text, re.S).group(1).replace("\\\n", " ")
    monkeypatch.chdir(ROOT)
    assert main(["predict", *shlex.split(args)]) == 0
    out = capsys.readouterr().out
    assert "winner: fixed/parallel" in out
    readme = (ROOT / "README.md").read_text()
    shown = readme[readme.index("then what llama.cpp itself can run best"):]
    shown = shown[shown.index("```\n") + 4:]
    shown = shown[:shown.index("```")]
    assert shown and shown in out, "README's worked answer is not what the command prints"
    assert re.search(r"^runner-up: layer_partition .*\(\+\d+\.\d%\)$", out, re.M), out
    pol = build_policy(read_trace(ex / "qwen3-30b-a3b-trace.parquet"),
                       read_profile(ex / "qwen3-30b-a3b-rtx4090-analytic.parquet"),
                       read_trace(ex / "qwen3-30b-a3b-calibration.parquet"), vram_gib=16)
    assert pol.candidate == FP and pol.runner_up[0] == LP
    assert pol.equivalent_to[FC] == FP


def _record(equivalent_to, tpot=None) -> Policy:
    from cope_core.geometry import CATALOG
    g = CATALOG["olmoe-1b-7b"]
    table = tpot or {c: 1000.0 * (i + 1) for i, c in enumerate(CANDIDATE_IDS)}
    return Policy(model=g, candidate=FP, experts_per_layer=0,
                  resident_experts=tuple(() for _ in range(g.n_layers)),
                  predictions_us={"cope": table, "atomic": None, "hrm": None},
                  platform={"gpu": "test"}, cpu_threads=1, gpu_share=100.0,
                  vram={"budget_gib": None, "needed_gib": 1.0}, equivalent_to=equivalent_to)


def test_a_policy_record_without_a_rival_policy_says_so_and_reads_back():
    same = {c: 5000.0 for c in CANDIDATE_IDS}
    eq = {c: None if c == LP else LP for c in CANDIDATE_IDS}     # K = E: everything resident
    pol = _record(eq, same)
    assert pol.runner_up is None and pol.margin_pct is None
    data = json.loads(policy_json(pol))
    assert data["runner_up"] is None and data["margin_pct"] is None
    assert Policy.from_dict(data).runner_up is None
    # a record from before equivalences were kept reads as every candidate its own policy
    del data["equivalent_to"]
    data["runner_up"], data["margin_pct"] = {"candidate": LP, "tpot_us": 5000.0}, 0.0
    assert Policy.from_dict(data).runner_up == (LP, 5000.0)


def test_a_policy_record_checks_its_equivalences():
    from cope_core.errors import CopeInputError
    with pytest.raises(CopeInputError, match="equivalent_to.*expected another candidate id"):
        _record({FC: "fixed/none"})
    with pytest.raises(CopeInputError, match="equivalent_to"):
        _record({FP: FP})


# --- the named winner of the paired draws (most_likely_fastest) -----------------------------------
def test_a_majority_that_the_interval_does_not_separate_is_a_tie():
    # 4 paired draws of A and B: A is fastest in 3 (75 %), below the 97.5 % a winner needs
    means = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 2.0], [1.0, 2.0]])
    v = most_likely_fastest(means, ["A", "B"], [1.5, 2.0])
    assert v == Verdict("A", 0.75, "B", 0.75, True)
    assert v.name == "tied: A or B"
    assert v.reason == ("A is fastest in 75 % of the paired draws, faster than B in 75 %: below "
                        "the 97.5 % a winner needs over every rival")


def test_a_winner_beats_every_rival_in_at_least_the_clear_share():
    # 40 draws, A faster than B in 39 of them: 97.5 % exactly, which names A alone
    means = np.array([[1.0, 2.0]] * 39 + [[3.0, 2.0]])
    v = most_likely_fastest(means, ["A", "B"], [1.05, 2.0])
    assert (v.name, v.tied, v.beats_rival) == ("A", False, 0.975)
    assert v.reason == "A is fastest in 98 % of the paired draws, faster than B in 98 %"
    # one faster draw fewer (38 of 39) is not enough
    assert most_likely_fastest(means[1:], ["A", "B"], [1.05, 2.0]).tied


def test_the_leader_is_the_most_likely_fastest_not_the_lowest_point():
    # A has the lower point (a few draws far below) but B is fastest in 3 of 5 draws
    means = np.array([[0.1, 1.0], [0.1, 1.0], [1.2, 1.0], [1.2, 1.0], [1.2, 1.0]])
    v = most_likely_fastest(means, ["A", "B"], [0.76, 1.0])
    assert (v.leader, v.leader_share, v.rival, v.beats_rival) == ("B", 0.6, "A", 0.6)
    assert v.name == "tied: B or A"


def test_the_rival_is_the_one_the_leader_beats_least_often():
    # A fastest in every draw; it beats B in all 4 but C in only 3 (the 4th an exact tie, which
    # goes to the earlier id as fastest but is not "faster than")
    means = np.array([[1.0, 5.0, 2.0], [1.0, 5.0, 2.0], [1.0, 5.0, 2.0], [2.0, 5.0, 2.0]])
    v = most_likely_fastest(means, ["A", "B", "C"], [1.25, 5.0, 2.0])
    assert v == Verdict("A", 1.0, "C", 0.75, True)


def test_a_single_rival_is_named_alone():
    v = most_likely_fastest(np.array([[3.0], [4.0]]), ["A"], [3.5])
    assert v == Verdict("A", 1.0, None, 1.0, False) and v.name == "A"
    assert v.reason == "A is fastest in 100 % of the paired draws"
    assert Verdict.from_dict(v.to_dict()) == v
    with pytest.raises(ValueError):
        most_likely_fastest(np.zeros((2, 2)), ["A"], [1.0])


def test_cli_and_app_name_the_winner_in_the_same_words(trace, profile):
    df = predict(trace, profile, 3, calibration=trace)
    v = Verdict.from_dict(df.attrs["uncertainty"]["per_k"][3]["verdict"])
    line = next(x for x in confidence_lines(df, 3) if x.startswith("winner: "))
    w = whatif.winner_of(df)
    assert line.startswith(f"winner: {v.name}") and w.named == v.name
    assert line.endswith(v.reason) and w.sentence().endswith(v.reason)
    # a tie, as the app says it and the CLI prints it
    tied = df.copy()
    tied.attrs = {"uncertainty": {"per_k": {3: {
        **df.attrs["uncertainty"]["per_k"][3],
        "verdict": Verdict(v.leader, 0.6, "layer_partition", 0.6, True).to_dict()}}}}
    line = next(x for x in confidence_lines(tied, 3) if x.startswith("winner: "))
    w = whatif.winner_of(tied)
    assert line.startswith(f"winner: tied: {v.leader} or layer_partition: {v.leader} ")
    assert w.named == f"tied: {v.leader} or layer_partition" and not w.sure
    assert w.sentence().startswith(f"tied: {v.leader} or layer_partition: {v.leader} at ")
    assert line.endswith("below the 97.5 % a winner needs over every rival")
    assert w.sentence().endswith("below the 97.5 % a winner needs over every rival")
