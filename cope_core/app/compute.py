"""Predictions split at the replay, so the app can cache the two halves separately.

Replay counts depend only on the trace, the calibration and K; the costs only on the profile's
operating point and the estimator. :func:`cope_core.estimate.predict.predict` does both in one
call; here the same public steps (``fill_order``, ``replay_all``, ``layer_costs``,
``compose``) run apart, so that changing the operating point or the estimator re-prices the
cached replays instead of replaying again. ``tests/test_app_logic.py`` checks that the result
equals ``predict``'s exactly.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import pandas as pd

from ..estimate.costs import layer_costs
from ..estimate.predict import (OptimisticPredictionWarning, check_compatible, compose,
                                profile_spec, replay_all)
from ..matrix import CANDIDATES, RESIDENCIES, Residency, get_candidate
from ..profile.data import Profile
from ..replay.engine import ReplayCounts, check_ks, fill_order
from ..trace.data import Trace


def residencies_of(candidates: Sequence[str]) -> tuple[Residency, ...]:
    """The residencies the candidates need replayed, in canonical order."""
    need = {get_candidate(c).residency for c in candidates}
    return tuple(r for r in RESIDENCIES if r in need)


def replay_counts(trace: Trace, calibration: Trace | None, ks: Sequence[int],
                  residencies: Sequence[Residency]) -> dict[Residency, ReplayCounts]:
    """Hit histograms of each residency at each K (popularity fill from the calibration trace,
    or from the trace itself when there is none)."""
    check_compatible(trace, None, calibration)
    ks = check_ks(list(ks), trace.model.n_experts)
    order = fill_order(calibration if calibration is not None else trace)
    return replay_all(trace, order, ks, list(residencies))


def price(trace: Trace, profile: Profile, counts: dict[Residency, ReplayCounts],
          ks: Sequence[int], cpu_threads: int | None, gpu_share: float | None, estimator: str,
          candidates: Sequence[str], calibrated: bool) -> pd.DataFrame:
    """Turn replay counts into the frame :func:`~cope_core.estimate.predict.predict` returns.

    ``calibrated`` says whether the counts came from a calibration trace; without one the
    optimistic-prediction warning is issued, as ``predict`` does.
    """
    check_compatible(trace, profile, None)
    ks = check_ks(list(ks), trace.model.n_experts)
    wanted = {get_candidate(c).id for c in candidates}
    cands = [c for c in CANDIDATES if c.id in wanted]
    if not calibrated:
        warnings.warn("no calibration trace given: the fill order comes from the evaluated "
                      "trace, so the prediction is optimistic", OptimisticPredictionWarning,
                      stacklevel=2)
    op = profile.resolve(cpu_threads, gpu_share)
    spec = profile_spec(profile) if estimator == "hrm" else None
    costs = layer_costs(estimator, op, profile.model, spec)
    needed = {c.residency for c in cands if c.residency is not None}
    use = {r: counts[r] for r in RESIDENCIES if r in needed}
    if not use:  # layer partition alone needs no replay, only the K values
        use = {Residency.FIXED: ReplayCounts(Residency.FIXED, ks, np.zeros((ks.size, 0, 0, 0)),
                                             np.zeros((ks.size, 0, 0, 0)))}
    df = compose(trace, use, costs, cands)
    df.attrs.update(cpu_threads=op.cpu_threads, gpu_share=op.gpu_share,
                    analytic=bool(profile.analytic))
    return df
