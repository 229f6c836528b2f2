"""The keys of a profile: its columns, the names of its rows and which rows an operating point
must hold (docs/formats.md#profile-cope-profile-2, docs/design.md#profiles-and-operating-points).
"""
from __future__ import annotations

from typing import NamedTuple

from ..matrix import Execution, Residency

#: Schema ids of a profile file (docs/formats.md): /2 is written whenever the shared work is
#: per part, /1 (whole tokens) is still read and written for such profiles.
PROFILE_SCHEMA_WHOLE = "cope.profile/1"
PROFILE_SCHEMA = "cope.profile/2"
PROFILE_SCHEMAS = (PROFILE_SCHEMA_WHOLE, PROFILE_SCHEMA)
KINDS = ("shared", "schedule", "prefetch", "layer", "atomic")
#: ``shared`` rows: one whole token of the profiled geometry (``cope.profile/1``), or its parts
#: (``cope.profile/2``), which compose into a token of any layer count.
SHARED_WHOLE = "decode"
SHARED_PARTS = ("moe_block", "dense_block", "head")
#: Geometry fields the shared work depends on besides the expert shape: a profile only prices a
#: trace whose model agrees on them (and, for whole-token rows, on the layer counts too).
SHARED_SHAPE = ("n_heads", "n_kv_heads", "head_dim", "vocab", "n_shared_experts")
EXPERT_SHAPE = ("top_k", "hidden", "expert_intermediate", "dtype_bytes")
ATOMIC_PER_N = ("gpu_expert", "cpu_expert", "stage", "staged_gpu_expert")
ATOMIC_SINGLE = ("act_copy", "sync", "merge", "prefetch")
LAYER_NAMES = ("cpu_layer", "gpu_layer")
PREFETCH_NAMES = (Residency.MUTABLE_PER_LAYER.value, Residency.MUTABLE_CROSS_LAYER.value)

#: Columns of ``cope.profile/1`` and their Arrow/numpy types.
COLUMNS: dict[str, str] = {
    "kind": "string", "name": "string", "hits": "int16", "cpu": "int16", "staged": "int16",
    "count": "int16", "context": "int32", "cpu_threads": "int16", "gpu_share": "float32",
    "median_us": "float64", "p25_us": "float64", "p75_us": "float64", "samples": "int32",
}
KEY_COLUMNS = ("kind", "name", "hits", "cpu", "staged", "count", "context", "cpu_threads",
               "gpu_share")


class ProfileKey(NamedTuple):
    """The key columns of one profile row at an operating point; -1 marks a column the row's
    kind does not use (docs/formats.md)."""

    kind: str
    name: str
    hits: int = -1
    cpu: int = -1
    staged: int = -1
    count: int = -1   # type: ignore[assignment]  # the column's name; shadows tuple.count
    context: int = -1


def required_keys(top_k: int) -> list[ProfileKey]:
    """Every row one operating point must have, besides its ``shared`` rows (any contexts, at
    least one), which are checked separately (:func:`shared_layout`)."""
    sched, E = "schedule", Execution
    keys: list[ProfileKey] = []
    for h in range(top_k + 1):
        m = top_k - h
        keys.append(ProfileKey(sched, E.PARALLEL.value, h, m, 0))
        keys.append(ProfileKey(sched, E.WAIT_THEN_GPU.value, h, 0, m))
        keys.append(ProfileKey(sched, E.READY_FIRST.value, h, 0, m))
        for c in range(m + 1):
            keys.append(ProfileKey(sched, E.COST_SELECTED.value, h, c, m - c))
    for name in PREFETCH_NAMES:
        for q in (0, 1):
            keys.append(ProfileKey("prefetch", name, count=q))
    for name in LAYER_NAMES:
        keys.append(ProfileKey("layer", name))
    for name in ATOMIC_PER_N:
        for n in range(top_k + 1):
            keys.append(ProfileKey("atomic", name, count=n))
    for name in ATOMIC_SINGLE:
        keys.append(ProfileKey("atomic", name, count=1))
    return keys


def beside_counts(top_k: int) -> list[int]:
    """CPU-miss counts ``c >= 1`` beside which the profiler also times one inserted prefetch
    (the ``prefetch`` rows with ``cpu = c``): half the routed experts and all of them; other
    counts are interpolated (:func:`operating_point_layout`)."""
    return sorted({c for c in ((top_k + 1) // 2, top_k) if c >= 1})


def beside_keys(top_k: int) -> list[ProfileKey]:
    """The optional rows of one operating point: one inserted prefetch of each mutable
    residency timed beside a layer that computes ``c`` routed experts on the CPU (the profiler
    times these counts; an analytic profile computes every ``c = 1 .. top_k``). A profile
    without them (measured before they existed) prices every prefetch as timed beside a fully
    resident layer."""
    return [ProfileKey("prefetch", name, cpu=c, count=1)
            for name in PREFETCH_NAMES for c in beside_counts(top_k)]


def same_schedule(row: ProfileKey | tuple, top_k: int) -> ProfileKey:
    """The row whose measurement also stands for ``row``: schedules that are the same code path
    are timed once by the profiler and share one draw in the uncertainty. ``cost_selected`` with
    every miss on the CPU runs exactly ``parallel``'s steps and with none exactly
    ``ready_first``'s; with no misses at all every strategy runs the same steps as ``parallel``.
    Timing them once keeps noise from ordering identical work."""
    row = ProfileKey(*row)
    if row.kind != "schedule":
        return row
    m = top_k - row.hits
    if m == 0 or (row.name == Execution.COST_SELECTED.value and row.cpu == m):
        return ProfileKey("schedule", Execution.PARALLEL.value, row.hits, m, 0)
    if row.name == Execution.COST_SELECTED.value and row.cpu == 0:
        return ProfileKey("schedule", Execution.READY_FIRST.value, row.hits, 0, m)
    return row
