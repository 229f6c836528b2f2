"""The Policy Matrix: residency x execution candidates plus the layer-partition baseline
(docs/design.md#the-policy-matrix)."""
from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import CopeInputError


class Residency(str, enum.Enum):
    """Which experts sit in VRAM when a layer runs, and how that set changes."""

    FIXED = "fixed"
    MUTABLE_PER_LAYER = "mutable_per_layer"
    MUTABLE_CROSS_LAYER = "mutable_cross_layer"

    @property
    def mutable(self) -> bool:
        return self is not Residency.FIXED


class Execution(str, enum.Enum):
    """How a layer's routed experts run given h hits and m = top_k - h misses."""

    PARALLEL = "parallel"
    WAIT_THEN_GPU = "wait_then_gpu"
    READY_FIRST = "ready_first"
    COST_SELECTED = "cost_selected"


LAYER_PARTITION = "layer_partition"

RESIDENCIES: tuple[Residency, ...] = tuple(Residency)
EXECUTIONS: tuple[Execution, ...] = tuple(Execution)

RESIDENCY_TEXT = {
    Residency.FIXED: "K slots per layer filled once with the layer's most popular experts; "
                     "never changes",
    Residency.MUTABLE_PER_LAYER: "same fill; while layer l runs, one predicted expert may be "
                                 "prefetched into layer l+1's K slots, evicting its least recently "
                                 "used",
    Residency.MUTABLE_CROSS_LAYER: "one pool of K*L slots shared by all layers; a prefetch may "
                                   "evict the least recently used expert of any layer but the "
                                   "executing one",
}
EXECUTION_TEXT = {
    Execution.PARALLEL: "hits on the GPU, every miss computed on the CPU, concurrently; "
                        "results merged",
    Execution.WAIT_THEN_GPU: "copy every missed expert's weights to the GPU, then compute all on "
                             "the GPU",
    Execution.READY_FIRST: "start resident experts on the GPU while misses are copied, then "
                           "compute them",
    Execution.COST_SELECTED: "split the misses: c on the CPU, u copied and run on the GPU, all "
                             "overlapped; the split with the lowest measured schedule cost",
}


@dataclass(frozen=True)
class Candidate:
    """One policy: a matrix cell, or the layer-partition baseline (residency/execution None)."""

    id: str
    residency: Residency | None
    execution: Execution | None
    prior_systems: tuple[str, ...]
    new: bool

    @property
    def is_layer_partition(self) -> bool:
        return self.residency is None

    @property
    def in_paper(self) -> bool:
        """The paper instantiated nine: layer partition plus fixed and per-layer rows."""
        return self.residency is not Residency.MUTABLE_CROSS_LAYER


_PRIOR: dict[tuple[Residency, Execution], tuple[str, ...]] = {
    (Residency.FIXED, Execution.PARALLEL): ("KTransformers",),
    (Residency.FIXED, Execution.WAIT_THEN_GPU): ("MoE-Lightning (batch-n)",),
    (Residency.FIXED, Execution.READY_FIRST): (),
    (Residency.FIXED, Execution.COST_SELECTED): ("Fiddler",),
    (Residency.MUTABLE_PER_LAYER, Execution.PARALLEL): (),
    (Residency.MUTABLE_PER_LAYER, Execution.WAIT_THEN_GPU): ("Mixtral-Offloading", "DuoServe-MoE"),
    (Residency.MUTABLE_PER_LAYER, Execution.READY_FIRST): ("ProMoE",),
    (Residency.MUTABLE_PER_LAYER, Execution.COST_SELECTED): ("HybriMoE", "DALI"),
    (Residency.MUTABLE_CROSS_LAYER, Execution.PARALLEL): (),
    (Residency.MUTABLE_CROSS_LAYER, Execution.WAIT_THEN_GPU): ("MoE-Infinity",),
    (Residency.MUTABLE_CROSS_LAYER, Execution.READY_FIRST): (),
    (Residency.MUTABLE_CROSS_LAYER, Execution.COST_SELECTED): ("FreeToken",),
}


def candidate_id(residency: Residency, execution: Execution) -> str:
    return f"{residency.value}/{execution.value}"


#: All 13 candidates in the canonical (exact-tie) order of docs/design.md#the-policy-matrix:
#: layer partition, then residency order, then execution order.
CANDIDATES: tuple[Candidate, ...] = (
    Candidate(LAYER_PARTITION, None, None, ("llama.cpp (--n-cpu-moe)",), False),
) + tuple(
    Candidate(candidate_id(r, e), r, e, _PRIOR[(r, e)], not _PRIOR[(r, e)])
    for r in RESIDENCIES for e in EXECUTIONS
)
CANDIDATE_IDS: tuple[str, ...] = tuple(c.id for c in CANDIDATES)
_BY_ID = {c.id: c for c in CANDIDATES}

