"""Measurement a user can trust (docs/design.md#trustworthy-measurement): the interleaved order,
the noise floor, the outlier rule and its re-measure, same-work consistency and resume. The
executor's runs are replaced by a spy with hand-set TPOTs, so every number here is exact."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tiny import tiny_geometry, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.quality import check_lines, checks_to_dict, measurement_checks
from cope_core.executor.decode import CandidateDecoder, PromptRun
from cope_core.executor.run import ExecutorSettings, measure
from cope_core.matrix import CANDIDATE_IDS, same_work_groups
from cope_core.measurements import Measurements, noise_floor_pct, outlier_trials

G = tiny_geometry()
QUIET = ExecutorSettings(trials=3, warmup_tokens=0, warmup_prompts=False)


# --- the rules, by hand ------------------------------------------------------------------------
def test_noise_floor_is_the_scaled_mad_over_the_median():
    # median 100, deviations 0 2 2 0 30 -> MAD 2 -> 1.4826 * 2 / 100
    assert noise_floor_pct([100, 102, 98, 100, 130]) == pytest.approx(2.9652)
    assert np.isnan(noise_floor_pct([100, 130]))


def test_outlier_rule_by_hand():
    assert outlier_trials([168.5, 170.0, 307.8]) == [2]        # the shipped example's slow trial
    assert outlier_trials([168.0, 170.0, 175.0]) == []         # 5 < 3 x 1.4826 x 2
    assert outlier_trials([168.0, 170.0, 180.0]) == [2]        # 10 > 8.9
    assert outlier_trials([168.0, 170.0, 180.0], noise_pct=2.5) == []   # 10 < 3 x 4.25
    assert outlier_trials([100.0, 100.0, 102.9]) == []         # the 1 % floor: 2.9 < 3
    assert outlier_trials([100.0, 100.0, 103.1]) == [2]
    assert outlier_trials([100.0, 300.0]) == []                # two trials: no median to stand on


def test_same_work_groups():
    every = same_work_groups(CANDIDATE_IDS[::-1], 6, 6)
    assert every == [(CANDIDATE_IDS, "K = E = 6: every expert is resident")]
    assert same_work_groups(CANDIDATE_IDS, 2, 6, cpu_share=[2, 1, 0]) == [
        (("fixed/parallel", "fixed/cost_selected"), "cost_selected's split puts every miss on "
                                                    "the CPU"),
        (("mutable_per_layer/parallel", "mutable_per_layer/cost_selected"), pytest.approx(
            "cost_selected's split puts every miss on the CPU")),
        (("mutable_cross_layer/parallel", "mutable_cross_layer/cost_selected"), pytest.approx(
            "cost_selected's split puts every miss on the CPU"))]
    assert same_work_groups(CANDIDATE_IDS, 2, 6, cpu_share=[1, 1, 0]) == []
    assert same_work_groups(["fixed/parallel", "layer_partition"], 2, 6, cpu_share=[2, 1, 0]) \
        == []


# --- the loop, with a spy ----------------------------------------------------------------------
class Spy:
    """Stands in for ``CandidateDecoder.run_prompt``: every token takes ``base[candidate]`` µs,
    except the runs listed in ``slow`` ((candidate, prompt index, n-th run of that pair) ->
    TPOT)."""

    def __init__(self, base: dict[str, float], slow: dict | None = None):
        self.base, self.slow, self.calls, self.count = base, slow or {}, [], {}

    def __call__(self, decoder, trace, p, tokens=None, record=False):
        c = decoder.candidate.id
        n = self.count.get((c, p, decoder.K), 0)
        self.count[(c, p, decoder.K)] = n + 1
        self.calls.append((c, decoder.K, p))
        v = self.slow.get((c, p, n), self.base[c])
        k = trace.model.top_k + 1
        return PromptRun(np.full(3, float(v)), np.zeros((3, k)), np.zeros((3, k)))


def _spied(monkeypatch, spy: Spy) -> None:
    monkeypatch.setattr(CandidateDecoder, "run_prompt",
                        lambda self, trace, p, **kw: spy(self, trace, p, **kw))


def test_trials_interleave_and_the_noise_floor_follows_each_trial(monkeypatch):
    spy = Spy({"layer_partition": 100.0, "fixed/parallel": 50.0})
    _spied(monkeypatch, spy)
    m = measure(tiny_trace(), [2], candidates=["fixed/parallel", "layer_partition"],
                settings=QUIET, progress=False)
    # per trial: both candidates on both prompts (4 runs, shuffled), then the reference again
    runs = spy.calls
    assert len(runs) == 3 * 5
    for t in range(3):
        trial = runs[5 * t: 5 * t + 5]
        assert sorted(trial[:4]) == sorted([(c, 2, p) for c in ("fixed/parallel",
                                                                "layer_partition")
                                            for p in (0, 1)])
        assert trial[4] == ("layer_partition", 2, 0)
    ref = m.quality["cells"][0]["reference"]
    assert ref == {"candidate": "layer_partition", "prompt": 3, "samples_us": [100.0] * 6,
                   "noise_pct": 0.0}
    assert m.quality["cells"][0]["outliers"] == [] and m.complete
    assert list(m.table["trial"]) == [0, 1, 2] * 4


def test_an_outlier_is_measured_again_and_both_values_kept(monkeypatch, tmp_path):
    # fixed/parallel's second run of prompt 1 (trial 1) takes 90 instead of 50
    spy = Spy({"layer_partition": 100.0, "fixed/parallel": 50.0},
              slow={("fixed/parallel", 1, 1): 90.0})
    _spied(monkeypatch, spy)
    m = measure(tiny_trace(), [2], candidates=["fixed/parallel", "layer_partition"],
                settings=QUIET, progress=False)
    cell = m.quality["cells"][0]
    assert cell["outliers"] == [{"candidate": "fixed/parallel", "prompt": 7, "trial": 1,
                                 "tpot_us": 90.0, "again_trial": 3, "again_us": 50.0}]
    t = m.table
    pair = t[(t.candidate == "fixed/parallel") & (t.prompt == 7)]
    assert pair["trial"].tolist() == [0, 1, 2, 3] and pair["tpot_us"].tolist() == [50, 90, 50, 50]
    assert len(t) == 2 * 2 * 3 + 1
    parquet_io.write_measurements(m, tmp_path / "m.parquet")
    back = parquet_io.read_measurements(tmp_path / "m.parquet")
    assert back.quality == m.quality and back.progress == m.progress
    checks = measurement_checks(back)
    assert checks["outliers"].tolist() == [1]
    assert "1 outlying trials measured again" in check_lines(checks)[0]


def _table(values: dict[str, list[list[float]]], K: int = 2) -> pd.DataFrame:
    rows = [(c, p, t, v, K, 1, 100.0) for c, per_prompt in values.items()
            for p, trials in enumerate(per_prompt) for t, v in enumerate(trials)]
    return pd.DataFrame(rows, columns=["candidate", "prompt", "trial", "tpot_us", "K",
                                       "cpu_threads", "gpu_share"])


def _quality(noise: float | None, groups: list[tuple[str, ...]]) -> dict:
    return {"cells": [{"K": 2, "cpu_threads": 1, "gpu_share": 100.0,
                       "reference": {"candidate": "layer_partition", "prompt": 0,
                                     "samples_us": [], "noise_pct": noise},
                       "outliers": [], "same_work": [{"candidates": list(g), "why": "test"}
                                                     for g in groups]}]}


def test_same_work_measured_apart_is_a_measurement_problem():
    pair = ("fixed/parallel", "fixed/cost_selected")
    apart = _table({"fixed/parallel": [[238, 240, 236], [239, 241, 237]],
                    "fixed/cost_selected": [[159, 161, 160], [158, 160, 162]],
                    "layer_partition": [[300, 301, 302], [299, 300, 301]]})
    m = Measurements(apart, G, {}, quality=_quality(1.0, [pair]))
    (row,) = checks_to_dict(measurement_checks(m, draws=500))
    # medians over trials 238 and 239 against 160 and 160: 160 / 238.5 - 1
    assert row["winner"] == "fixed/cost_selected" and row["runner_up"] == "layer_partition"
    assert row["inconsistent"] == ["fixed/cost_selected measured -32.9 % against fixed/parallel, "
                                   "which does the same work (test)"]
    assert not row["unresolved"]
    assert any("MEASUREMENT PROBLEM" in line for line in check_lines(measurement_checks(m)))
    close = _table({"fixed/parallel": [[160, 161, 159], [160, 159, 161]],
                    "fixed/cost_selected": [[160.5, 160, 160], [160, 160.5, 159.5]],
                    "layer_partition": [[161, 162, 160], [162, 161, 161]]})
    (row,) = checks_to_dict(measurement_checks(Measurements(close, G, {},
                                                            quality=_quality(1.0, [pair]))))
    assert row["inconsistent"] == []
    # the runner-up does other work; its margin 0.6 % is below the noise floor of 1 %
    assert row["runner_up"] == "layer_partition" and row["unresolved"]
    # without a recorded quality block nothing is flagged and the noise floor is unknown
    (row,) = checks_to_dict(measurement_checks(Measurements(apart, G, {})))
    assert row["noise_pct"] is None and row["inconsistent"] == [] and row["outliers"] == 0


# --- resume ------------------------------------------------------------------------------------
class Interrupted(Exception):
    pass


def test_an_interrupted_run_resumes_from_its_file(monkeypatch, tmp_path):
    spy = Spy({"layer_partition": 100.0, "fixed/parallel": 50.0})
    _spied(monkeypatch, spy)
    out = tmp_path / "m.parquet"
    kw = dict(candidates=["fixed/parallel", "layer_partition"], cpu_threads=[1, 2],
              settings=QUIET, progress=False)

    def stop_after_first(part):
        parquet_io.write_measurements(part, out, overwrite=True)
        raise Interrupted

    with pytest.raises(Interrupted):
        measure(tiny_trace(), [2, 6], checkpoint=stop_after_first, **kw)
    part = parquet_io.read_measurements(out)
    assert not part.complete and part.progress["cells_done"] == [[2, 1]]
    spy.calls.clear()
    whole = measure(tiny_trace(), [2, 6], resume=part, **kw)
    assert {(K) for _, K, _ in spy.calls} == {2, 6}
    assert len(spy.calls) == 3 * 15                      # the three cells left, not the first
    assert whole.complete and whole.progress["cells_done"] == [[2, 1], [2, 2], [6, 1], [6, 2]]
    assert len(whole.table) == 4 * 12 and len(whole.quality["cells"]) == 4
    with pytest.raises(CopeInputError) as info:
        measure(tiny_trace(), [2, 6], resume=part,
                **{**kw, "settings": ExecutorSettings(trials=2, warmup_tokens=0,
                                                      warmup_prompts=False)})
    assert info.value.field == "progress.plan.trials"


def test_cli_resume(monkeypatch, tmp_path, capsys):
    spy = Spy({c: 100.0 + i for i, c in enumerate(CANDIDATE_IDS)})
    _spied(monkeypatch, spy)
    t = tmp_path / "t.parquet"
    parquet_io.write_trace(tiny_trace(), t)
    args = ["measure", "--trace", str(t), "-K", "2", "--threads", "1", "--candidates",
            "fixed/parallel,layer_partition", "--no-warmup-prompts", "--warmup-tokens", "0",
            "--no-progress", "-o", str(tmp_path / "m.parquet")]
    assert main(args) == 0
    assert "measurement quality: noise floor 0.0-0.0 %" in capsys.readouterr().out
    assert main([*args, "--resume"]) == 0
    assert "the run is complete; nothing to resume" in capsys.readouterr().out
    assert main([*args, "--resume", "--force"]) == 2
    assert "give one of --resume and --force" in capsys.readouterr().err
