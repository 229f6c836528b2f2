"""The rules on a profile that the estimators and the measured truth both follow: whether it can
price a trace, and which CPU share ``cost_selected`` runs at each hit count.

They live with the profile, below both :mod:`cope_core.estimate` and :mod:`cope_core.executor`,
so that neither imports the other: the reference executor runs the split the profile chose
without importing the model that predicts its time.
"""
from __future__ import annotations

import numpy as np

from ..errors import CopeInputError
from ..matrix import EXECUTIONS, Execution
from ..trace.data import Trace
from .data import OperatingPoint, Profile

_C = EXECUTIONS.index(Execution.COST_SELECTED)


def check_compatible(trace: Trace, profile: Profile | None = None,
                     calibration: Trace | None = None) -> None:
    """Check that a trace, its calibration and a profile can be priced together.

    Parameters
    ----------
    trace : Trace
    profile : Profile, optional
        Must price the trace's model (:meth:`~cope_core.profile.data.Profile.check_target`:
        expert and non-expert shapes, and the layer counts for whole-token shared rows).
    calibration : Trace, optional
        Must share the trace's geometry.

    Raises
    ------
    CopeInputError
        Naming the file and the fields that differ.
    """
    g = trace.model
    if calibration is not None and not calibration.model.same_shape(g):
        diff = [k for k, v in g.to_dict().items()
                if k != "name" and calibration.model.to_dict()[k] != v]
        raise CopeInputError(f"geometry differs from the trace's in {diff}",
                             source=calibration.path, field="model")
    if profile is not None:
        profile.check_target(g)


def cost_selected_split(op: OperatingPoint) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest measured split per hit count.

    Parameters
    ----------
    op : OperatingPoint

    Returns
    -------
    (ndarray, ndarray)
        Per hit count ``h`` in ``0..top_k``: the CPU share ``c`` of the ``top_k - h`` misses
        whose ``cost_selected`` schedule is cheapest (exact ties to the larger share), and that
        schedule's cost in microseconds.
    """
    rows = op.schedule[_C]                      # (h, c), NaN where c > m
    k = op.top_k
    split = np.empty(k + 1, np.int64)
    cost = np.empty(k + 1)
    for h in range(k + 1):
        m = k - h
        vals = rows[h, : m + 1]
        best = vals.min()
        split[h] = int(np.flatnonzero(vals == best).max())
        cost[h] = best
    return split, cost
