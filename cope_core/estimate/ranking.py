"""Winner and runner-up of a prediction: the one rule the CLI, the app and the exports use.

Candidates are ranked by TPOT, exact ties going to the earlier id of the canonical order
(:data:`cope_core.matrix.CANDIDATE_IDS`). The runner-up is the fastest candidate that is a
*different policy* from the chosen one: a candidate ``equivalent_to`` another (the same per-prompt
TPOTs at every prompt and draw, :func:`cope_core.estimate.uncertainty.equivalences`) shares that
one's policy, so ``fixed/cost_selected`` that runs every miss on the CPU is no rival of
``fixed/parallel``. When every other candidate is the chosen one's policy there is no runner-up.

The *named* winner, with the draws of :mod:`cope_core.estimate.uncertainty`, is
:func:`most_likely_fastest`: the candidate fastest in the most paired draws, or "tied: A or B"
when it is not faster than every rival in at least :data:`CLEAR` of them
(docs/design.md#uncertainty).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..matrix import CANDIDATE_IDS


def fastest_first(tpot_us: Mapping[str, float]) -> list[str]:
    """Candidate ids fastest first; exact ties keep the canonical candidate order (ids outside
    it after those, in the mapping's order)."""
    rank = {c: i for i, c in enumerate(CANDIDATE_IDS)}
    pos = {c: len(rank) + i for i, c in enumerate(tpot_us)}
    return sorted(tpot_us, key=lambda c: (tpot_us[c], rank.get(c, pos[c])))


def policy_of(candidate: str, equivalent_to: Mapping[str, str | None] | None = None) -> str:
    """The id that stands for ``candidate``'s policy: the earlier candidate it is
    ``equivalent_to``, else itself."""
    return (equivalent_to or {}).get(candidate) or candidate


def runner_up(tpot_us: Mapping[str, float],
              equivalent_to: Mapping[str, str | None] | None = None,
              chosen: str | None = None) -> str | None:
    """The fastest candidate that is not the same policy as ``chosen``.

    Parameters
    ----------
    tpot_us : mapping
        Candidate id -> TPOT (predicted or measured) at one operating point.
    equivalent_to : mapping, optional
        Candidate id -> the id of the earlier candidate it is the same policy as, or None.
        Missing ids (or no mapping at all) count as policies of their own.
    chosen : str, optional
        The candidate the runner-up is a rival of (default: the fastest).

    Returns
    -------
    str or None
        None when every other candidate is the same policy as ``chosen``.
    """
    if not tpot_us:
        raise ValueError("runner_up: no candidates")
    order = fastest_first(tpot_us)
    chosen = order[0] if chosen is None else chosen
    mine = policy_of(chosen, equivalent_to)
    return next((c for c in order
                 if c != chosen and policy_of(c, equivalent_to) != mine), None)


def frame_runner_up(df: pd.DataFrame, chosen: str | None = None) -> pd.Series | None:
    """:func:`runner_up` of a one-K prediction frame (``candidate``, ``tpot_us`` and, when it
    has them, ``equivalent_to`` columns): its row, or None."""
    if "experts_per_layer" in df and df["experts_per_layer"].nunique() > 1:
        raise ValueError("frame_runner_up: the frame holds more than one K")
    eq = (dict(zip(df["candidate"], df["equivalent_to"])) if "equivalent_to" in df else None)
    ru = runner_up(dict(zip(df["candidate"], df["tpot_us"].astype(float))),
                   {c: e if isinstance(e, str) else None for c, e in eq.items()} if eq else None,
                   chosen)
    return None if ru is None else df[df["candidate"] == ru].iloc[0]


#: the share of the paired draws in which the most likely fastest must beat every rival to be
#: named alone: then the 95 % interval of each paired difference lies on one side of zero
CLEAR = 0.975


def _pct(p: float) -> str:
    return f"{100 * p:.0f} %"


@dataclass(frozen=True)
class Verdict:
    """Who is fastest, as the paired draws say.

    ``leader`` is fastest in the largest share of the draws (``leader_share``); ``rival`` is the
    other candidate it beats in the fewest draws (``beats_rival``, the share in which the leader
    is strictly faster), None when there is no other; ``tied`` when that share is below
    :data:`CLEAR`."""

    leader: str
    leader_share: float
    rival: str | None
    beats_rival: float
    tied: bool

    @property
    def name(self) -> str:
        """``"A"``, or ``"tied: A or B"``: what the CLI's ``winner:`` line and the app name."""
        return f"tied: {self.leader} or {self.rival}" if self.tied else self.leader

    @property
    def reason(self) -> str:
        """Why, in the words the CLI and the app both print."""
        head = f"{self.leader} is fastest in {_pct(self.leader_share)} of the paired draws"
        if self.rival is None:
            return head
        tail = f"faster than {self.rival} in {_pct(self.beats_rival)}"
        if self.tied:
            return (f"{head}, {tail}: below the {100 * CLEAR:g} % a winner needs over "
                    "every rival")
        return f"{head}, {tail}"

    def to_dict(self) -> dict:
        return {"name": self.name, **self.__dict__}

    @classmethod
    def from_dict(cls, d: Mapping) -> Verdict:
        """The inverse of :meth:`to_dict` (``name`` is derived, not read)."""
        return cls(str(d["leader"]), float(d["leader_share"]),
                   None if d["rival"] is None else str(d["rival"]), float(d["beats_rival"]),
                   bool(d["tied"]))


def most_likely_fastest(means: np.ndarray, ids: Sequence[str], point_us: Sequence[float],
                        clear: float = CLEAR) -> Verdict:
    """The named winner of paired draws.

    Parameters
    ----------
    means : ndarray (B, n)
        Draw ``b`` of each of ``n`` rivals' TPOT (candidates ``equivalent_to`` another left
        out), the same resample and profile draw across a row.
    ids : sequence of str
        The rivals' ids, in candidate order.
    point_us : sequence of float
        Their point estimates: ties of the win share go to the lower, then the earlier id.
    clear : float
        The share of draws in which the leader must beat every rival to be named alone.

    Returns
    -------
    Verdict
        The leader is fastest in the most draws (exact ties within a draw to the earlier id);
        the rival is the one it is strictly faster than in the fewest draws (ties: the lower
        point, then the earlier id); tied when that share is below ``clear``.
    """
    means = np.asarray(means, np.float64)
    n = means.shape[1]
    if n == 0 or len(ids) != n or len(point_us) != n:
        raise ValueError("most_likely_fastest: one id and point per column, at least one")
    wins = np.bincount(np.argmin(means, axis=1), minlength=n) / means.shape[0]
    a = max(range(n), key=lambda i: (wins[i], -point_us[i], -i))
    # the share of draws in which the leader is strictly faster than each rival (a mean of 0s
    # and 1s: exact, one array operation for every rival)
    share = (means[:, a:a + 1] < means).mean(axis=0)
    beats = {j: float(share[j]) for j in range(n) if j != a}
    if not beats:
        return Verdict(ids[a], float(wins[a]), None, 1.0, False)
    b = min(beats, key=lambda j: (beats[j], point_us[j], j))
    return Verdict(ids[a], float(wins[a]), ids[b], beats[b], beats[b] < clear)
