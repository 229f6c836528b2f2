"""``cope.measurements/1`` files (docs/formats.md): one row per (candidate, prompt, trial, cell)."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import CANDIDATE_IDS
from ..measurements import Measurements
from ._common import (
    MEASUREMENTS_SCHEMA,
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

MEASUREMENT_COLUMNS: dict[str, str] = {"candidate": "string", "prompt": "int32", "trial": "int32",
                                       "tpot_us": "float64", "K": "int32", "cpu_threads": "int16",
                                       "gpu_share": "float32"}
_MEASUREMENT_KEY = ["candidate", "prompt", "trial", "K", "cpu_threads", "gpu_share"]


def _measurement_frame(table: pa.Table, g: ModelGeometry, src: str) -> pd.DataFrame:
    c = _columns(table, MEASUREMENT_COLUMNS, MEASUREMENTS_SCHEMA, src)
    cand = c["candidate"]
    if len(cand) == 0:
        raise CopeInputError("the measurements have no rows", source=src, field="candidate")
    _check(~np.isin(cand, CANDIDATE_IDS), src, "candidate",
           lambda i: f"row {i}: unknown candidate {cand[i]!r}, expected one of "
           f"{list(CANDIDATE_IDS)}")
    _check(c["trial"] < 0, src, "trial", lambda i: f"row {i}: {c['trial'][i]}, expected >= 0")
    K = c["K"]
    _check((K < 0) | (K > g.n_experts), src, "K",
           lambda i: f"row {i}: {K[i]}, expected 0..{g.n_experts} experts per layer")
    _check_operating_point(c, src)
    _check_costs(c, src, ("tpot_us",), positive=True)
    df = pd.DataFrame({col: c[col] for col in MEASUREMENT_COLUMNS})
    _first_duplicate(df, _MEASUREMENT_KEY, src, "trial")
    return df


def read_measurements(path: str | os.PathLike) -> Measurements:
    """Read and validate a ``cope.measurements/1`` file (docs/design.md#measurement-and-evaluation).

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    Measurements
        Unknown candidates, non-finite or non-positive ``tpot_us``, ``K`` outside ``[0, E]``
        or a repeated (candidate, prompt, trial, K, operating point) raise CopeInputError.
    """
    table, meta, src, g = _read(path, MEASUREMENTS_SCHEMA)
    quality = _meta_value(meta, "quality", dict, src, {})
    progress = _meta_value(meta, "progress", dict, src, {})
    _check_quality(quality, progress, src)
    return Measurements(table=_measurement_frame(table, g, src), model=g, **_about(meta, src),
                        quality=quality, progress=progress, path=src)


def _check_quality(quality: dict, progress: dict, src: str) -> None:
    """The shape of the optional ``quality`` and ``progress`` keys (docs/formats.md)."""
    cells = quality.get("cells", [])
    if not isinstance(cells, list):
        raise CopeInputError(f"got {cells!r:.60}, expected a list", source=src,
                             field="quality.cells")
    for i, c in enumerate(cells):
        for key, kind in (("K", int), ("cpu_threads", int), ("reference", dict),
                          ("outliers", list), ("same_work", list)):
            if not isinstance(c, dict) or not isinstance(c.get(key), kind) \
                    or isinstance(c.get(key), bool):
                raise CopeInputError(f"cell {i}: expected {key!r} ({kind.__name__})",
                                     source=src, field="quality.cells")
    if "complete" in progress and not isinstance(progress["complete"], bool):
        raise CopeInputError(f"got {progress['complete']!r:.60}, expected true or false",
                             source=src, field="progress.complete")


def write_measurements(m: Measurements, path: str | os.PathLike, *,
                       overwrite: bool = False) -> None:
    """Validate and write measurements as ``cope.measurements/1`` (atomic; see :func:`_write`).

    Parameters
    ----------
    m : Measurements
        Table columns are cast to :data:`MEASUREMENT_COLUMNS`.
    path : str or PathLike
    overwrite : bool
    """
    _write_frame(m.table, lambda t, src: _measurement_frame(t, m.model, src),
                 MEASUREMENT_COLUMNS, m.metadata(), path, overwrite)


