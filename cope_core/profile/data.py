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
    count: int = -1
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
    residency timed beside a layer that computes ``c`` routed experts on the CPU. A profile
    without them (analytic, or measured before they existed) prices every prefetch as timed
    beside a fully resident layer."""
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


@dataclass(frozen=True, eq=False)
class OperatingPoint:
    """Every cost one operating point offers, as arrays indexed by hit or expert count.

    ``schedule[e, h, c]`` holds the schedule cost of execution ``e`` (index into
    :data:`~cope_core.matrix.EXECUTIONS`) at ``h`` hits with ``c`` misses on the CPU (NaN where no
    such row exists). ``atomic[name]`` is indexed by ``n``; single-count ops are scalars.
    ``prefetch[r]`` is indexed by ``q`` (beside a fully resident layer); ``prefetch_beside[r]``
    by ``c``: one inserted prefetch beside a layer computing ``c`` routed experts on the CPU
    (``c = 0`` is ``prefetch[r][1]``; unmeasured counts interpolated, or all equal to it).
    """

    cpu_threads: int
    gpu_share: float
    top_k: int
    shared_context: np.ndarray
    shared_us: np.ndarray
    schedule: np.ndarray
    prefetch: dict[str, np.ndarray]
    prefetch_beside: dict[str, np.ndarray]
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

    @cached_property
    def shared_in_parts(self) -> bool:
        """True for ``cope.profile/2`` rows (shared work per part), False for whole tokens."""
        names = self.table.loc[self.table["kind"] == "shared", "name"]
        return bool(names.isin(SHARED_PARTS).any())

    @property
    def schema(self) -> str:
        return PROFILE_SCHEMA if self.shared_in_parts else PROFILE_SCHEMA_WHOLE

    def check_target(self, target: ModelGeometry, source: str | None = None) -> None:
        """Refuse a trace model whose shared work this profile cannot price: the expert shape
        and the non-expert shapes must agree, and whole-token rows also need the same layer
        counts; part rows need a ``dense_block`` row when the target has dense blocks."""
        p = self.model
        fields = EXPERT_SHAPE + SHARED_SHAPE
        if not self.shared_in_parts:
            fields += ("n_layers", "dense_layers")
        for key in fields:
            a, b = getattr(p, key), getattr(target, key)
            if a != b:
                why = (" (its shared rows are whole tokens of the profiled model: re-profile, "
                       "which writes per-part rows that transfer)"
                       if key in ("n_layers", "dense_layers") else "")
                raise CopeInputError(f"profile has {key}={a} but the trace's model has {b}{why}",
                                     source=self.path, field=f"model.{key}")
        if self.shared_in_parts and target.dense_layers and p.dense_layers == 0:
            raise CopeInputError(f"the trace's model has {target.dense_layers} dense blocks but "
                                 "the profiled model has none, so no dense_block row prices them",
                                 source=self.path, field="model.dense_layers")

    def metadata(self) -> dict[str, Any]:
        return {"schema": self.schema, "platform": self.platform,
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

    def resolve(self, cpu_threads: int | None = None, gpu_share: float | None = None, *,
                model: ModelGeometry | None = None) -> OperatingPoint:
        """Cost arrays of one operating point; raises CopeInputError if anything is missing.

        ``model`` is the geometry to price (default the profiled one): its layer counts set
        the shared cost per token (:meth:`check_target` says which models a profile prices).
        Resolved points are kept: a profile's table is not modified after construction."""
        threads, share = self.choose(cpu_threads, gpu_share)
        g = model or self.model
        key = (threads, share, g.n_layers, g.dense_layers)
        if key not in self._resolved:
            rows, layout = self.operating_point_rows(threads, share, model=g)
            self._resolved[key] = layout.take(rows["median_us"].to_numpy(np.float64))
        return self._resolved[key]

    def operating_point_rows(self, cpu_threads: int | None = None, gpu_share: float | None = None,
                             *, model: ModelGeometry | None = None
                             ) -> tuple[pd.DataFrame, OperatingPointLayout]:
        """The rows of one operating point (positional index) and where each cost sits in them:
        what the uncertainty needs to draw every row's cost. ``model`` as in :meth:`resolve`."""
        g = model or self.model
        if model is not None:
            self.check_target(g)
        threads, share = self.choose(cpu_threads, gpu_share)
        t = self.table
        # compare in float32, the column's stored type, whatever the in-memory table holds
        rows = t[(t["cpu_threads"] == threads)
                 & (t["gpu_share"].to_numpy(np.float32) == np.float32(share))]
        rows = rows.reset_index(drop=True)
        return rows, operating_point_layout(rows, threads, share, self.model.top_k, self.path,
                                            layers=(g.n_layers, g.dense_layers))

