"""Predictions against measurements: the one evaluation path of the CLI, the app and the
notebooks (docs/design.md#measurement-and-evaluation).

A measured TPOT is the **median over trials** of one (cell, candidate, prompt) — a trial that
another job slowed down, the usual error of a timing and always upwards, does not move it — and
a candidate's measured TPOT over a trace is the **mean over prompts** of those medians, as for
predictions; exact ties go to the earlier candidate id. A *cell* is one (K, cpu_threads,
gpu_share) at which measurements were taken.

``measurements`` arguments are :class:`cope_core.executor.data.Measurements` records (anything
with ``table``, ``model`` and ``path``); this module does not import the executor, which sits
above it in the pipeline.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..errors import CopeInputError
from ..matrix import CANDIDATE_IDS, residencies_of
from ..platforms import PlatformSpec
from ..profile.data import Profile
from ..trace.data import Trace
from .metrics import Accuracy, accuracy, winners_by_k
from .predict import check_compatible, price, profile_spec, replay_counts

#: The columns that name a measurement cell.
CELL = ["K", "cpu_threads", "gpu_share"]
_TIE = {c: i for i, c in enumerate(CANDIDATE_IDS)}


def median_over_trials(table: pd.DataFrame) -> pd.DataFrame:
    """Measured TPOT per (cell, candidate, prompt): the median over trials.

    Returns
    -------
    DataFrame
        ``K, cpu_threads, gpu_share, candidate, prompt, measured_us`` (the cell columns only
        where ``table`` has them).
    """
    keys = [c for c in CELL if c in table.columns] + ["candidate", "prompt"]
    return (table.groupby(keys, as_index=False, sort=True)["tpot_us"].median()
            .rename(columns={"tpot_us": "measured_us"}))


def measured_tpot(table: pd.DataFrame) -> pd.DataFrame:
    """Measured TPOT per (cell, candidate): the mean over prompts of the medians over trials,
    in cell order and, within a cell, candidate order."""
    med = median_over_trials(table)
    keys = [c for c in CELL if c in med.columns]
    out = med.groupby(keys + ["candidate"], as_index=False, sort=True)["measured_us"].mean()
    out["_o"] = out["candidate"].map(_TIE)
    return (out.sort_values(keys + ["_o"]).drop(columns="_o")
            .rename(columns={"measured_us": "tpot_us"}).reset_index(drop=True))


def measured_winners(table: pd.DataFrame) -> pd.DataFrame:
    """The measured winner of every cell (exact ties to the earlier candidate id).

    Returns
    -------
    DataFrame
        ``K, cpu_threads, gpu_share, candidate, tpot_us``: one row per cell.
    """
    means = measured_tpot(table)
    keys = [c for c in CELL if c in means.columns]
    # measured_tpot is in candidate order within a cell, so a stable sort keeps ties in order
    best = means.sort_values(keys + ["tpot_us"], kind="stable")
    return best.groupby(keys, sort=True).head(1).reset_index(drop=True)


def pair_up(prediction: pd.DataFrame, measurements: pd.DataFrame,
            prompt_ids: Sequence[int]) -> pd.DataFrame:
    """Join one cell's per-prompt predictions with the medians over trials of its measurements.

    Returns ``prompt, candidate, predicted_us, measured_us`` for the (prompt, candidate) pairs
    both sides have."""
    rows = [(int(pid), cand, float(v))
            for cand, values in zip(prediction["candidate"], prediction["prompt_tpot_us"])
            for pid, v in zip(prompt_ids, values)]
    pred = pd.DataFrame(rows, columns=["prompt", "candidate", "predicted_us"])
    meas = median_over_trials(measurements[["candidate", "prompt", "tpot_us"]])
    return pred.merge(meas, on=["prompt", "candidate"], how="inner")


def _check_measurements(trace: Trace, measurements: Any) -> None:
    if not measurements.model.same_shape(trace.model):
        raise CopeInputError("measured model geometry differs from the trace's",
                             source=measurements.path, field="model")


def _selected(measurements: Any, cpu_threads: int | None) -> pd.DataFrame:
    table = measurements.table
    if cpu_threads is not None:
        table = table[table["cpu_threads"] == cpu_threads]
        if table.empty:
            raise CopeInputError(f"no measurements at cpu_threads={cpu_threads}",
                                 source=measurements.path, field="cpu_threads")
    return table


def default_estimators(profile: Profile, spec: PlatformSpec | None = None) -> list[str]:
    """``cope`` and ``atomic``, and ``hrm`` when a roofline spec is given or the profile carries
    one (a malformed one in the profile is an error: say ``--spec`` to replace it)."""
    spec = spec or profile_spec(profile)
    return ["cope", "atomic"] + (["hrm"] if spec is not None else [])


def evaluation_pairs(trace: Trace, profile: Profile, measurements: Any,
                     calibration: Trace | None = None, *,
                     estimators: Sequence[str] = ("cope",), spec: PlatformSpec | None = None,
                     cpu_threads: int | None = None) -> dict[str, pd.DataFrame]:
    """Every measured (cell, prompt, candidate) with each estimator's prediction for it.

    Each cell is predicted at its own K and operating point for the candidates measured there;
    the replay runs once per K and serves every estimator and operating point.

    Returns
    -------
    dict of str to DataFrame
        Per estimator: ``prompt, candidate, predicted_us, measured_us, K, cpu_threads,
        gpu_share``. Measured pairs whose prompt id is not in the trace are left out, with a
        warning that counts them.
    """
    _check_measurements(trace, measurements)
    check_compatible(trace, profile, calibration)
    table = _selected(measurements, cpu_threads)
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
                           calibrated=calibrated)
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
class Evaluation:
    """One estimator scored against measurements: the accuracy over (prompt, candidate) pairs,
    the winner per cell, and the pairs themselves."""

    estimator: str
    accuracy: Accuracy
    per_k: list[dict] = field(default_factory=list)
    pairs: pd.DataFrame | None = field(default=None, compare=False, repr=False)

    def to_dict(self, per_k: bool = False) -> dict[str, Any]:
        """The JSON of ``cope evaluate`` for this estimator."""
        d = self.accuracy.to_dict() | {"pairs": self.accuracy.pairs}
        if per_k:
            d["per_k"] = self.per_k
        return d


def score(pairs: dict[str, pd.DataFrame]) -> dict[str, Evaluation]:
    """:class:`Evaluation` of each estimator's pairs."""
    return {est: Evaluation(est, accuracy(p, est), winners_by_k(p, est), p)
            for est, p in pairs.items()}


def evaluate(trace: Trace, profile: Profile, measurements: Any,
             calibration: Trace | None = None, *, estimators: Sequence[str] | None = None,
             spec: PlatformSpec | None = None,
             cpu_threads: int | None = None) -> dict[str, Evaluation]:
    """Score estimators against measured TPOT.

    Parameters
    ----------
    trace, profile, calibration
        As for :func:`cope_core.estimate.predict.predict`.
    measurements : Measurements
        ``cope.measurements/1`` record of the same geometry.
    estimators : sequence of str, optional
        Default :func:`default_estimators`.
    spec : PlatformSpec, optional
        Roofline peaks for ``hrm`` (default: the profile's).
    cpu_threads : int, optional
        Score only the measurements at this thread count.

    Returns
    -------
    dict of str to Evaluation
    """
    _check_measurements(trace, measurements)
    _selected(measurements, cpu_threads)
    if estimators is None:
        estimators = default_estimators(profile, spec)
    pairs = evaluation_pairs(trace, profile, measurements, calibration, estimators=estimators,
                             spec=spec, cpu_threads=cpu_threads)
    return score(pairs)
