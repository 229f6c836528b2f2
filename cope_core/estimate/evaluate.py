"""Predictions against measurements: the one evaluation path of the CLI, the app and the
notebooks (docs/design.md#measurement-and-evaluation).

A measured TPOT is the **median over trials** of one (cell, candidate, prompt) — a trial that
another job slowed down, the usual error of a timing and always upwards, does not move it — and
a candidate's measured TPOT over a trace is the **mean over prompts** of those medians, as for
predictions; exact ties go to the earlier candidate id. A *cell* is one (K, cpu_threads,
gpu_share) at which measurements were taken.

``measurements`` arguments are :class:`cope_core.measurements.Measurements` records; the
executor that measures them is a sibling of this package, not imported here.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..matrix import residencies_of
from ..measurements import Measurements
from ..platforms import PlatformSpec
from ..profile.data import Profile
from ..profile.pricing import check_compatible
from ..trace.data import Trace
from .costs import estimators_for
from .metrics import Accuracy, accuracy, winners_by_k
from .noise import CELL, measured_cells, median_over_trials
from .predict import price, replay_counts
from .uncertainty import DEFAULT_DRAWS, check_draws


def measured_tpot(table: pd.DataFrame) -> pd.DataFrame:
    """Measured TPOT per (cell, candidate): the mean over prompts of the medians over trials,
    in cell order and, within a cell, candidate order (``tpot_us``)."""
    return measured_cells(table, draws=0)[CELL + ["candidate", "tpot_us"]]


def measured_winners(table: pd.DataFrame) -> pd.DataFrame:
    """The measured winner of every cell (exact ties to the earlier candidate id).

    Returns
    -------
    DataFrame
        ``K, cpu_threads, gpu_share, candidate, tpot_us``: one row per cell.
    """
    cells = measured_cells(table, draws=0)
    return cells[cells["winner"]][CELL + ["candidate", "tpot_us"]].reset_index(drop=True)


def pair_up(prediction: pd.DataFrame, measurements: pd.DataFrame,
            prompt_ids: Sequence[int]) -> pd.DataFrame:
    """Join one cell's per-prompt predictions with the medians over trials of its measurements.

    Returns ``prompt, candidate, predicted_us, measured_us`` for the (prompt, candidate) pairs
    both sides have, with the candidate's predicted interval on absolute speed
    (``predicted_lo_us``, ``predicted_hi_us``), the draws' spread alone
    (``predicted_draws_lo_us``, ``predicted_draws_hi_us``) and ``win_probability`` when the
    prediction has them."""
    rows = [(int(pid), cand, float(v))
            for cand, values in zip(prediction["candidate"], prediction["prompt_tpot_us"])
            for pid, v in zip(prompt_ids, values)]
    pred = pd.DataFrame(rows, columns=["prompt", "candidate", "predicted_us"])
    extra = [c for c in ("tpot_lo_us", "tpot_hi_us", "draws_lo_us", "draws_hi_us",
                         "win_probability") if c in prediction]
    if extra:   # the candidate's intervals over the trace, on each of its rows
        pred = pred.merge(prediction[["candidate", *extra]].rename(
            columns={"tpot_lo_us": "predicted_lo_us", "tpot_hi_us": "predicted_hi_us",
                     "draws_lo_us": "predicted_draws_lo_us",
                     "draws_hi_us": "predicted_draws_hi_us"}),
            on="candidate", how="left")
    meas = median_over_trials(measurements[["candidate", "prompt", "tpot_us"]])
    return pred.merge(meas, on=["prompt", "candidate"], how="inner")


#: Settings of the emulated platform (:class:`~cope_core.mechanisms.accelerator.Accelerator`)
#: and their values when absent (files written before they existed).
EMULATION = {"link_gbps": None, "cpu_slowdown": 1.0}


def _check_measurements(trace: Trace, measurements: Measurements,
                        profile: Profile | None = None) -> None:
    if not measurements.model.same_shape(trace.model):
        raise CopeInputError("measured model geometry differs from the trace's",
                             source=measurements.path, field="model")
    if profile is None or profile.analytic:
        return
    # a paced link or a slowed host is part of the platform: the profile must be of the same
    for key, default in EMULATION.items():
        m = (measurements.platform or {}).get(key, default)
        p = (profile.platform or {}).get(key, default)
        if m != p:
            raise CopeInputError(f"measured at {key}={m} but the profile was made at {key}={p}; "
                                 "profile and measure the same emulated platform",
                                 source=measurements.path, field=f"platform.{key}")


def _selected(measurements: Measurements, cpu_threads: int | None,
              gpu_share: float | None = None) -> pd.DataFrame:
    table = measurements.table
    if cpu_threads is not None:
        table = table[table["cpu_threads"] == cpu_threads]
        if table.empty:
            raise CopeInputError(f"no measurements at cpu_threads={cpu_threads}",
                                 source=measurements.path, field="cpu_threads")
    if gpu_share is not None:
        shares = table["gpu_share"].to_numpy(np.float32)
        table = table[shares == np.float32(gpu_share)]
        if table.empty:
            raise CopeInputError(f"no measurements at gpu_share={gpu_share:g}; measured: "
                                 f"{sorted({float(x) for x in shares})}",
                                 source=measurements.path, field="gpu_share")
    return table


def evaluation_pairs(trace: Trace, profile: Profile, measurements: Measurements,
                     calibration: Trace | None = None, *,
                     estimators: Sequence[str] = ("cope",), spec: PlatformSpec | None = None,
                     cpu_threads: int | None = None, gpu_share: float | None = None,
                     draws: int = DEFAULT_DRAWS,
                     seed: int = 0) -> dict[str, pd.DataFrame]:
    """Every measured (cell, prompt, candidate) with each estimator's prediction for it.

    Each cell is predicted at its own K and operating point for the candidates measured there;
    the replay runs once per K and serves every estimator and operating point.

    Returns
    -------
    dict of str to DataFrame
        Per estimator: ``prompt, candidate, predicted_us, measured_us, K, cpu_threads,
        gpu_share`` and, with ``draws``, the candidate's predicted interval and win probability
        in its cell (:func:`pair_up`). Measured pairs whose prompt id is not in the trace are
        left out, with a warning that counts them.
    """
    _check_measurements(trace, measurements, profile)
    check_compatible(trace, profile, calibration)
    table = _selected(measurements, cpu_threads, gpu_share)
    parts: dict[str, list[pd.DataFrame]] = {e: [] for e in estimators}
    calibrated = calibration is not None
    for k, by_k in table.groupby("K", sort=True):
        counts = replay_counts(trace, calibration, int(k),
                               residencies_of(sorted(set(by_k["candidate"]))))
        for (threads, share), grp in by_k.groupby(["cpu_threads", "gpu_share"], sort=True):
            cands = sorted(set(grp["candidate"]))
            for est in estimators:
                df = price(trace, profile, counts, int(k), cpu_threads=int(threads),
                           gpu_share=float(share), estimator=est, candidates=cands, spec=spec,
                           calibrated=calibrated, draws=draws, seed=seed)
                calibrated = True  # the fill warning once per evaluation, not per cell
                p = pair_up(df, grp, df.attrs["prompts"])
                p["K"], p["cpu_threads"], p["gpu_share"] = int(k), int(threads), float(share)
                parts[est].append(p)
            missing = len(grp[["prompt", "candidate"]].drop_duplicates()) - len(p)
            if missing:
                warnings.warn(f"{missing} measured (prompt, candidate) pairs at K={k}, "
                              f"cpu_threads={threads}, gpu_share={share:g} have no prompt of "
                              "that id in the trace and were left out", stacklevel=2)
    return {e: pd.concat(v, ignore_index=True) for e, v in parts.items()}


@dataclass(frozen=True)
class NoiseScore:
    """What one estimator's picks cost against noisy measurements (docs/design.md,
    "Noise-aware evaluation"): ``top1_within_noise`` and ``top1_cells`` are (cells whose
    predicted winner is in the measured-tied set / is the measured winner, cells);
    ``regret_pct`` the mean and max over cells of how much slower the predicted winner measured
    than the measured winner; ``interval_coverage`` the share of (cell, candidate) whose measured
    TPOT lies in the predicted 95 % interval (None for analytic profiles or without draws)."""

    top1_within_noise: tuple[int, int]
    top1_cells: tuple[int, int]
    regret_mean_pct: float
    regret_max_pct: float
    interval_coverage: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"top1_within_noise": list(self.top1_within_noise),
                "top1_cells": list(self.top1_cells),
                "regret_pct": {"mean": self.regret_mean_pct, "max": self.regret_max_pct},
                "interval_coverage": self.interval_coverage}


@dataclass(frozen=True)
class Evaluation:
    """One estimator scored against measurements: the accuracy over (prompt, candidate) pairs,
    the winner per cell (with regret and the tie test when measured cells are given), the
    noise-aware scores and the pairs themselves."""

    estimator: str
    accuracy: Accuracy
    per_k: list[dict] = field(default_factory=list)
    pairs: pd.DataFrame | None = field(default=None, compare=False, repr=False)
    noise: NoiseScore | None = None

    def to_dict(self, per_k: bool = False) -> dict[str, Any]:
        """The JSON of ``cope evaluate`` for this estimator."""
        d = self.accuracy.to_dict() | {"pairs": self.accuracy.pairs}
        if self.noise is not None:
            d |= self.noise.to_dict()
        if per_k:
            d["per_k"] = self.per_k
        return d


def _noise(per_k: list[dict], pairs: pd.DataFrame, measured: pd.DataFrame,
           intervals: bool) -> NoiseScore:
    """Add regret and the tie test to each cell of ``per_k`` and score them."""
    cells = measured.set_index(CELL + ["candidate"])
    regrets, within, agree = [], 0, 0
    for row in per_k:
        key = tuple(row[c] for c in CELL)
        cell = cells.loc[key]
        best = cell.index[cell["winner"].to_numpy()][0]
        row["regret_pct"] = float(100 * (cell.loc[row["predicted"], "tpot_us"]
                                         / cell.loc[best, "tpot_us"] - 1))
        row["measured_tied"] = [c for c in cell.index if cell.loc[c, "tied"]]
        row["within_noise"] = bool(cell.loc[row["predicted"], "tied"])
        row["measured_tpot_ci_us"] = [_finite(cell.loc[best, "tpot_lo_us"]),
                                      _finite(cell.loc[best, "tpot_hi_us"])]
        regrets.append(row["regret_pct"])
        within += row["within_noise"]
        agree += row["agree"]
    coverage = None
    if intervals and "predicted_lo_us" in pairs and pairs["predicted_lo_us"].notna().all():
        pred = pairs.groupby(CELL + ["candidate"])[["predicted_lo_us", "predicted_hi_us"]].first()
        j = pred.join(cells["tpot_us"], how="inner")
        coverage = float(((j["predicted_lo_us"] <= j["tpot_us"])
                          & (j["tpot_us"] <= j["predicted_hi_us"])).mean())
    return NoiseScore((within, len(per_k)), (agree, len(per_k)), float(np.mean(regrets)),
                      float(np.max(regrets)), coverage)


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def score(pairs: dict[str, pd.DataFrame], measured: pd.DataFrame | None = None, *,
          intervals: bool = True) -> dict[str, Evaluation]:
    """:class:`Evaluation` of each estimator's pairs; with ``measured``
    (:func:`cope_core.estimate.noise.measured_cells`) also the noise-aware scores
    (``intervals``: whether predicted intervals are meaningful, i.e. not an analytic profile)."""
    out = {}
    for est, p in pairs.items():
        per_k = winners_by_k(p, est)
        noise = None if measured is None else _noise(per_k, p, measured, intervals)
        out[est] = Evaluation(est, accuracy(p, est), per_k, p, noise)
    return out


def evaluate(trace: Trace, profile: Profile, measurements: Measurements,
             calibration: Trace | None = None, *, estimators: Sequence[str] | None = None,
             spec: PlatformSpec | None = None, cpu_threads: int | None = None,
             gpu_share: float | None = None, draws: int = DEFAULT_DRAWS,
             seed: int = 0) -> dict[str, Evaluation]:
    """Score estimators against measured TPOT, strictly and within the measurement noise.

    Parameters
    ----------
    trace, profile, calibration
        As for :func:`cope_core.estimate.predict.predict`.
    measurements : Measurements
        ``cope.measurements/1`` record of the same geometry.
    estimators : sequence of str, optional
        Default: :func:`~cope_core.estimate.costs.estimators_for` the profile, strictly (a
        malformed spec in the profile is an error: say ``--spec`` to replace it).
    spec : PlatformSpec, optional
        Roofline peaks for ``hrm`` (default: the profile's).
    cpu_threads : int, optional
        Score only the measurements at this thread count.
    gpu_share : float, optional
        Score only the measurements at this GPU share (%).
    draws, seed : int
        Bootstrap draws (and their seed) of the predicted and measured intervals and of the tie
        test; 0 leaves intervals out and ties only exact equality.

    Returns
    -------
    dict of str to Evaluation
    """
    _check_measurements(trace, measurements, profile)
    table = _selected(measurements, cpu_threads, gpu_share)
    draws = check_draws(draws)
    if estimators is None:
        estimators = estimators_for(profile, spec, strict=True)
    pairs = evaluation_pairs(trace, profile, measurements, calibration, estimators=estimators,
                             spec=spec, cpu_threads=cpu_threads, gpu_share=gpu_share,
                             draws=draws, seed=seed)
    measured = measured_cells(table, draws=draws, seed=seed)
    return score(pairs, measured, intervals=draws > 0 and not profile.analytic)