#: Mechanisms that are real deployment options but sit outside the matrix.
OUT_OF_SCOPE: tuple[str, ...] = (
    "GPU zero-copy reads of host memory (vLLM UVA offloader)",
    "whole-module prefetch in execution order (vLLM prefetch offloader, SGLang OffloaderV2)",
    "anything that changes routing, skips or substitutes experts (approximate routing, pruning)",
    "lowering expert precision (quantised or mixed-precision experts)",
)


def get_candidate(cid: str) -> Candidate:
    """Look a candidate up by id (``layer_partition`` or ``RESIDENCY/EXECUTION``)."""
    try:
        return _BY_ID[cid]
    except KeyError:
        raise CopeInputError(f"unknown candidate {cid!r}; expected one of {list(CANDIDATE_IDS)}",
                             field="candidate") from None


def select_candidates(ids: Iterable[str] | None = None) -> tuple[Candidate, ...]:
    """The candidates named by ``ids`` (default: all 13), each once, in canonical order.

    The canonical order is also the exact-tie order, so every computation that takes a list of
    candidate ids goes through here. Unknown ids raise CopeInputError."""
    if ids is None:
        return CANDIDATES
    wanted = {get_candidate(c).id for c in ids}
    return tuple(c for c in CANDIDATES if c.id in wanted)


def residencies_of(candidates: Iterable[Candidate | str]) -> tuple[Residency, ...]:
    """The residencies (in canonical order) that ``candidates`` need replayed; layer partition
    needs none."""
    need = {(c if isinstance(c, Candidate) else get_candidate(c)).residency for c in candidates}
    return tuple(r for r in RESIDENCIES if r in need)


def same_work_groups(candidates: Iterable[Candidate | str], K: int, n_experts: int,
                     cpu_share: Sequence[int] | np.ndarray | None = None
                     ) -> list[tuple[tuple[str, ...], str]]:
    """Groups of candidates the policy space forces to do the same work in one cell.

    Measured apart beyond noise, such a group is a measurement problem, not a result
    (docs/design.md#trustworthy-measurement). Two rules: at ``K = E`` every expert is resident,
    so every candidate runs every routed expert on the accelerator; and a ``cost_selected`` whose
    split puts every miss on the CPU at every hit count runs its residency's ``parallel``.

    Parameters
    ----------
    candidates : iterable of Candidate or str
    K, n_experts : int
        The cell's cache size and the model's experts per layer.
    cpu_share : sequence of int, optional
        cost_selected's CPU share per hit count ``h = 0..top_k`` (as
        :func:`cope_core.profile.pricing.cost_selected_split`).

    Returns
    -------
    list of (ids, why)
        Groups of two or more ids in canonical order, with the reason in words.
    """
    cands = [c if isinstance(c, Candidate) else get_candidate(c) for c in candidates]
    cands = sorted(cands, key=lambda c: CANDIDATE_IDS.index(c.id))
    if K >= n_experts and len(cands) > 1:
        return [(tuple(c.id for c in cands), f"K = E = {n_experts}: every expert is resident")]
    out: list[tuple[tuple[str, ...], str]] = []
    if cpu_share is not None:
        top_k = len(cpu_share) - 1
        if all(int(c) == top_k - h for h, c in enumerate(cpu_share)):
            ids = {c.id for c in cands}
            for r in Residency:
                pair = (candidate_id(r, Execution.PARALLEL),
                        candidate_id(r, Execution.COST_SELECTED))
                if set(pair) <= ids:
                    out.append((pair, "cost_selected's split puts every miss on the CPU"))
    return out


def matrix_table() -> dict:
    """The matrix as plain data (for ``cope matrix --json`` and the app)."""
    return {
        "residencies": [{"id": r.value, "description": RESIDENCY_TEXT[r]} for r in RESIDENCIES],
        "executions": [{"id": e.value, "description": EXECUTION_TEXT[e]} for e in EXECUTIONS],
        "candidates": [
            {"id": c.id, "residency": c.residency.value if c.residency else None,
             "execution": c.execution.value if c.execution else None,
             "prior_systems": list(c.prior_systems), "new": c.new, "in_paper": c.in_paper}
            for c in CANDIDATES
        ],
        "baseline": {"id": LAYER_PARTITION,
                     "description": "whole MoE layers on one side: the first N_cpu layers run all "
                                    "experts on the CPU, the rest on the GPU fully resident; "
                                    "N_gpu = the most last layers whose stored experts fit "
                                    "the bytes of K experts in every layer"},
        "out_of_scope": list(OUT_OF_SCOPE),
    }
