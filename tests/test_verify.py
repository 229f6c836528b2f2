"""``cope verify`` (docs/design.md#verifying-a-pick): the contenders, the verdict of a round, the
race on the executor (its runs replaced by a spy with hand-set TPOTs, so every outcome is exact),
the cope.verify/1 record and ``cope export --from-verify``."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from tiny import tiny_profile, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.predict import predict
from cope_core.estimate.racing import contenders, judge
from cope_core.executor.cell import ExecutorSettings
from cope_core.executor.decode import CandidateDecoder, PromptRun
from cope_core.verify import VerifyRecord, VerifySettings, read_verify, verify, verify_json

QUIET = ExecutorSettings(warmup_tokens=0, warmup_prompts=False)


# --- contenders --------------------------------------------------------------------------------
def _prediction(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["candidate", "tpot_us", "tpot_lo_us", "tpot_hi_us",
                                       "win_probability", "equivalent_to"])


def test_contenders_are_the_winner_and_whoever_could_still_win():
    df = _prediction([
        ("layer_partition", 150.0, 140.0, 160.0, 0.0, None),
        ("fixed/parallel", 100.0, 95.0, 105.0, 0.90, None),
        ("fixed/cost_selected", 100.0, 95.0, 105.0, np.nan, "fixed/parallel"),  # same policy
        ("fixed/ready_first", 110.0, 104.0, 116.0, 0.005, None),  # interval overlaps 95-105
        ("fixed/wait_then_gpu", 108.0, 106.0, 110.0, 0.095, None),  # p >= 1 %
        ("mutable_per_layer/parallel", 120.0, 106.0, 130.0, 0.0, None),
    ])
    assert contenders(df) == ["fixed/parallel", "fixed/wait_then_gpu", "fixed/ready_first"]
    # a sure winner still races the fastest rival: at least two
    sure = _prediction([("fixed/parallel", 100.0, 99.0, 101.0, 1.0, None),
                        ("layer_partition", 150.0, 149.0, 151.0, 0.0, None),
                        ("fixed/ready_first", 140.0, 139.0, 141.0, 0.0, None)])
    assert contenders(sure) == ["fixed/parallel", "fixed/ready_first"]
    # without intervals (draws 0) only the top-up applies
    bare = sure[["candidate", "tpot_us"]]
    assert contenders(bare) == ["fixed/parallel", "fixed/ready_first"]
    # the absolute intervals (with the model's error, common to all) overlap, the draws' alone do
    # not: ranking reads the draws' spread
    wide = sure.assign(tpot_lo_us=sure.tpot_us * 0.8, tpot_hi_us=sure.tpot_us * 1.25,
                       draws_lo_us=sure.tpot_lo_us, draws_hi_us=sure.tpot_hi_us)
    assert contenders(wide) == ["fixed/parallel", "fixed/ready_first"]
    assert contenders(wide.drop(columns=["draws_lo_us", "draws_hi_us"])) == \
        ["fixed/parallel", "fixed/ready_first", "layer_partition"]


# --- one round's verdict -----------------------------------------------------------------------
def _runs(values: dict[str, list[list[float]]]) -> pd.DataFrame:
    """candidate -> per prompt -> per trial TPOT."""
    return pd.DataFrame([(c, p, t, v) for c, ps in values.items() for p, ts in enumerate(ps)
                         for t, v in enumerate(ts)],
                        columns=["candidate", "prompt", "trial", "tpot_us"])


def test_judge_drops_the_clearly_slower_and_sees_equivalence():
    rng = np.random.default_rng(0)
    t = _runs({"a": [[100, 101], [99, 100]], "b": [[130, 129], [131, 130]],
               "c": [[100.5, 100], [99.5, 100.5]]})
    v = judge(t, ["a", "b", "c"], 0.02, 500, rng)
    assert v.leader == "a" and v.measured_us == {"a": 100.0, "b": 130.0, "c": 100.125}
    assert v.dropped == [("b", pytest.approx(30.0))]
    assert v.equivalent                       # c within 2 % of a
    assert not judge(t, ["a", "c"], 0.0, 500, rng).equivalent   # no tolerance: not equivalent
    same = _runs({"a": [[100, 100]], "b": [[100, 100]]})
    assert judge(same, ["a", "b"], 0.0, 500, rng) == judge(same, ["a", "b"], 0.02, 500, rng)
    assert judge(same, ["a", "b"], 0.0, 500, rng).equivalent   # exactly equal


# --- the race, with a spy ----------------------------------------------------------------------
class Spy:
    """``CandidateDecoder.run_prompt`` with TPOT ``f(candidate, prompt index, n-th run)``."""

    def __init__(self, f):
        self.f, self.count, self.calls = f, {}, []

    def install(self, monkeypatch):
        def run_prompt(decoder, trace, p, tokens=None, record=False):
            c = decoder.candidate.id
            n = self.count.get((c, p), 0)
            self.count[(c, p)] = n + 1
            self.calls.append(c)
            k = trace.model.top_k + 1
            return PromptRun(np.full(2, float(self.f(c, p, n))), np.zeros((3, k)),
                             np.zeros((3, k)))
        monkeypatch.setattr(CandidateDecoder, "run_prompt", run_prompt)
        return self


def _cont() -> list[str]:
    df = predict(tiny_trace(), tiny_profile(), 2, tiny_trace(), cpu_threads=8)
    return contenders(df)


def _verify(**kw):
    settings = kw.pop("settings", VerifySettings(draws=300))
    return verify(tiny_trace(), tiny_profile(), tiny_trace(), experts_per_layer=2,
                  cpu_threads=[8], settings=settings, executor=QUIET, progress=False, **kw)


def test_a_clear_winner_is_verified_in_the_fewest_rounds(monkeypatch):
    ids = _cont()
    Spy(lambda c, p, n: 100.0 if c == ids[0] else 130.0).install(monkeypatch)
    (cell,) = _verify().cells
    assert [x["candidate"] for x in cell.contenders] == ids
    assert cell.predicted_winner == cell.verified_winner == ids[0] and cell.agrees
    assert (cell.stop, cell.rounds, cell.remaining) == ("one left", 2, [ids[0]])
    assert [(d["candidate"], d["round"]) for d in cell.dropped] == [(c, 2) for c in ids[1:]]
    assert cell.candidate_trials == 2 * len(ids) and cell.full_candidate_trials == 13 * 3
    assert cell.measured_us == 100.0 and len(cell.runs) == 2 * len(ids) * 2   # prompts x rounds
    assert cell.full_seconds_estimate > 0


def test_a_wrong_prediction_is_refuted(monkeypatch):
    ids = _cont()
    Spy(lambda c, p, n: 120.0 if c == ids[0] else 100.0 if c == ids[1] else 140.0)\
        .install(monkeypatch)
    (cell,) = _verify().cells
    assert cell.verified_winner == ids[1] and not cell.agrees
    assert ids[0] in [d["candidate"] for d in cell.dropped]


def test_the_race_stops_at_equivalence_the_round_limit_and_the_budget(monkeypatch):
    ids = _cont()
    Spy(lambda c, p, n: 100.0 if c in ids[:2] else 150.0).install(monkeypatch)
    (cell,) = _verify().cells
    assert cell.stop == "equivalent" and sorted(cell.remaining) == sorted(ids[:2])
    assert cell.rounds == 2 and cell.agrees
    # a wobbling pair never separates and, with no tolerance, never counts as equivalent
    Spy(lambda c, p, n: (100.0 + 2 * (n % 2) if c == ids[0] else 101.0 - 2 * (n % 2))
        if c in ids[:2] else 150.0).install(monkeypatch)
    (cell,) = _verify(settings=VerifySettings(tolerance=0.0, max_rounds=4, draws=300)).cells
    assert (cell.stop, cell.rounds) == ("max rounds", 4)
    assert cell.candidate_trials == len(ids) * 2 + 2 * 2
    (cell,) = _verify(settings=VerifySettings(budget_min=1e-9, draws=300)).cells
    assert (cell.stop, cell.rounds) == ("budget", 1)


def test_settings_are_checked():
    for bad, field in ((VerifySettings(tolerance=1.5), "--tolerance"),
                       (VerifySettings(min_rounds=1), "--min-rounds"),
                       (VerifySettings(min_rounds=4, max_rounds=3), "--max-rounds"),
                       (VerifySettings(budget_min=0), "--budget-min")):
        with pytest.raises(CopeInputError) as info:
            _verify(settings=bad)
        assert info.value.field == field


# --- the record, the CLI and the export ---------------------------------------------------------
def test_record_round_trips_as_strict_json(monkeypatch, tmp_path):
    ids = _cont()
    Spy(lambda c, p, n: 100.0 if c == ids[0] else 130.0).install(monkeypatch)
    rec = _verify()
    text = verify_json(rec)
    data = json.loads(text)
    assert data["schema"] == "cope.verify/1" and data["totals"]["agree"] == 1
    back = VerifyRecord.from_dict(data)
    assert back.cells == rec.cells and back.model == rec.model
    bad = json.loads(text)
    bad["cells"][0]["stop"] = "tired"
    with pytest.raises(CopeInputError) as info:
        VerifyRecord.from_dict(bad, source="v.json")
    assert info.value.field == "cells[0].stop" and "expected one of" in str(info.value)
    bad = json.loads(text)
    del bad["cells"][0]["runs"]
    with pytest.raises(CopeInputError) as info:
        VerifyRecord.from_dict(bad, source="v.json")
    assert info.value.field == "cells[0].runs"
    with pytest.raises(CopeInputError) as info:
        rec.cell(K=5)
    assert "no cells match; the record has K=2 threads=8" in str(info.value)
    assert dataclasses.replace(rec).totals()["cells"] == 1


def test_cli_verify_and_export_from_verify(monkeypatch, tmp_path, capsys):
    ids = _cont()
    Spy(lambda c, p, n: 100.0 if c == ids[1] else 130.0).install(monkeypatch)
    t, p = tmp_path / "t.parquet", tmp_path / "p.parquet"
    parquet_io.write_trace(tiny_trace(), t)
    parquet_io.write_profile(tiny_profile(), p)
    out = tmp_path / "v.json"
    args = ["verify", "--trace", str(t), "--calibration", str(t), "--profile", str(p), "-K", "2",
            "--threads", "8", "--no-warmup-prompts", "--warmup-tokens", "0",
            "--no-progress", "--draws", "300", "-o", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"K=2 threads=8: VERIFIED {ids[1]} at 0.100 ms/token" in text
    assert f"predicted {ids[0]}, dropped" in text and "the prediction stood in 0/1 cells" in text
    assert main(args) == 2                              # the record exists: no --force
    assert "exists" in capsys.readouterr().err
    assert main([*args, "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"][0]["verified_winner"] == ids[1]
    assert read_verify(out).cells[0].verified_winner == ids[1]
    # the inputs are named relative to the record, so the folder can move: export from elsewhere
    assert read_verify(out).inputs["trace"]["path"] == "t.parquet"
    monkeypatch.chdir(tmp_path.parent)
    assert main(["export", "--from-verify", str(out), "--format", "json"]) == 0
    pol = json.loads(capsys.readouterr().out)
    assert pol["candidate"]["id"] == ids[1] and pol["candidate"]["chosen_by"] == "verified"
    assert pol["provenance"]["verify"]["predicted_winner"] == ids[0]
    assert main(["export", "--from-verify", str(out), "--candidate", "fixed/parallel",
                 "--format", "json"]) == 2
    assert "drop --candidate" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"schema": "cope.policy/1"}')
    assert main(["export", "--from-verify", str(tmp_path / "bad.json"), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "bad.json" in err and "'schema'" in err
