"""The in-memory profile and its resolution to one operating point's cost arrays
(docs/design.md#profiles-and-operating-points)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import EXECUTIONS, Execution, Residency

KINDS = ("shared", "schedule", "prefetch", "layer", "atomic")
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
    count: int = -1
    context: int = -1


def required_keys(top_k: int) -> list[ProfileKey]:
    """Every row one operating point must have, besides its ``shared`` rows (any contexts, at
    least one), which are checked separately."""
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


@dataclass(frozen=True, eq=False)
class OperatingPoint:
    """Every cost one operating point offers, as arrays indexed by hit or expert count.

    ``schedule[e, h, c]`` holds the schedule cost of execution ``e`` (index into
    :data:`~cope_core.matrix.EXECUTIONS`) at ``h`` hits with ``c`` misses on the CPU (NaN where no
    such row exists). ``atomic[name]`` is indexed by ``n``; single-count ops are scalars.
    """

    cpu_threads: int
    gpu_share: float
    top_k: int
    shared_context: np.ndarray
    shared_us: np.ndarray
    schedule: np.ndarray
    prefetch: dict[str, np.ndarray]
    cpu_layer: float
    gpu_layer: float
    atomic: dict[str, np.ndarray]
    act_copy: float
    sync: float
    merge: float
    prefetch_op: float

    def shared_at(self, context: np.ndarray) -> np.ndarray:
        """Shared per-token cost at each context: linear between profiled contexts, clamped."""
        return np.interp(np.asarray(context, dtype=np.float64), self.shared_context, self.shared_us)


@dataclass(frozen=True, eq=False)
class Profile:
    """A ``cope.profile/1`` table with its metadata.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per measured quantity, columns :data:`COLUMNS`.
    model : ModelGeometry
        Geometry the profile was measured for.
    platform : dict
        GPU, CPU, link, torch and host descriptions plus the roofline ``spec``.
    analytic : bool
        True when the costs come from the roofline model rather than measurement.
    """

    table: pd.DataFrame
    model: ModelGeometry
    platform: dict[str, Any]
    created: str = ""
    notes: str = ""
    analytic: bool = False
    path: str | None = field(default=None, compare=False)

    def metadata(self) -> dict[str, Any]:
        return {"schema": "cope.profile/1", "platform": self.platform,
                "model": self.model.to_dict(), "created": self.created, "notes": self.notes,
                "analytic": self.analytic}

    @cached_property
    def _operating_points(self) -> tuple[tuple[int, float], ...]:
        ops = self.table[["cpu_threads", "gpu_share"]].drop_duplicates()
        return tuple(sorted((int(a), float(b)) for a, b in ops.itertuples(index=False)))

    def operating_points(self) -> list[tuple[int, float]]:
        """Distinct (cpu_threads, gpu_share) pairs, sorted."""
        return list(self._operating_points)

    def choose(self, cpu_threads: int | None = None,
               gpu_share: float | None = None) -> tuple[int, float]:
        """The operating point to use (docs/design.md#profiles-and-operating-points): the named
        thread count (else the most threads), at the named GPU share, else the largest GPU share
        measured there."""
        ops = self.operating_points()
        if cpu_threads is None:
            cpu_threads = max(t for t, _ in ops)
        shares = [s for t, s in ops if t == cpu_threads]
        if not shares:
            raise CopeInputError(f"no operating point with cpu_threads={cpu_threads}; the profile "
                                 f"has {sorted({t for t, _ in ops})}", source=self.path,
                                 field="cpu_threads")
        if gpu_share is None:
            return int(cpu_threads), max(shares)
        match = [s for s in shares if np.float32(s) == np.float32(gpu_share)]
        if not match:
            raise CopeInputError(f"no operating point with cpu_threads={cpu_threads} and "
                                 f"gpu_share={gpu_share:g}; shares measured there: {shares}",
                                 source=self.path, field="gpu_share")
        return int(cpu_threads), match[0]

    @cached_property
    def _resolved(self) -> dict[tuple[int, float], OperatingPoint]:
        return {}

    def resolve(self, cpu_threads: int | None = None,
                gpu_share: float | None = None) -> OperatingPoint:
        """Cost arrays of one operating point; raises CopeInputError if anything is missing.

        Resolved points are kept: a profile's table is not modified after construction."""
        threads, share = self.choose(cpu_threads, gpu_share)
        if (threads, share) not in self._resolved:
            self._resolved[(threads, share)] = self._build(threads, share)
        return self._resolved[(threads, share)]

    def _build(self, threads: int, share: float) -> OperatingPoint:
        t = self.table
        # compare in float32, the column's stored type, whatever the in-memory table holds
        rows = t[(t["cpu_threads"] == threads)
                 & (t["gpu_share"].to_numpy(np.float32) == np.float32(share))]
        return build_operating_point(rows, threads, share, self.model.top_k, self.path)


def build_operating_point(rows: pd.DataFrame, threads: int, share: float, top_k: int,
                          source: str | None) -> OperatingPoint:
    """Turn one operating point's rows into arrays, checking completeness and uniqueness."""
    where = f"operating point cpu_threads={threads} gpu_share={share:g}"
    keyed = rows.set_index(list(ProfileKey._fields))["median_us"]
    if keyed.index.has_duplicates:
        dup = keyed.index[keyed.index.duplicated()][0]
        raise CopeInputError(f"{where}: duplicate row {tuple(dup)}", source=source, field="kind")
    shared = rows[(rows["kind"] == "shared") & (rows["name"] == "decode")].sort_values("context")
    if shared.empty:
        raise CopeInputError(f"{where}: no shared/decode row, expected at least one context",
                             source=source, field="kind")
    lookup = {ProfileKey(*k): v for k, v in keyed.items()}
    missing = [k for k in required_keys(top_k) if k not in lookup]
    if missing:
        raise CopeInputError(f"{where}: {len(missing)} required rows missing, first "
                             f"{tuple(missing[0])[:6]} (kind, name, hits, cpu, staged, count)",
                             source=source, field="kind")
    k = top_k
    sched = np.full((len(EXECUTIONS), k + 1, k + 1), np.nan)
    for h in range(k + 1):
        m = k - h
        for ei, e in enumerate(EXECUTIONS):
            for c in range(m + 1):
                key = ProfileKey("schedule", e.value, h, c, m - c)
                if key in lookup:
                    sched[ei, h, c] = lookup[key]
    return OperatingPoint(
        cpu_threads=threads, gpu_share=share, top_k=k,
        shared_context=shared["context"].to_numpy(np.float64),
        shared_us=shared["median_us"].to_numpy(np.float64),
        schedule=sched,
        prefetch={n: np.array([lookup[ProfileKey("prefetch", n, count=q)] for q in (0, 1)])
                  for n in PREFETCH_NAMES},
        cpu_layer=float(lookup[ProfileKey("layer", "cpu_layer")]),
        gpu_layer=float(lookup[ProfileKey("layer", "gpu_layer")]),
        atomic={n: np.array([lookup[ProfileKey("atomic", n, count=c)] for c in range(k + 1)])
                for n in ATOMIC_PER_N},
        act_copy=float(lookup[ProfileKey("atomic", "act_copy", count=1)]),
        sync=float(lookup[ProfileKey("atomic", "sync", count=1)]),
        merge=float(lookup[ProfileKey("atomic", "merge", count=1)]),
        prefetch_op=float(lookup[ProfileKey("atomic", "prefetch", count=1)]),
    )
