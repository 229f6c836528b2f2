"""The rules of ``cope verify`` (docs/design.md#verifying-a-pick): which predicted candidates
contend, and after each round of measurement which of them to drop and whether to stop.

It is a *race* in the sense of Maron & Moore (1997, "The racing algorithm: model selection for
lazy learners", Artificial Intelligence Review 11) and Birattari et al. (2002, "A racing
algorithm for configuring metaheuristics", GECCO, the F-Race): every candidate still in the race
is measured on the same prompts in the same round (paired, interleaved trials), and a candidate
leaves as soon as a paired test says it is slower than the leader. The paired test is
``cope evaluate``'s tie test (:func:`cope_core.estimate.noise.tied_with`), so a candidate that
verify keeps is one that evaluate would call measured-tied. The race stops when one candidate
is left, or when every remaining one is *equivalent* to the leader: the 95 % interval of its
paired difference lies within ``± tolerance`` of the leader's TPOT (two one-sided tests at
2.5 % each, Schuirmann 1987).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .noise import median_over_trials, paired_differences, paired_interval, tied_with
from .ranking import fastest_first

#: A candidate contends when its win probability is at least this (or its interval overlaps the
#: winner's).
MIN_WIN_PROBABILITY = 0.01


def contenders(prediction: pd.DataFrame, min_probability: float = MIN_WIN_PROBABILITY
               ) -> list[str]:
    """The predicted winner and every rival that could still win, fastest first, at least two.

    Parameters
    ----------
    prediction : DataFrame
        One K and operating point of :func:`cope_core.estimate.predict.predict`
        (``candidate, tpot_us`` and, when it has them, ``draws_lo_us, draws_hi_us`` — else
        ``tpot_lo_us, tpot_hi_us`` — ``win_probability, equivalent_to``).
    min_probability : float

    Returns
    -------
    list of str
        The winner, then every candidate that is not ``equivalent_to`` an earlier one (the same
        policy here, nothing to measure twice) and has a win probability of at least
        ``min_probability`` or a draws' interval that overlaps the winner's; topped up with the
        fastest others to two.
    """
    df = prediction.reset_index(drop=True)
    eq = df["equivalent_to"] if "equivalent_to" in df else pd.Series([None] * len(df))
    distinct = df[[not isinstance(e, str) for e in eq]]
    order = fastest_first(dict(zip(distinct["candidate"], distinct["tpot_us"])))
    rows = {r.candidate: r for r in distinct.itertuples(index=False)}
    best = rows[order[0]]
    out = [order[0]]
    for c in order[1:]:
        r = rows[c]
        p = getattr(r, "win_probability", float("nan"))
        # a ranking question: the draws' spread alone (the model's error, common to both, is in
        # neither side of a comparison; docs/design.md#uncertainty)
        lo = getattr(r, "draws_lo_us", getattr(r, "tpot_lo_us", float("nan")))
        hi = getattr(best, "draws_hi_us", getattr(best, "tpot_hi_us", float("nan")))
        if (np.isfinite(p) and p >= min_probability) or (np.isfinite(lo) and np.isfinite(hi)
                                                          and lo <= hi):
            out.append(c)
    for c in order:
        if len(out) >= 2:
            break
        if c not in out:
            out.append(c)
    return out


@dataclass(frozen=True)
class RoundVerdict:
    """What one round of the race decided.

    Attributes
    ----------
    leader : str
        The fastest measured so far (median over trials per prompt, mean over prompts).
    measured_us : dict
        That statistic for every candidate still in the race before this verdict.
    dropped : list of (str, float)
        Candidates the paired test puts behind the leader, with their difference in percent.
    equivalent : bool
        Every candidate left is within ``tolerance`` of the leader (the race can stop).
    """

    leader: str
    measured_us: dict[str, float]
    dropped: list[tuple[str, float]]
    equivalent: bool


def judge(table: pd.DataFrame, alive: Sequence[str], tolerance: float, draws: int,
          rng: np.random.Generator) -> RoundVerdict:
    """Decide one round.

    Parameters
    ----------
    table : DataFrame
        ``candidate, prompt, trial, tpot_us`` of the runs so far (one cell).
    alive : sequence of str
        The candidates still in the race (exact ties: the earlier id of the canonical order leads).
    tolerance : float
        Equivalence margin as a fraction of the leader's TPOT (0.02: 2 %).
    draws : int
        Bootstrap resamples of the paired test.
    rng : numpy Generator
    """
    mine = table[table["candidate"].isin(alive)]
    tpot = median_over_trials(mine).groupby("candidate")["measured_us"].mean()
    measured = {c: float(tpot[c]) for c in alive}
    leader = fastest_first(measured)[0]
    by_cand = {c: g for c, g in mine.groupby("candidate", sort=False)}
    dropped, equivalent = [], True
    for c in alive:
        if c == leader:
            continue
        pct = 100.0 * (measured[c] / measured[leader] - 1)
        if not tied_with(by_cand[c], by_cand[leader], draws, rng):
            dropped.append((c, pct))
            continue
        d = paired_differences(by_cand[c], by_cand[leader])
        # nothing to resample (one pair, or all equal): the differences themselves are the bound
        ci = paired_interval(d, draws, rng) or (float(d.min()), float(d.max()))
        limit = tolerance * measured[leader]
        if not (-limit <= ci[0] and ci[1] <= limit):
            equivalent = False
    return RoundVerdict(leader, measured, dropped, equivalent)