@dataclass(frozen=True, eq=False)
class OperatingPointLayout:
    """Where each cost of an :class:`OperatingPoint` sits among one operating point's rows.

    Every field but ``shared_context`` and ``shared_weights`` holds row positions (-1: no such
    row, a NaN cost); :meth:`take` fills them from a value per row, or from ``B`` values per row
    (the draws of the uncertainty), which gives every cost array a leading draw dimension. The
    shared cost at each context is a weighted sum of rows, ``shared_weights @ value[shared]``
    per context: one whole-token row, or ``L`` MoE blocks + ``D`` dense blocks + the head."""

    threads: int
    share: float
    top_k: int
    shared_context: np.ndarray
    shared: np.ndarray            # (contexts, parts) row positions
    shared_weights: np.ndarray    # (contexts, parts) multipliers
    schedule: np.ndarray
    prefetch: dict[str, np.ndarray]
    #: per residency (low row, high row, weight of the high one) for c = 0..top_k
    prefetch_beside: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    layer: np.ndarray
    atomic: dict[str, np.ndarray]
    single: np.ndarray

    def take(self, values: np.ndarray) -> OperatingPoint:
        """The operating point whose costs are ``values`` (shape ``(rows,)`` or ``(rows, B)``)."""
        v = np.asarray(values, np.float64)
        pad = np.concatenate([v, np.full((1,) + v.shape[1:], np.nan)])  # index -1 -> NaN

        def at(idx):
            x = pad[idx]
            return np.moveaxis(x, -1, 0) if v.ndim == 2 else x

        single = at(self.single)
        parts = pad[self.shared]                        # (contexts, parts[, B])
        w = self.shared_weights if v.ndim == 1 else self.shared_weights[..., None]
        shared = (parts * w).sum(axis=1)
        return OperatingPoint(
            cpu_threads=self.threads, gpu_share=self.share, top_k=self.top_k,
            shared_context=self.shared_context,
            shared_us=np.moveaxis(shared, -1, 0) if v.ndim == 2 else shared,
            schedule=at(self.schedule),
            prefetch={n: at(ix) for n, ix in self.prefetch.items()},
            prefetch_beside={n: (1.0 - w) * at(lo) + w * at(hi)
                             for n, (lo, hi, w) in self.prefetch_beside.items()},
            cpu_layer=at(self.layer[0]), gpu_layer=at(self.layer[1]),
            atomic={n: at(ix) for n, ix in self.atomic.items()},
            act_copy=single[..., 0], sync=single[..., 1], merge=single[..., 2],
            prefetch_op=single[..., 3])


