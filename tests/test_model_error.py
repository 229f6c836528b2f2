"""Intervals around their point, the model's measured error on absolute speed, and how it was
calibrated (held out by dataset): docs/design.md#uncertainty."""
from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cope_core.errors import CopeInputError
from cope_core.estimate.model_error import (
    MODEL_ERROR_FILE,
    around_point,
    half_widths,
    model_error,
    parse_model_error,
    widen,
    z_of,
)
from cope_core.estimate.uncertainty import intervals
from cope_core.matrix import get_candidate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import model_error as me_script  # noqa: E402

Z = 1.959963984540054


def test_the_interval_is_the_draws_spread_carried_to_the_point():
    # one column: 0.025, 0.5 and 0.975 quantiles of 1..41 are 2, 21 and 40
    draws = np.arange(1.0, 42.0)[:, None]
    lo, hi = around_point(np.array([10.0]), draws, 0.95)
    # the spread is read as ratios to the draws' median and carried to the point 10
    assert lo[0] == pytest.approx(10 * 2 / 21) and hi[0] == pytest.approx(10 * 40 / 21)
    # with the model error sigma, each side's log half-width adds (z * sigma) in quadrature
    lo, hi = around_point(np.array([10.0]), draws, 0.95, sigma=0.1)
    assert lo[0] == pytest.approx(10 * math.exp(-math.hypot(math.log(21 / 2), Z * 0.1)))
    assert hi[0] == pytest.approx(10 * math.exp(math.hypot(math.log(40 / 21), Z * 0.1)))
    assert z_of(0.95) == pytest.approx(Z)


def test_no_spread_leaves_the_model_error_alone():
    lo, hi = widen(np.array([100.0]), np.array([0.0]), np.array([0.0]), 0.95, 0.1)
    assert (lo[0], hi[0]) == pytest.approx((100 * math.exp(-Z * 0.1), 100 * math.exp(Z * 0.1)))
    assert half_widths(np.array([100.0]), lo, hi) == pytest.approx((Z * 0.1, Z * 0.1))


def test_draws_that_reach_zero_reach_zero():
    draws = np.array([[0.0], [0.0], [5.0], [6.0], [7.0]])
    lo, hi = around_point(np.array([5.5]), draws, 0.95)
    assert lo[0] == 0.0 and hi[0] > 5.5


def test_the_reported_defect_cannot_happen():
    """Draws skewed above the point (an analytic profile's log-normal constants, a cache's
    persistent state) put the plain percentile interval above the point, as in the export that
    printed "9.625 ms/token [9.677, 10.890]"; the interval around the point holds it."""
    rng = np.random.default_rng(0)
    draws = 9.625 * np.exp(np.abs(rng.normal(0.05, 0.03, (1000, 1))))
    q_lo, q_hi = np.percentile(draws, [2.5, 97.5])
    assert q_lo > 9.625                          # the old rule's interval misses its point
    lo, hi = around_point(np.array([9.625]), draws, 0.95)
    assert lo[0] <= 9.625 <= hi[0]


positive = st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 60), st.integers(1, 4)),
                  elements=st.floats(0.0, 1e6, allow_nan=False)),
       st.lists(positive, min_size=4, max_size=4), st.floats(0.0, 2.0), st.floats(0.5, 0.99))
def test_the_point_is_always_inside_its_interval(draws, points, sigma, level):
    point = np.array(points[:draws.shape[1]])
    lo, hi = around_point(point, draws, level, sigma)
    assert np.all(lo <= point) and np.all(point <= hi) and np.all(lo >= 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(0, 2**32 - 1), st.floats(0.0, 0.5))
