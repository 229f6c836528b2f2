"""Per-layer cost tables of the three estimators (docs/design.md#replay-semantics, #the-estimators).

All three replay the same cache states; they differ only here. A table gives, for each execution
``e`` and hit count ``h``, the expert cost of one MoE layer, plus what a mutable residency adds
per layer (``pf_step``, charged at every layer but the last) and per inserted prefetch
(``pf_insert[e, h]``, charged at layers that inserted one).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import roofline
from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import EXECUTIONS, Execution, Residency
from ..platforms import PlatformSpec
from ..profile.data import OperatingPoint

ESTIMATORS = ("cope", "atomic", "hrm")
_P, _W, _R, _C = (EXECUTIONS.index(e) for e in (Execution.PARALLEL, Execution.WAIT_THEN_GPU,
                                                Execution.READY_FIRST, Execution.COST_SELECTED))


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """Costs in microseconds used to turn hit histograms into TPOT.

    Attributes
    ----------
    estimator : str
    moe : ndarray, shape (4, top_k + 1)
        One MoE layer's cost by execution (order of ``EXECUTIONS``) and hit count.
    split : ndarray of int, shape (top_k + 1,)
        The cost-selected CPU share ``c`` chosen at each hit count (from the schedule profile).
    pf_step : dict
        Per mutable residency id: cost charged at every layer ``l < L-1``.
    pf_insert : dict
        Per mutable residency id: ndarray (4, top_k + 1) added at a layer that inserted a prefetch.
    cpu_layer, gpu_layer : float
        Whole-layer costs for ``layer_partition``.
    shared_context, shared_us : ndarray or None
        Shared per-token cost at profiled contexts (interpolated); None when ``shared_fn`` is used.
    """

    estimator: str
    moe: np.ndarray
    split: np.ndarray
    pf_step: dict[str, float]
    pf_insert: dict[str, np.ndarray]
    cpu_layer: float
    gpu_layer: float
    shared_context: np.ndarray | None = None
    shared_us: np.ndarray | None = None
    model: ModelGeometry | None = None
    spec: PlatformSpec | None = None

    def shared_at(self, context: np.ndarray) -> np.ndarray:
        if self.shared_context is not None:
            return np.interp(np.asarray(context, np.float64), self.shared_context, self.shared_us)
        return roofline.shared_decode_us(self.model, self.spec, context)


def cost_selected_split(op: OperatingPoint) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest measured split per hit count; exact ties go to the larger CPU share."""
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


def _mutable_ids() -> list[str]:
    return [r.value for r in Residency if r.mutable]


def cope_costs(op: OperatingPoint) -> LayerCosts:
    """COPE: whole-layer schedule costs measured with their real overlap."""
    k = op.top_k
    split, cs = cost_selected_split(op)
    moe = np.empty((4, k + 1))
    h = np.arange(k + 1)
    moe[_P] = op.schedule[_P, h, k - h]
    moe[_W] = op.schedule[_W, h, 0]
    moe[_R] = op.schedule[_R, h, 0]
    moe[_C] = cs
    return LayerCosts("cope", moe, split,
                      pf_step={r: float(op.prefetch[r][0]) for r in _mutable_ids()},
                      pf_insert={r: np.full((4, k + 1), op.prefetch[r][1] - op.prefetch[r][0])
                                 for r in _mutable_ids()},
                      cpu_layer=op.cpu_layer, gpu_layer=op.gpu_layer,
                      shared_context=op.shared_context, shared_us=op.shared_us)


def atomic_costs(op: OperatingPoint) -> LayerCosts:
    """Atomic-op simulation: isolated op costs, max where nominally overlapped, + where serial."""
    k = op.top_k
    split, _ = cost_selected_split(op)
    R, C = op.atomic["gpu_expert"], op.atomic["cpu_expert"]
    S, G = op.atomic["stage"], op.atomic["staged_gpu_expert"]
    A, F, M = op.act_copy, op.sync, op.merge
    moe = np.empty((4, k + 1))
    for h in range(k + 1):
        m = k - h
        c, u = split[h], m - split[h]
        moe[_P, h] = max(R[h], C[m] + A) + F + M
        moe[_W, h] = S[m] + R[h] + G[m] + F + M
        moe[_R, h] = max(R[h], S[m]) + G[m] + F + M
        moe[_C, h] = max(R[h], C[c] + A, S[u]) + G[u] + F + M
    return LayerCosts("atomic", moe, split,
                      pf_step={r: 0.0 for r in _mutable_ids()},
                      pf_insert={r: np.full((4, k + 1), op.prefetch_op) for r in _mutable_ids()},
                      cpu_layer=C[k] + A + F + M, gpu_layer=R[k] + M,
                      shared_context=op.shared_context, shared_us=op.shared_us)


def hrm_costs(g: ModelGeometry, spec: PlatformSpec, threads: int, split: np.ndarray) -> LayerCosts:
    """Hierarchical roofline from peak numbers; a prefetch shares the layer's copy lane."""
    k = g.top_k
    moe = np.empty((4, k + 1))
    with_pf = np.empty((4, k + 1))
    for ei, e in enumerate(EXECUTIONS):
        for h in range(k + 1):
            c, u = roofline.execution_split(e, h, k, int(split[h]))
            moe[ei, h] = roofline.layer_us(g, spec, threads, h, c, u)
            with_pf[ei, h] = roofline.layer_us(g, spec, threads, h, c, u, prefetched=1)
    return LayerCosts("hrm", moe, np.asarray(split),
                      pf_step={r: 0.0 for r in _mutable_ids()},
                      pf_insert={r: with_pf - moe for r in _mutable_ids()},
                      cpu_layer=roofline.layer_us(g, spec, threads, 0, k, 0),
                      gpu_layer=roofline.layer_us(g, spec, threads, k, 0, 0),
                      model=g, spec=spec)


def layer_costs(estimator: str, op: OperatingPoint, model: ModelGeometry,
                spec: PlatformSpec | None = None) -> LayerCosts:
    """The cost table of ``estimator`` at one operating point of a profile."""
    if estimator == "cope":
        return cope_costs(op)
    if estimator == "atomic":
        return atomic_costs(op)
    if estimator == "hrm":
        if spec is None:
            raise CopeInputError("the profile carries no platform spec for the roofline estimator; "
                                 "give one (a GPU name or a JSON spec file)", field="platform.spec")
        split, _ = cost_selected_split(op)
        return hrm_costs(model, spec, op.cpu_threads, split)
    raise CopeInputError(f"unknown estimator {estimator!r}; expected one of {list(ESTIMATORS)}",
                         field="estimator")
