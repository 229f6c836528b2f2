"""One operating point's costs as arrays (:class:`OperatingPoint`), and where each sits among the
operating point's rows (:class:`OperatingPointLayout`): the checks that a profile is complete and
the indexing that turns its medians, or their draws, into arrays."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..matrix import EXECUTIONS
from .keys import (
    ATOMIC_PER_N,
    ATOMIC_SINGLE,
    LAYER_NAMES,
    PREFETCH_NAMES,
    SHARED_PARTS,
    SHARED_WHOLE,
    ProfileKey,
    required_keys,
)


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
