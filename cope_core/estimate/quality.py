"""How far a measurements file can be trusted, cell by cell
(docs/design.md#trustworthy-measurement): the noise floor it recorded against the margin it has
to resolve, the outliers it measured again, and the candidates that do the same work by the
policy space but measured apart — a measurement problem, not a result.

``cope measure`` prints it, ``cope evaluate`` reports it beside the scores and the app's
Predicted vs measured page shows it; all three call :func:`measurement_checks`.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..measurements import Measurements
from .noise import CELL, measured_cells, tied_with

#: Without a recorded noise floor, two same-work candidates may differ by this much (percent):
#: candidates that run the same code measure 1-2 % apart on a busy 2-core machine.
DEFAULT_NOISE_PCT = 2.0


def measurement_checks(m: Measurements, draws: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per cell of ``m``.

    Parameters
    ----------
    m : Measurements
    draws, seed
        The paired bootstrap of the tie test (:func:`cope_core.estimate.noise.tied_with`).

    Returns
    -------
    DataFrame
        ``K, cpu_threads, gpu_share``; ``noise_pct`` (the recorded noise floor, NaN when none);
        ``winner``, ``runner_up`` (the fastest candidate that does other work) and
        ``margin_pct`` between them; ``unresolved`` (the margin is below the noise floor);
        ``outliers`` (trials measured again); ``inconsistent`` (a list of sentences, one per
        same-work pair measured apart beyond the tie test and the noise floor).
    """
    rng = np.random.default_rng(seed)
    recorded = {(c["K"], c["cpu_threads"], float(c.get("gpu_share", 100.0))): c
                for c in m.quality.get("cells", [])}
    cells = measured_cells(m.table, draws=0)
    rows = []
    for key, table in m.table.groupby(CELL, sort=True):
        key = (int(key[0]), int(key[1]), float(key[2]))
        q = recorded.get(key, {})
        noise = (q.get("reference") or {}).get("noise_pct")
        noise = float("nan") if noise is None else float(noise)
        groups = [tuple(g["candidates"]) for g in q.get("same_work", [])]
        measured = cells[(cells["K"] == key[0]) & (cells["cpu_threads"] == key[1])
                         & (cells["gpu_share"] == key[2])]
        tpot = dict(zip(measured["candidate"], measured["tpot_us"]))
        winner = str(measured.loc[measured["winner"], "candidate"].iloc[0])
        same = {c for g in groups if winner in g for c in g} | {winner}
        rivals = measured[~measured["candidate"].isin(same)].sort_values("tpot_us", kind="stable")
        runner_up = str(rivals["candidate"].iloc[0]) if len(rivals) else None
        margin = (100.0 * (tpot[runner_up] / tpot[winner] - 1) if runner_up else float("nan"))
        by_cand = {c: g for c, g in table.groupby("candidate", sort=False)}
        problems = []
        for (g, why) in ((tuple(x["candidates"]), x["why"]) for x in q.get("same_work", [])):
            present = [c for c in g if c in by_cand]
            for c in present[1:]:
                a, b = present[0], c
                diff = 100.0 * (tpot[b] / tpot[a] - 1)
                limit = DEFAULT_NOISE_PCT if np.isnan(noise) else max(noise, 1.0)
                if abs(diff) > limit and not tied_with(by_cand[b], by_cand[a], draws, rng):
                    problems.append(f"{b} measured {diff:+.1f} % against {a}, which does the "
                                    f"same work ({why})")
        rows.append(dict(zip(CELL, key), noise_pct=noise, winner=winner, runner_up=runner_up,
                         margin_pct=margin,
                         unresolved=bool(np.isfinite(noise) and np.isfinite(margin)
                                         and margin < noise),
                         outliers=len(q.get("outliers", [])), inconsistent=problems))
    return pd.DataFrame(rows)


def checks_to_dict(checks: pd.DataFrame) -> list[dict[str, Any]]:
    """The checks as strictly valid JSON values (NaN becomes null)."""
    out = []
    for r in checks.to_dict("records"):
        out.append({k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                    for k, v in r.items()})
    return out


def check_lines(checks: pd.DataFrame) -> list[str]:
    """Report lines: a summary, then one line per flagged cell."""
    noise = checks["noise_pct"].dropna()
    lines = ["measurement quality: noise floor "
             + (f"{noise.min():.1f}-{noise.max():.1f} % (median {noise.median():.1f} %)"
                if len(noise) else "not recorded")
             + f"; {int(checks['outliers'].sum())} outlying trials measured again; "
             f"{int(checks['unresolved'].sum())} of {len(checks)} cells with a winner-runner-up "
             f"margin below the noise floor; "
             f"{int((checks['inconsistent'].map(len) > 0).sum())} cells inconsistent"]
    for r in checks.itertuples(index=False):
        where = f"  K={r.K} threads={r.cpu_threads}"
        if r.unresolved:
            lines.append(f"{where}: margin {r.margin_pct:.1f} % ({r.winner} vs {r.runner_up}) "
                         f"below the noise floor {r.noise_pct:.1f} %: measure more trials")
        for p in r.inconsistent:
            lines.append(f"{where}: MEASUREMENT PROBLEM: {p}")
    return lines
