"""``cope.profile/2`` files (and ``cope.profile/1``, read as ever; docs/formats.md): one row per
measured quantity and operating point."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import CopeInputError
from ..matrix import EXECUTIONS
from ..profile.data import (
    ATOMIC_PER_N,
    ATOMIC_SINGLE,
    KEY_COLUMNS,
    KINDS,
    LAYER_NAMES,
    PREFETCH_NAMES,
    SHARED_PARTS,
    SHARED_WHOLE,
    Profile,
    build_operating_point,
)
from ..profile.data import COLUMNS as PROFILE_COLUMNS
from ._common import (
    PROFILE_SCHEMA,
    _about,
    _check,
    _check_costs,
    _check_operating_point,
    _columns,
    _first_duplicate,
    _meta_value,
    _read,
    _write_frame,
)

_PROFILE_NAMES = {"shared": (SHARED_WHOLE, *SHARED_PARTS),
                  "schedule": tuple(e.value for e in EXECUTIONS), "prefetch": PREFETCH_NAMES,
                  "layer": LAYER_NAMES, "atomic": ATOMIC_PER_N + ATOMIC_SINGLE}
#: Which index columns each profile kind uses; the others must hold the -1 sentinel (the shared
#: ``head`` row has no context: the LM head does not read the KV cache).
_PROFILE_USES = {"shared": ("context",), "schedule": ("hits", "cpu", "staged"),
                 "prefetch": ("count",), "layer": (), "atomic": ("count",)}
_NO_CONTEXT = ("shared", "head")


def _profile_frame(table: pa.Table, top_k: int, src: str) -> pd.DataFrame:
    """Validate profile rows and every operating point's completeness
    (docs/design.md#profiles-and-operating-points)."""
    c = _columns(table, PROFILE_COLUMNS, PROFILE_SCHEMA, src)
    kind, name = c["kind"], c["name"]
    if len(kind) == 0:
        raise CopeInputError("the profile has no rows", source=src, field="kind")
    _check(~np.isin(kind, KINDS), src, "kind",
           lambda i: f"row {i}: {kind[i]!r}, expected one of {list(KINDS)}")
    name_ok = np.zeros(len(kind), bool)
    for kd, names in _PROFILE_NAMES.items():
        name_ok |= (kind == kd) & np.isin(name, names)
    _check(~name_ok, src, "name", lambda i: f"row {i} (kind {kind[i]}): {name[i]!r}, expected "
           f"one of {list(_PROFILE_NAMES[kind[i]])}")
    beside = (kind == "prefetch") & (c["cpu"] != -1)   # beside CPU misses: checked per point
    for col in ("hits", "cpu", "staged", "count", "context"):
        v = c[col]
        uses = np.isin(kind, [kd for kd, cols in _PROFILE_USES.items() if col in cols])
        if col == "context":
            uses &= ~((kind == _NO_CONTEXT[0]) & (name == _NO_CONTEXT[1]))
        unset_ok = beside if col == "cpu" else np.zeros(len(v), bool)
        _check(np.where(uses, v < 0, (v != -1) & ~unset_ok), src, col,
               lambda i, v=v, uses=uses: f"row {i} (kind {kind[i]}): {v[i]}, expected "
               + (">= 0" if uses[i] else f"-1 (unused by {kind[i]}/{name[i]})"))
    total = c["hits"].astype(np.int64) + c["cpu"] + c["staged"]
    _check((kind == "schedule") & (total != top_k), src, "hits", lambda i: f"row {i}: hits + "
           f"cpu + staged = {total[i]}, expected top_k = {top_k}")
    _check_operating_point(c, src)
    _check_costs(c, src, ("median_us", "p25_us", "p75_us"), positive=False)
    _check(c["samples"] < 1, src, "samples",
           lambda i: f"row {i}: {c['samples'][i]}, expected >= 1")
    df = pd.DataFrame({col: c[col] for col in PROFILE_COLUMNS})
    _first_duplicate(df, list(KEY_COLUMNS), src, "kind")
    for (threads, share), rows in df.groupby(["cpu_threads", "gpu_share"], sort=True):
        build_operating_point(rows, int(threads), float(share), top_k, src)
    return df




def read_profile(path: str | os.PathLike) -> Profile:
    """Read a ``cope.profile/2`` file (shared work per part) or a ``cope.profile/1`` file (one
    whole token of shared work), checking every row and every operating point
    (docs/design.md#profiles-and-operating-points).

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    Profile
        ``table`` has the columns and dtypes of :data:`cope_core.profile.data.COLUMNS`;
        ``analytic`` is False when the metadata omits it. Bad rows, or an operating point that
        lacks a required row, raise CopeInputError.
    """
    table, meta, src, g = _read(path, PROFILE_SCHEMA)
    prof = Profile(table=_profile_frame(table, g.top_k, src), model=g, **_about(meta, src),
                   analytic=_meta_value(meta, "analytic", bool, src, False), path=src)
    if prof.schema != meta["schema"]:
        rows = "per-part shared rows" if prof.shared_in_parts else "shared/decode rows"
        raise CopeInputError(f"a {meta['schema']} file holds {rows}, which are "
                             f"{prof.schema}'s", source=src, field="schema")
    return prof


def write_profile(profile: Profile, path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Validate and write a profile (atomic; see :func:`_write`): ``cope.profile/2`` when its
    shared rows are per part, ``cope.profile/1`` when they are whole tokens.

    Parameters
    ----------
    profile : Profile
        Its table may use any integer/float widths that fit; they are cast to the contract.
    path : str or PathLike
    overwrite : bool
    """
    _write_frame(profile.table, lambda t, src: _profile_frame(t, profile.model.top_k, src),
                 PROFILE_COLUMNS, profile.metadata(), path, overwrite)


