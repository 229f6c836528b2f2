"""Winner and runner-up of a prediction: the one rule the CLI, the app and the exports use.

Candidates are ranked by TPOT, exact ties going to the earlier id of the canonical order
(:data:`cope_core.matrix.CANDIDATE_IDS`). The runner-up is the fastest candidate that is a
*different policy* from the chosen one: a candidate ``equivalent_to`` another (the same per-prompt
TPOTs at every prompt and draw, :func:`cope_core.estimate.uncertainty.equivalences`) shares that
one's policy, so ``fixed/cost_selected`` that runs every miss on the CPU is no rival of
``fixed/parallel``. When every other candidate is the chosen one's policy there is no runner-up.
"""
from __future__ import annotations

from collections.abc import Mapping

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
