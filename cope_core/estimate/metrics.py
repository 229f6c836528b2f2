"""Accuracy of predictions against measurements (docs/design.md#measurement-and-evaluation):
MAPE over (prompt, candidate), Spearman rho of the candidate order per prompt, top-1 and top-3
agreement per prompt."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import CopeInputError


@dataclass(frozen=True)
class Accuracy:
    """How well one estimator's predictions match measured TPOT.

    ``top1`` is (prompts whose predicted winner is the measured winner, prompts);
    ``top3`` is (measured top-3 candidates found in the predicted top 3, 3 x prompts).
    """

    estimator: str
    mape_pct: float
    spearman: float
    top1: tuple[int, int]
    top3: tuple[int, int]
    pairs: int

    def to_dict(self) -> dict:
        return {"mape_pct": self.mape_pct, "spearman": self.spearman,
                "top1": list(self.top1), "top3": list(self.top3)}


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    return float(np.mean(np.abs(predicted - measured) / measured) * 100.0)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation with average ranks for ties; NaN when either side is constant."""
    ra = pd.Series(a).rank(method="average").to_numpy()
    rb = pd.Series(b).rank(method="average").to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _order(values: np.ndarray, candidates: list[str], tie_order: dict[str, int]) -> list[str]:
    # exact ties go to the earlier candidate id, as the winner rule says
    ties = [tie_order.get(c, 99) for c in candidates]
    return [c for _, _, c in sorted(zip(values, ties, candidates))]


def accuracy(pairs: pd.DataFrame, estimator: str = "cope") -> Accuracy:
    """Score predictions against measurements.

    Parameters
    ----------
    pairs : DataFrame
        Columns ``prompt, candidate, predicted_us, measured_us`` (measured = median over trials).
    """
    from ..matrix import CANDIDATE_IDS
    if pairs.empty:
        raise CopeInputError("no (prompt, candidate) pairs in common between prediction and "
                             "measurement", field="candidate")
    tie_order = {c: i for i, c in enumerate(CANDIDATE_IDS)}
    rhos, top1, top3, n3 = [], 0, 0, 0
    prompts = 0
    keys = [c for c in ("K", "cpu_threads", "gpu_share", "prompt") if c in pairs.columns]
    for _, g in pairs.groupby(keys, sort=True):
        prompts += 1
        cands = g["candidate"].tolist()
        pred = _order(g["predicted_us"].to_numpy(), cands, tie_order)
        meas = _order(g["measured_us"].to_numpy(), cands, tie_order)
        top1 += int(pred[0] == meas[0])
        k = min(3, len(cands))
        top3 += len(set(pred[:k]) & set(meas[:k]))
        n3 += k
        if len(cands) > 1:
            rhos.append(spearman(g["predicted_us"].to_numpy(), g["measured_us"].to_numpy()))
    rho = float(np.nanmean(rhos)) if rhos and not np.all(np.isnan(rhos)) else float("nan")
    return Accuracy(estimator, mape(pairs["predicted_us"], pairs["measured_us"]), rho,
                    (top1, prompts), (top3, n3), len(pairs))


def winners_by_k(pairs: pd.DataFrame, estimator: str = "cope") -> list[dict]:
    """Predicted vs measured winner per cache size (and operating point), on TPOT averaged over
    the prompts, which is how a candidate's TPOT over a trace is defined
    (docs/design.md#replay-semantics).

    Parameters
    ----------
    pairs : DataFrame
        As for :func:`accuracy`; rows are grouped by whichever of ``K, cpu_threads, gpu_share``
        it has.

    Returns
    -------
    list of dict
        Per group: the group's keys, ``predicted`` and ``measured`` winner (exact ties to the
        earlier candidate id), ``agree``, and ``mape_pct`` of the prompt-mean TPOTs.
    """
    from ..matrix import CANDIDATE_IDS
    if pairs.empty:
        raise CopeInputError("no (prompt, candidate) pairs in common between prediction and "
                             "measurement", field="candidate")
    tie_order = {c: i for i, c in enumerate(CANDIDATE_IDS)}
    keys = [c for c in ("K", "cpu_threads", "gpu_share") if c in pairs.columns]
    groups = pairs.groupby(keys, sort=True) if keys else [((), pairs)]
    out = []
    for key, g in groups:
        means = g.groupby("candidate", sort=False)[["predicted_us", "measured_us"]].mean()
        cands = means.index.tolist()
        pred = _order(means["predicted_us"].to_numpy(), cands, tie_order)[0]
        meas = _order(means["measured_us"].to_numpy(), cands, tie_order)[0]
        key = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = {k: (float(v) if k == "gpu_share" else int(v))
                               for k, v in zip(keys, key)}
        row.update(estimator=estimator, predicted=pred, measured=meas, agree=pred == meas,
                   mape_pct=mape(means["predicted_us"], means["measured_us"]))
        out.append(row)
    return out