def shared_layout(lookup: dict[ProfileKey, int], where: str, source: str | None,
                  layers: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contexts, row positions and weights of the shared cost per token at ``layers`` = (MoE
    blocks, dense blocks); checks that the operating point has one kind of shared row, at
    least one context, and (parts) a head row and the same contexts for every block part."""
    by = {n: sorted((k.context, i) for k, i in lookup.items()
                    if k.kind == "shared" and k.name == n) for n in (SHARED_WHOLE, *SHARED_PARTS)}
    if by[SHARED_WHOLE]:
        if any(by[n] for n in SHARED_PARTS):
            raise CopeInputError(f"{where}: both shared/decode and per-part shared rows, expected "
                                 "one kind", source=source, field="name")
        ctx = np.array([c for c, _ in by[SHARED_WHOLE]], np.float64)
        pos = np.array([[i, i, i] for _, i in by[SHARED_WHOLE]], np.int64)
        return ctx, pos, np.tile([1.0, 0.0, 0.0], (len(ctx), 1))
    moe, dense, head = by["moe_block"], by["dense_block"], by["head"]
    if not moe:
        raise CopeInputError(f"{where}: no shared/decode or shared/moe_block row, expected at "
                             "least one context", source=source, field="kind")
    if len(head) != 1:
        raise CopeInputError(f"{where}: {len(head)} shared/head rows, expected one",
                             source=source, field="name")
    if dense and [c for c, _ in dense] != [c for c, _ in moe]:
        raise CopeInputError(f"{where}: shared/dense_block contexts {[c for c, _ in dense]} "
                             f"differ from shared/moe_block's {[c for c, _ in moe]}",
                             source=source, field="context")
    L, D = layers if layers is not None else (1, 1 if dense else 0)
    if D and not dense:
        raise CopeInputError(f"{where}: no shared/dense_block row to price {D} dense blocks",
                             source=source, field="kind")
    ctx = np.array([c for c, _ in moe], np.float64)
    pos = np.array([[m, (dense[j][1] if dense else m), head[0][1]]
                    for j, (_, m) in enumerate(moe)], np.int64)
    return ctx, pos, np.tile([float(L), float(D), 1.0], (len(ctx), 1))


def operating_point_layout(rows: pd.DataFrame, threads: int, share: float, top_k: int,
                           source: str | None,
                           layers: tuple[int, int] | None = None) -> OperatingPointLayout:
    """Check one operating point's rows for completeness and uniqueness and locate each cost
    (positions are those of ``rows``, in order); ``layers`` = (MoE, dense) blocks whose shared
    work per token is wanted (None: check only)."""
    where = f"operating point cpu_threads={threads} gpu_share={share:g}"
    keys = [ProfileKey(*k) for k in rows[list(ProfileKey._fields)].itertuples(index=False)]
    lookup: dict[ProfileKey, int] = {}
    for i, key in enumerate(keys):
        if key in lookup:
            raise CopeInputError(f"{where}: duplicate row {tuple(key)}", source=source,
                                 field="kind")
        lookup[key] = i
    shared_ctx, shared_pos, shared_w = shared_layout(lookup, where, source, layers)
    missing = [k for k in required_keys(top_k) if k not in lookup]
    if missing:
        raise CopeInputError(f"{where}: {len(missing)} required rows missing, first "
                             f"{tuple(missing[0])[:6]} (kind, name, hits, cpu, staged, count)",
                             source=source, field="kind")
    k = top_k
    beside = {}
    for n in PREFETCH_NAMES:
        at_c = {0: lookup[ProfileKey("prefetch", n, count=1)]}
        for key, i in lookup.items():
            if key.kind == "prefetch" and key.name == n and key.cpu != -1:
                if not (1 <= key.cpu <= k and key.count == 1):
                    raise CopeInputError(f"{where}: prefetch/{n} row beside cpu={key.cpu} with "
                                         f"count={key.count}, expected cpu 1..{k} and count 1",
                                         source=source, field="cpu")
                at_c[key.cpu] = i
        beside[n] = _interpolation(at_c, k)
    sched = np.full((len(EXECUTIONS), k + 1, k + 1), -1, np.int64)
    for h in range(k + 1):
        m = k - h
        for ei, e in enumerate(EXECUTIONS):
            for c in range(m + 1):
                sched[ei, h, c] = lookup.get(ProfileKey("schedule", e.value, h, c, m - c), -1)
    return OperatingPointLayout(
        threads=threads, share=share, top_k=k,
        shared_context=shared_ctx, shared=shared_pos, shared_weights=shared_w, schedule=sched,
        prefetch={n: np.array([lookup[ProfileKey("prefetch", n, count=q)] for q in (0, 1)])
                  for n in PREFETCH_NAMES},
        prefetch_beside=beside,
        layer=np.array([lookup[ProfileKey("layer", n)] for n in LAYER_NAMES]),
        atomic={n: np.array([lookup[ProfileKey("atomic", n, count=c)] for c in range(k + 1)])
                for n in ATOMIC_PER_N},
        single=np.array([lookup[ProfileKey("atomic", n, count=1)] for n in ATOMIC_SINGLE]))


def _interpolation(at_c: dict[int, int], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows and weights giving a value at every ``c = 0..k`` from the rows measured at the
    counts of ``at_c`` (which holds 0): linear between measured counts, the highest measured
    one beyond them."""
    cs = sorted(at_c)
    lo, hi, w = (np.empty(k + 1, np.int64), np.empty(k + 1, np.int64), np.zeros(k + 1))
    for c in range(k + 1):
        below = max(x for x in cs if x <= c)
        above = min((x for x in cs if x >= c), default=below)
        lo[c], hi[c] = at_c[below], at_c[above]
        if above != below:
            w[c] = (c - below) / (above - below)
    return lo, hi, w


def build_operating_point(rows: pd.DataFrame, threads: int, share: float, top_k: int,
                          source: str | None,
                          layers: tuple[int, int] | None = None) -> OperatingPoint:
    """Turn one operating point's rows into arrays, checking completeness and uniqueness."""
    layout = operating_point_layout(rows, threads, share, top_k, source, layers)
    return layout.take(rows["median_us"].to_numpy(np.float64))
