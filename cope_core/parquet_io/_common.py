"""What every COPE Parquet file shares: opening, the ``cope`` metadata, typed columns, first-bad-row
checks, and the validated atomic write (:mod:`cope_core.files`)."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import CopeInputError
from ..files import atomic_path, check_writable
from ..files import short_error as _short
from ..geometry import ModelGeometry
from ..measurements import MEASUREMENTS_SCHEMA
from ..profile.data import PROFILE_SCHEMA, PROFILE_SCHEMAS
from ..trace.data import TRACE_SCHEMA

# each record owns its schema id; the files' readers and writers take them from there
SCHEMAS = (TRACE_SCHEMA, *PROFILE_SCHEMAS, MEASUREMENTS_SCHEMA)


def schema_family(schema: str) -> str:
    """The schema a file is read as: any profile version reads as the current one."""
    return PROFILE_SCHEMA if schema in PROFILE_SCHEMAS else schema
META_KEY = b"cope"

_ARROW = {"int16": pa.int16(), "int32": pa.int32(), "float32": pa.float32(),
          "float64": pa.float64(), "string": pa.string(), "list<int16>": pa.list_(pa.int16())}
_JSON_NAMES = {dict: "a JSON object", str: "a string", bool: "true or false", type(None): "null"}


# --- opening and metadata -----------------------------------------------------------------------
def _open(path: str | os.PathLike) -> tuple[pq.ParquetFile, str]:
    src = str(path)
    if not os.path.exists(src):
        raise CopeInputError("file not found", source=src)
    if not os.path.isfile(src):
        raise CopeInputError("is not a file, expected a Parquet file", source=src)
    try:
        return pq.ParquetFile(src), src
    except (pa.ArrowException, OSError) as exc:
        raise CopeInputError(f"not a readable Parquet file ({_short(exc)})", source=src) from None


def _parse_meta(pf: pq.ParquetFile, src: str, expected: str | None) -> dict[str, Any]:
    raw = (pf.metadata.metadata or {}).get(META_KEY)
    named = " or ".join(reversed(PROFILE_SCHEMAS)) if expected == PROFILE_SCHEMA else expected
    want = f", expected a {named} file" if expected else ""
    if raw is None:
        raise CopeInputError(f"no 'cope' key in the Parquet file metadata{want}", source=src,
                             field="cope")
    try:
        meta = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise CopeInputError(f"metadata is not valid JSON ({_short(exc)})", source=src,
                             field="cope") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("schema"), str):
        raise CopeInputError("expected a JSON object with a string 'schema'", source=src,
                             field="cope.schema")
    schema = meta["schema"]
    if expected and schema_family(schema) != expected:
        msg = (f"this is a {schema} file, expected {named}" if schema in SCHEMAS
               else f"unsupported schema {schema!r}, expected {named}")
        raise CopeInputError(msg, source=src, field="schema")
    return meta


def _meta_value(meta: dict, key: str, types: type | tuple, src: str, default: Any = ...) -> Any:
    if key not in meta:
        if default is ...:
            raise CopeInputError(f"missing key '{key}' in the 'cope' metadata", source=src,
                                 field=key)
        return default
    value = meta[key]
    if not isinstance(value, types):
        names = " or ".join(_JSON_NAMES[t] for t in (types if isinstance(types, tuple)
                                                       else (types,)))
        raise CopeInputError(f"got {value!r:.60}, expected {names}", source=src, field=key)
    return value


def _open_checked(path: str | os.PathLike,
                  expected: str) -> tuple[pq.ParquetFile, dict, str, ModelGeometry]:
    """Open a COPE file of schema ``expected``: its reader, metadata, name and model geometry."""
    pf, src = _open(path)
    meta = _parse_meta(pf, src, expected)
    return pf, meta, src, ModelGeometry.from_dict(_meta_value(meta, "model", dict, src), src)


def _read(path: str | os.PathLike, expected: str) -> tuple[pa.Table, dict, str, ModelGeometry]:
    pf, meta, src, g = _open_checked(path, expected)
    try:
        table = pf.read()
    except (pa.ArrowException, OSError) as exc:
        raise CopeInputError(f"not a readable Parquet file ({_short(exc)})", source=src) from None
    return table, meta, src, g


def _about(meta: dict, src: str) -> dict[str, Any]:
    """The platform description and free-text fields profiles and measurements share."""
    return {"platform": _meta_value(meta, "platform", dict, src),
            "created": _meta_value(meta, "created", str, src, ""),
            "notes": _meta_value(meta, "notes", str, src, "")}


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """Parsed ``cope`` metadata of any COPE Parquet file.

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    dict
        The JSON object; it always has a string ``"schema"``. Raises CopeInputError for a
        missing or unreadable file, no ``cope`` key or invalid JSON.
    """
    pf, src = _open(path)
    return _parse_meta(pf, src, None)


_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def decoded_bytes(path: str | os.PathLike) -> int:
    """What reading the file will hold in memory, from its footer alone (before reading it):
    every value of every column at its physical width, list offsets, and byte strings at their
    uncompressed size. Encodings that store repeats in a few bytes (run lengths, dictionaries)
    do not shrink it: this is what the values take once decoded."""
    pf, _ = _open(path)
    md = pf.metadata
    total = 0
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            width = _WIDTH.get(col.physical_type)
            total += (col.num_values * width if width is not None
                      else col.total_uncompressed_size)
            if ".list." in f".{col.path_in_schema}.":
                total += 4 * rg.num_rows            # a list column's offsets
    return int(total)


def detect_schema(path: str | os.PathLike) -> str:
    """The ``schema`` string of a COPE Parquet file, e.g. ``"cope.trace/1"``."""
    return read_metadata(path)["schema"]


# --- columns ------------------------------------------------------------------------------------
def _first_unfit(values: np.ndarray, want: str) -> int:
    """Index of the first integer that does not fit ``want``, or -1."""
    if values.dtype == np.dtype(want) or values.size == 0:
        return -1
    info = np.iinfo(want)
    bad = values > info.max
    if values.dtype.kind != "u":
        bad |= values < info.min
    return int(np.argmax(bad)) if bad.any() else -1


def _fit_int(values: np.ndarray, want: str, src: str, name: str,
             row_of: Callable[[int], int] = int) -> np.ndarray:
    """Cast integers to ``want``, failing on the first value that does not fit."""
    i = _first_unfit(values, want)
    if i >= 0:
        raise CopeInputError(f"row {row_of(i)}: value {values[i]} does not fit {want}",
                             source=src, field=name)
    return values.astype(want, copy=False)


def _type_ok(t: pa.DataType, want: str) -> bool:
    """Whether a column of Arrow type ``t`` (dictionaries already decoded) can hold ``want``."""
    if want == "string":
        return pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view"
    if want.startswith("list"):
        # pandas infers list<null> for a column of empty lists: no ids, so nothing to cast;
        # a non-empty one fails later as a null id
        return ((pa.types.is_list(t) or pa.types.is_large_list(t)
                 or pa.types.is_fixed_size_list(t))
                and (pa.types.is_integer(t.value_type) or pa.types.is_null(t.value_type)))
    if want.startswith("float"):  # integers are exact numbers too; strings are not
        return pa.types.is_floating(t) or pa.types.is_integer(t)
    # floats are refused even when whole: a float id means the writer got it wrong
    return pa.types.is_integer(t)


def _columns(table: pa.Table, spec: dict[str, str], schema: str, src: str) -> dict[str, Any]:
    """Check and cast every column of ``spec`` (scalar and string columns: traces, whose id
    lists need streaming, have their own reader in :mod:`._trace_read`)."""
    missing = [c for c in spec if c not in table.column_names]
    if missing:
        raise CopeInputError(f"missing column(s) {missing}; a {schema} file has columns "
                             f"{list(spec)}", source=src, field=missing[0])
    out: dict[str, Any] = {}
    for name, want in spec.items():
        col, t = table.column(name), table.schema.field(name).type
        if col.null_count:
            row = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
            raise CopeInputError(f"row {row} is null, expected {want}", source=src, field=name)
        if pa.types.is_dictionary(t):  # pandas categoricals arrive dictionary-encoded
            col, t = col.cast(t.value_type), t.value_type
        ok = _type_ok(t, want)
        if not ok:
            raise CopeInputError(f"column type {t}, expected {want}", source=src, field=name)
        if want == "string":
            out[name] = col.to_numpy(zero_copy_only=False).astype(object)
        elif want.startswith("float"):
            out[name] = col.to_numpy(zero_copy_only=False).astype(want)
        else:
            out[name] = _fit_int(col.to_numpy(zero_copy_only=False), want, src, name)
    return out


def _check(bad: np.ndarray, src: str, name: str, describe: Callable[..., str]) -> None:
    """Raise for the first True row of ``bad`` with ``describe(row)`` as the message."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CopeInputError(describe(i), source=src, field=name)


