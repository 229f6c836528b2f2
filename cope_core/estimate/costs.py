"""Per-layer cost tables of the three estimators (docs/design.md#replay-semantics, #the-estimators).

All three replay the same cache states; they differ only here. A table gives, for each execution
``e`` and hit count ``h``, the expert cost of one MoE layer, plus what a mutable residency adds
per layer (``pf_step``, charged at every layer but the last while K < E) and per inserted prefetch
(``pf_insert[e, h]``, charged at layers that inserted one).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import EXECUTIONS, Execution, Residency
from ..platforms import PlatformSpec
from ..profile.data import OperatingPoint, Profile
from ..profile.pricing import cost_selected_split
from . import roofline

#: The estimators, in the order every table and menu lists them.
ESTIMATORS = ("cope", "atomic", "hrm")
_P, _W, _R, _C = (EXECUTIONS.index(e) for e in (Execution.PARALLEL, Execution.WAIT_THEN_GPU,
                                                Execution.READY_FIRST, Execution.COST_SELECTED))


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """Costs in microseconds used to turn hit histograms into TPOT.

    Every cost may carry leading *draw* dimensions (shape ``(B, ...)``): the uncertainty of
    :mod:`cope_core.estimate.uncertainty` prices the same histograms under ``B`` draws of the
    profile at once. Point estimates have none.

    Attributes
    ----------
    estimator : str
    moe : ndarray, shape (..., 4, top_k + 1)
        One MoE layer's cost by execution (order of ``EXECUTIONS``) and hit count.
    split : ndarray of int, shape (top_k + 1,)
        The cost-selected CPU share ``c`` chosen at each hit count (from the schedule profile).
    pf_step : dict
        Per mutable residency id: cost charged at every layer ``l < L-1`` (shape ``(...)``).
    pf_insert : dict
        Per mutable residency id: ndarray (..., 4, top_k + 1) added at a layer that inserted a
        prefetch.
    cpu_layer, gpu_layer : float or ndarray (...)
        Whole-layer costs for ``layer_partition``.
    shared_context, shared_us : ndarray or None
        Shared per-token cost at profiled contexts (interpolated; ``shared_us`` has shape
        ``(..., contexts)``); None when the roofline gives it (``model`` and ``spec``).
    """

    estimator: str
    moe: np.ndarray
    split: np.ndarray
    pf_step: dict[str, float | np.ndarray]
    pf_insert: dict[str, np.ndarray]
    cpu_layer: float | np.ndarray
    gpu_layer: float | np.ndarray
    shared_context: np.ndarray | None = None
    shared_us: np.ndarray | None = None
    model: ModelGeometry | None = None
    spec: PlatformSpec | None = None

    def shared_at(self, context: np.ndarray) -> np.ndarray:
        """Shared cost per token at each context (point estimates only)."""
        if self.shared_context is not None and self.shared_us is not None:
            return np.interp(np.asarray(context, np.float64), self.shared_context, self.shared_us)
        if self.model is None or self.spec is None:
            raise ValueError("LayerCosts: no shared rows and no roofline to price shared work")
        return roofline.shared_decode_us(self.model, self.spec, context)

    def shared_per_prompt(self, trace_context: np.ndarray, prompt_start: np.ndarray
                          ) -> np.ndarray:
        """Mean shared cost per token of each prompt, shape ``(..., P)``.

        Point estimates interpolate with ``np.interp``; drawn costs use the same linear
        interpolation as weights on the profiled contexts, so the draws cost one small matrix
        product instead of one interpolation per draw."""
        starts, tokens = prompt_start[:-1], np.diff(prompt_start)
        if self.shared_context is None or self.shared_us is None or np.ndim(self.shared_us) == 1:
            return np.add.reduceat(self.shared_at(trace_context), starts) / tokens
        w = interp_weights(trace_context, self.shared_context)              # (N, contexts)
        per_prompt = np.add.reduceat(w, starts, axis=0) / tokens[:, None]   # (P, contexts)
        return self.shared_us @ per_prompt.T


def interp_weights(x: np.ndarray, xp: np.ndarray) -> np.ndarray:
    """``W[i, j]`` such that ``W @ fp`` is ``np.interp(x, xp, fp)`` for every ``fp`` (linear
    between the points ``xp``, held constant beyond the ends)."""
    x = np.clip(np.asarray(x, np.float64), xp[0], xp[-1])
    w = np.zeros((x.size, xp.size))
    if xp.size == 1:
        w[:, 0] = 1.0
        return w
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, xp.size - 2)
    t = (x - xp[j]) / (xp[j + 1] - xp[j])
    rows = np.arange(x.size)
    w[rows, j] = 1.0 - t
    w[rows, j + 1] += t
    return w


def _mutable_ids() -> list[str]:
    return [r.value for r in Residency if r.mutable]


def _col(v) -> np.ndarray:
    """A scalar cost, or one per draw, shaped to broadcast against ``(..., top_k + 1)``."""
    return np.asarray(v, np.float64)[..., None]


def cope_costs(op: OperatingPoint, split: np.ndarray | None = None) -> LayerCosts:
    """COPE: whole-layer schedule costs measured with their real overlap.

    ``split`` fixes the cost-selected CPU share per hit count (default: the cheapest of
    ``op``); profile draws reuse the split the medians chose, so TPOT stays linear in them."""
    k = op.top_k
    if split is None:
        split = cost_selected_split(op)[0]
    h = np.arange(k + 1)
    sched = np.asarray(op.schedule)
    moe = np.stack([sched[..., _P, h, k - h], sched[..., _W, h, 0], sched[..., _R, h, 0],
                    sched[..., _C, h, split]], axis=-2)
    # an inserted prefetch is priced beside the CPU experts its layer computes: parallel's
    # misses, cost_selected's CPU share, none for the staging executions
    none = np.zeros_like(h)
    beside_c = np.stack([k - h, none, none, np.asarray(split)[h]])      # (4, top_k + 1)
    return LayerCosts("cope", moe, split,
                      pf_step={r: op.prefetch[r][..., 0] for r in _mutable_ids()},
                      pf_insert={r: op.prefetch_beside[r][..., beside_c]
                                 - _col(op.prefetch[r][..., 0])[..., None]
                                 for r in _mutable_ids()},
                      cpu_layer=op.cpu_layer, gpu_layer=op.gpu_layer,
                      shared_context=op.shared_context, shared_us=op.shared_us)


def atomic_layer(op: OperatingPoint, e: int, h, c, u, *, serial: bool = False) -> np.ndarray:
    """One MoE layer composed from isolated op costs: execution ``e`` (index into
    ``EXECUTIONS``) at ``h`` hits with ``c`` misses on the CPU and ``u`` staged.

    The accelerator lane (resident experts), the CPU lane (CPU experts after the activation
    copy) and the copy lane (staging) take their maximum where the execution nominally overlaps
    them, or their sum with ``serial`` (the same ops one after another); staged compute, the
    final sync and the merge follow. ``h``, ``c``, ``u`` may be arrays of one shape; costs keep
    any leading draw dimensions of ``op``."""
    R, C = op.atomic["gpu_expert"], op.atomic["cpu_expert"]
    S, G = op.atomic["stage"], op.atomic["staged_gpu_expert"]
    A, F, M = _col(op.act_copy), _col(op.sync), _col(op.merge)
    h, c, u = (np.asarray(v, np.int64) for v in (h, c, u))
    join = np.add if serial else np.maximum
    if e == _P:                 # nothing staged: no staged compute either
        return join(R[..., h], C[..., c] + A) + F + M
    if e == _W:
        lanes = S[..., u] + R[..., h]       # serial by design: every copy, then compute
    elif e == _R:
        lanes = join(R[..., h], S[..., u])
    elif e == _C:
        lanes = join(join(R[..., h], C[..., c] + A), S[..., u])
    else:
        raise ValueError(f"unknown execution index {e}")
    return lanes + G[..., u] + F + M


def atomic_costs(op: OperatingPoint, split: np.ndarray | None = None) -> LayerCosts:
    """Atomic-op simulation: isolated op costs, max where nominally overlapped, + where serial
    (:func:`atomic_layer`)."""
    k = op.top_k
    if split is None:
        split = cost_selected_split(op)[0]
    h = np.arange(k + 1)
    m = k - h
    zero = np.zeros_like(h)
    moe = np.stack([atomic_layer(op, _P, h, m, zero), atomic_layer(op, _W, h, zero, m),
                    atomic_layer(op, _R, h, zero, m),
                    atomic_layer(op, _C, h, split, m - split)], axis=-2)
    R, C = op.atomic["gpu_expert"], op.atomic["cpu_expert"]
    A, F, M = _col(op.act_copy), _col(op.sync), _col(op.merge)
    ones = np.ones((4, k + 1))
    A1, F1, M1 = A[..., 0], F[..., 0], M[..., 0]
    return LayerCosts("atomic", moe, split,
                      pf_step={r: np.zeros(np.shape(op.act_copy)) for r in _mutable_ids()},
                      pf_insert={r: ones * _col(op.prefetch_op)[..., None]
                                 for r in _mutable_ids()},
                      cpu_layer=C[..., k] + A1 + F1 + M1, gpu_layer=R[..., k] + M1,
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
        # the pure roofline at the operating point's GPU share (MPS scales throughput)
        return hrm_costs(model, spec.at_share(op.gpu_share), op.cpu_threads, split)
    raise CopeInputError(f"unknown estimator {estimator!r}; expected one of {list(ESTIMATORS)}",
                         field="estimator")


# --- which estimators a profile can run ---------------------------------------------------------
def profile_spec(profile: Profile) -> PlatformSpec | None:
    """The roofline spec carried in a profile's platform metadata, if any (a malformed one is a
    :class:`~cope_core.errors.CopeInputError` naming the file)."""
    data = (profile.platform or {}).get("spec")
    return PlatformSpec.from_dict(data, source=profile.path) if data else None


def hrm_spec(profile: Profile, spec: PlatformSpec | None = None, *, strict: bool = False
             ) -> tuple[PlatformSpec | None, str | None]:
    """The roofline spec the HRM estimator would use on ``profile``, and why there is none.

    Parameters
    ----------
    profile : Profile
    spec : PlatformSpec, optional
        A spec given by the user; it replaces the profile's (even a malformed one).
    strict : bool
        Whether a malformed spec in the profile raises (``cope evaluate``: the user must say
        ``--spec``) or only rules HRM out, with the reason (the app, the exports).

    Returns
    -------
    (PlatformSpec or None, str or None)
        The spec, or None and a sentence saying why HRM cannot run.
    """
    if spec is not None:
        return spec, None
    try:
        found = profile_spec(profile)
    except CopeInputError as exc:
        if strict:
            raise
        return None, f"the profile's platform spec is unusable ({exc})"
    if found is None:
        return None, "the profile carries no platform spec (platform.spec) and none was given"
    return found, None


def estimators_for(profile: Profile, spec: PlatformSpec | None = None, *,
                   strict: bool = False) -> list[str]:
    """The estimators that can run on ``profile``: ``cope`` and ``atomic`` always, ``hrm`` when
    :func:`hrm_spec` finds a spec (``strict`` as there)."""
    found, _ = hrm_spec(profile, spec, strict=strict)
    return [e for e in ESTIMATORS if e != "hrm" or found is not None]
