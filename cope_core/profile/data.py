"""The in-memory profile record and its resolution to one operating point's cost arrays
(docs/design.md#profiles-and-operating-points). Its keys live in :mod:`.keys`, the arrays of an
operating point and their layout in :mod:`.layout`; the names of both are re-exported here."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from .keys import (
    ATOMIC_PER_N,
    ATOMIC_SINGLE,
    COLUMNS,
    EXPERT_SHAPE,
    KEY_COLUMNS,
    KINDS,
    LAYER_NAMES,
    PREFETCH_NAMES,
    PROFILE_SCHEMA,
    PROFILE_SCHEMA_WHOLE,
    PROFILE_SCHEMAS,
    SHARED_PARTS,
    SHARED_SHAPE,
    SHARED_WHOLE,
    ProfileKey,
    beside_counts,
    beside_keys,
    required_keys,
    same_schedule,
)
from .layout import (
    OperatingPoint,
    OperatingPointLayout,
    build_operating_point,
    operating_point_layout,
    shared_layout,
)


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
        fields: tuple[str, ...] = EXPERT_SHAPE + SHARED_SHAPE
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
        # a profile prices the bytes it timed (a measured one: the torch executor's 16-bit
        # experts); another stored format is refused, never rescaled
        # (docs/design.md#bytes-as-stored)
        if (p.format_name, p.expert_bytes, p.weight_bytes_per_param) != (
                target.format_name, target.expert_bytes, target.weight_bytes_per_param):
            how = ("measure it, or make an analytic profile of that model: cope profile "
                   "--analytic --model FILE" if not self.analytic else
                   "make the analytic profile from the same model file")
            raise CopeInputError(
                f"profile priced {p.format_name} weights ({p.expert_bytes / 2**20:.3f} MiB per "
                f"expert) but the trace's model stores {target.format_name} "
                f"({target.expert_bytes / 2**20:.3f} MiB per expert); {how}",
                source=self.path, field="model.weight_format")
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
    def _resolved(self) -> dict[tuple[int, float, int, int], OperatingPoint]:
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


__all__ = ["ATOMIC_PER_N", "ATOMIC_SINGLE", "COLUMNS", "EXPERT_SHAPE", "KEY_COLUMNS", "KINDS",
           "LAYER_NAMES", "OperatingPoint", "OperatingPointLayout", "PREFETCH_NAMES",
           "PROFILE_SCHEMA", "PROFILE_SCHEMAS", "PROFILE_SCHEMA_WHOLE", "Profile", "ProfileKey",
           "SHARED_PARTS", "SHARED_SHAPE", "SHARED_WHOLE", "beside_counts", "beside_keys",
           "build_operating_point", "operating_point_layout", "required_keys", "same_schedule",
           "shared_layout"]