def _check_costs(c: dict[str, Any], src: str, cost_cols: tuple[str, ...], positive: bool) -> None:
    for name in cost_cols:
        v = c[name]
        sign = "positive" if positive else "non-negative"
        _check(~np.isfinite(v) | ((v <= 0) if positive else (v < 0)), src, name,
               lambda i, v=v, sign=sign: f"row {i}: {float(v[i])!r}, expected a finite "
               f"{sign} number of microseconds")


def _check_operating_point(c: dict[str, Any], src: str) -> None:
    th, gs = c["cpu_threads"], c["gpu_share"]
    _check(th < 1, src, "cpu_threads", lambda i: f"row {i}: {th[i]}, expected >= 1")
    _check(~np.isfinite(gs) | (gs <= 0) | (gs > 100), src, "gpu_share",
           lambda i: f"row {i}: {float(gs[i])!r}, expected a percentage in (0, 100]")


def _first_duplicate(df: pd.DataFrame, key: list[str], src: str, field_name: str) -> None:
    dup = df.duplicated(subset=key, keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        same = (df[key] == df[key].iloc[i]).all(axis=1).to_numpy()
        j = int(np.flatnonzero(same)[0])
        values = tuple(x.item() if isinstance(x, np.generic) else x for x in df[key].iloc[i])
        raise CopeInputError(f"row {i} repeats row {j}: same ({', '.join(key)}) = {values}, "
                             "expected each key once", source=src, field=field_name)


def _write_frame(df: pd.DataFrame, check: Callable[[pa.Table, str], pd.DataFrame],
                 spec: dict[str, str], meta: dict, path: str | os.PathLike,
                 overwrite: bool) -> None:
    """Run the reader's checks on an in-memory table, then write it with the exact types."""
    src = str(path)
    try:
        loose = pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise CopeInputError(f"table cannot be stored ({_short(exc)})", source=src) from None
    df = check(loose, src)
    _write(pa.table({c: pa.array(df[c].to_numpy(), _ARROW[t]) for c, t in spec.items()}), meta,
           path, overwrite)


# --- writing -----------------------------------------------------------------------------------
def meta_bytes(meta: dict[str, Any], src: str) -> bytes:
    """The ``cope`` metadata as strict JSON, or a one-line error for what JSON cannot hold."""
    try:
        return json.dumps(meta, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise CopeInputError(f"metadata is not plain JSON ({_short(exc)})", source=src,
                             field="cope") from None


def _write(table: pa.Table, meta: dict[str, Any], path: str | os.PathLike, overwrite: bool) -> None:
    """Write ``table`` with ``meta`` under the ``cope`` key, atomically (:mod:`cope_core.files`).

    An existing file is an error unless ``overwrite``; parent directories are created.
    """
    check_writable(path, overwrite=overwrite)
    table = table.replace_schema_metadata({META_KEY: meta_bytes(meta, str(path))})
    with atomic_path(path, overwrite=overwrite, errors=(pa.ArrowException,)) as tmp:
        pq.write_table(table, tmp)