def test_every_predicted_interval_holds_its_point(prompts, seed, skew):
    """intervals(), as predict calls it: the absolute and the draws-only interval of every
    candidate hold its point (the mean over prompts at the profile's medians), whatever the
    profile draws' skew; the absolute one holds the draws-only one."""
    rng = np.random.default_rng(seed)
    cands = [get_candidate("fixed/parallel"), get_candidate("fixed/wait_then_gpu")]
    point = [rng.uniform(50, 150, prompts) for _ in cands]
    drawn = [p * np.exp(skew + rng.normal(0, 0.2, (200, prompts))) for p in point]
    frame, _ = intervals(point, drawn, cands, 200, rng, estimator="cope")
    mean = np.array([p.mean() for p in point])
    assert np.all(frame["draws_lo_us"] <= mean) and np.all(mean <= frame["draws_hi_us"])
    assert np.all(frame["tpot_lo_us"] <= mean) and np.all(mean <= frame["tpot_hi_us"])
    assert np.all(frame["tpot_lo_us"] <= frame["draws_lo_us"])
    assert np.all(frame["draws_hi_us"] <= frame["tpot_hi_us"])


# --- the calibration file -------------------------------------------------------------------------
def test_the_shipped_calibration_is_read_and_checked(tmp_path):
    err = model_error()
    assert err.source == str(MODEL_ERROR_FILE)
    doc = json.loads(MODEL_ERROR_FILE.read_text())
    assert err.sigma("cope") == doc["estimators"]["cope"]["sigma_log"] > 0
    assert err.sigma("no-such-estimator") == 0.0
    bad = dict(doc, estimators={"cope": {"sigma_log": -1}})
    with pytest.raises(CopeInputError, match=r"estimators\.cope\.sigma_log"):
        parse_model_error(bad, "x.json")
    with pytest.raises(CopeInputError, match="schema"):
        parse_model_error({"schema": "other/1"}, "x.json")
    (tmp_path / "m.json").write_text("{")
    with pytest.raises(CopeInputError, match="scripts/model_error.py"):
        model_error(tmp_path / "m.json")


@pytest.mark.slow      # it re-evaluates every group (about 7 s)
def test_the_shipped_calibration_is_current():
    predict = importlib.import_module("cope_core.estimate.predict")
    uncertainty = importlib.import_module("cope_core.estimate.uncertainty")
    before = predict.model_error, uncertainty.model_error
    assert me_script.main(["--check"]) == 0, "run python scripts/model_error.py"
    # the zero error the rebuild stands in must not outlive it (it narrowed every later
    # interval in the same process: README's worked answer then differed)
    assert (predict.model_error, uncertainty.model_error) == before
    assert uncertainty.model_error().sigma("cope") > 0


def _group(e: list[float], half: float = 0.0) -> pd.DataFrame:
    pred = np.full(len(e), 100.0)
    return pd.DataFrame({"predicted": pred, "lo": pred * math.exp(-half),
                         "hi": pred * math.exp(half), "measured": pred * np.exp(e)})


def test_coverage_is_scored_on_groups_the_error_was_not_fitted_on():
    groups = {"a": _group([0.1, -0.1]), "b": _group([3.0]), "c": _group([0.0, 0.0], half=0.05)}
    out = me_script.held_out(groups)["per_group"]
    # two other groups: Student's t on 1 degree of freedom over z, 12.7062 / 1.95996
    t_over_z = 12.706204736174698 / 1.959963984540054
    # a is scored with the root mean square of b's and c's errors alone: sqrt((9 + 0) / 2)
    assert out["a"]["sigma_log_of_the_others"] == pytest.approx(math.sqrt(4.5) * t_over_z,
                                                                 abs=1e-4)
    assert out["a"]["coverage_before"] == 0.0 and out["a"]["coverage_after"] == 1.0
    # b (3.0 off) against a's and c's sqrt((0.01 + 0) / 2) * t/z = 0.4584: 1.96 * 0.4584 < 3
    assert out["b"]["sigma_log_of_the_others"] == pytest.approx(math.sqrt(0.005) * t_over_z,
                                                                 abs=1e-4)
    assert out["b"]["coverage_after"] == 0.0
    assert out["c"]["coverage_before"] == 1.0
