"""Measurement noise: intervals of measured TPOT and the candidates that measured within noise
of the fastest (docs/design.md#noise-aware-evaluation).

A *cell* is one (K, cpu_threads, gpu_share) of a measurements table. Within a cell:

* a candidate's **measured TPOT** is the median over trials of each prompt, then the mean over
  prompts (:func:`cope_core.estimate.evaluate.measured_tpot`); its **interval** is the 95 %
  percentile interval of that statistic under a two-level bootstrap — prompts resampled, then
  each resampled prompt's trials resampled — drawn with one seeded numpy generator as arrays;
* the **measured-tied set** holds the measured fastest and every candidate whose paired
  difference from it over the (prompt, trial) pairs both measured has a 95 % bootstrap interval
  of its mean (``scipy.stats.bootstrap``, percentile method) that contains 0. One pair, or pairs
  whose differences are all equal, leave nothing to resample: then only an exact zero
  difference ties.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..matrix import CANDIDATE_IDS
from .ranking import fastest_first

CELL = ["K", "cpu_threads", "gpu_share"]
LEVEL = 0.95
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


def _trial_matrix(group: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Trials per prompt, left-aligned and NaN-padded, ``(P, T)``, and the count per prompt."""
    per_prompt = [g.to_numpy(np.float64) for _, g in group.groupby("prompt", sort=True)["tpot_us"]]
    T = max(len(v) for v in per_prompt)
    m = np.full((len(per_prompt), T), np.nan)
    for i, v in enumerate(per_prompt):
        m[i, :len(v)] = v
    return m, np.array([len(v) for v in per_prompt])


def measured_interval(group: pd.DataFrame, draws: int, rng: np.random.Generator
                      ) -> tuple[float, float, float]:
    """(measured TPOT, low, high) of one candidate in one cell (see the module docstring)."""
    m, n = _trial_matrix(group)
    point = float(median_over_trials(group[["candidate", "prompt", "tpot_us"]])
                  ["measured_us"].mean())
    if draws == 0:
        return point, float("nan"), float("nan")
    P, T = m.shape
    pi = rng.integers(0, P, (draws, P))
    ti = (rng.random((draws, P, T)) * n[pi][..., None]).astype(np.int64)
    vals = m[pi[..., None], ti]
    vals[np.arange(T)[None, None, :] >= n[pi][..., None]] = np.nan   # each keeps its own count
    stat = np.nanmedian(vals, axis=2).mean(axis=1)
    lo, hi = np.percentile(stat, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return point, float(lo), float(hi)


def paired_differences(a: pd.DataFrame, b: pd.DataFrame) -> np.ndarray:
    """``a - b`` over the (prompt, trial) pairs both measured, in microseconds."""
    j = a.merge(b, on=["prompt", "trial"], suffixes=("_a", "_b"))
    return (j["tpot_us_a"] - j["tpot_us_b"]).to_numpy(np.float64)


def paired_interval(d: np.ndarray, draws: int, rng: np.random.Generator
                    ) -> tuple[float, float] | None:
    """The 95 % percentile bootstrap interval of the mean of paired differences ``d``
    (``scipy.stats.bootstrap``); None when there is nothing to resample (fewer than two pairs,
    all equal, or ``draws`` 0)."""
    if d.size < 2 or np.ptp(d) == 0 or draws == 0:
        return None
    # scipy.stats takes seconds to import: only where measurements are compared
    from scipy import stats
    res = stats.bootstrap((d,), np.mean, n_resamples=draws, confidence_level=LEVEL,
                          method="percentile", vectorized=True, rng=rng)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def tied_with(a: pd.DataFrame, b: pd.DataFrame, draws: int, rng: np.random.Generator) -> bool:
    """Whether candidate ``a`` cannot be told apart from ``b`` (the fastest) in one cell."""
    d = paired_differences(a, b)
    if d.size == 0:
        return False
    ci = paired_interval(d, draws, rng)
    if ci is None:
        return bool(np.all(d == 0))
    return bool(ci[0] <= 0.0 <= ci[1])


def measured_cells(table: pd.DataFrame, draws: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per (cell, candidate): ``tpot_us`` with ``tpot_lo_us``, ``tpot_hi_us``, whether it is
    the cell's measured ``winner`` (exact ties to the earlier id) and whether it is ``tied``
    with that winner; cells in order, candidates in canonical order within a cell."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, cell in table.groupby(CELL, sort=True):
        by_cand = {c: g for c, g in cell.groupby("candidate", sort=False)}
        cands = sorted(by_cand, key=lambda c: _TIE.get(c, 99))
        stats_ = {c: measured_interval(by_cand[c], draws, rng) for c in cands}
        best = fastest_first({c: stats_[c][0] for c in cands})[0]
        for c in cands:
            tied = c == best or tied_with(by_cand[c], by_cand[best], draws, rng)
            rows.append(dict(zip(CELL, key), candidate=c, tpot_us=stats_[c][0],
                             tpot_lo_us=stats_[c][1], tpot_hi_us=stats_[c][2],
                             winner=c == best, tied=tied))
    return pd.DataFrame(rows)
