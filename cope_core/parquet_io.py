"""Reading and writing the project's Parquet files: traces, profiles and measurements.

DESIGN §4 (``cope.trace/1``), §5 (``cope.profile/1``) and §8 (``cope.measurements/1``). This is
the only module that touches Parquet, so every malformed file fails the same way: one
:class:`~cope_core.errors.CopeInputError` line naming the file, the field, the first offending
row (0-based) and value, and what was expected. Writers run the same checks as readers, so a
file this module wrote always reads back.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import CopeInputError
from .files import atomic_path, check_writable, short_error as _short
from .geometry import ModelGeometry
from .matrix import CANDIDATE_IDS, EXECUTIONS
from .profile.data import (ATOMIC_PER_N, ATOMIC_SINGLE, COLUMNS as PROFILE_COLUMNS, KEY_COLUMNS,
                           KINDS, LAYER_NAMES, PREFETCH_NAMES, Profile, build_operating_point)
from .trace.data import SOURCES, Trace

TRACE_SCHEMA = "cope.trace/1"
PROFILE_SCHEMA = "cope.profile/1"
MEASUREMENTS_SCHEMA = "cope.measurements/1"
SCHEMAS = (TRACE_SCHEMA, PROFILE_SCHEMA, MEASUREMENTS_SCHEMA)
META_KEY = b"cope"

TRACE_COLUMNS: dict[str, str] = {"prompt": "int32", "token": "int32", "layer": "int16",
                                 "context": "int32", "routed": "list<int16>",
                                 "predicted": "list<int16>"}
MEASUREMENT_COLUMNS: dict[str, str] = {"candidate": "string", "prompt": "int32", "trial": "int32",
                                       "tpot_us": "float64", "K": "int32", "cpu_threads": "int16",
                                       "gpu_share": "float32"}
_ARROW = {"int16": pa.int16(), "int32": pa.int32(), "float32": pa.float32(),
          "float64": pa.float64(), "string": pa.string(), "list<int16>": pa.list_(pa.int16())}
_PROFILE_NAMES = {"shared": ("decode",), "schedule": tuple(e.value for e in EXECUTIONS),
                  "prefetch": PREFETCH_NAMES, "layer": LAYER_NAMES,
                  "atomic": ATOMIC_PER_N + ATOMIC_SINGLE}
#: Which index columns each profile kind uses; the others must hold the -1 sentinel.
_PROFILE_USES = {"shared": ("context",), "schedule": ("hits", "cpu", "staged"),
                 "prefetch": ("count",), "layer": (), "atomic": ("count",)}
_JSON_NAMES = {dict: "a JSON object", str: "a string", bool: "true or false", type(None): "null"}
_MEASUREMENT_KEY = ["candidate", "prompt", "trial", "K", "cpu_threads", "gpu_share"]


@dataclass(frozen=True, eq=False)
class Measurements:
    """Measured TPOT per candidate, prompt and trial (``cope.measurements/1``, DESIGN §8).

    ``table`` has the columns of :data:`MEASUREMENT_COLUMNS`; ``model`` is the geometry the
    reference executor ran; ``platform`` describes the machine (and says whether the
    accelerator was emulated); ``path`` is the file it was read from, for messages.
    """

    table: pd.DataFrame
    model: ModelGeometry
    platform: dict[str, Any]
    created: str = ""
    notes: str = ""
    path: str | None = field(default=None, compare=False)

    def metadata(self) -> dict[str, Any]:
        return {"schema": MEASUREMENTS_SCHEMA, "platform": self.platform,
                "model": self.model.to_dict(), "created": self.created, "notes": self.notes}


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
    want = f", expected a {expected} file" if expected else ""
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
    if expected and schema != expected:
        msg = (f"this is a {schema} file, expected {expected}" if schema in SCHEMAS
               else f"unsupported schema {schema!r}, expected {expected}")
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


def _read(path: str | os.PathLike, expected: str) -> tuple[pa.Table, dict, str, ModelGeometry]:
    pf, src = _open(path)
    meta = _parse_meta(pf, src, expected)
    try:
        table = pf.read()
    except (pa.ArrowException, OSError) as exc:
        raise CopeInputError(f"not a readable Parquet file ({_short(exc)})", source=src) from None
    return table, meta, src, ModelGeometry.from_dict(_meta_value(meta, "model", dict, src), src)


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


def detect_schema(path: str | os.PathLike) -> str:
    """The ``schema`` string of a COPE Parquet file, e.g. ``"cope.trace/1"``."""
    return read_metadata(path)["schema"]


# --- columns ------------------------------------------------------------------------------------
def _fit_int(values: np.ndarray, want: str, src: str, name: str,
             row_of: Callable[[int], int] = int) -> np.ndarray:
    """Cast integers to ``want``, failing on the first value that does not fit."""
    info = np.iinfo(want)
    bad = values > info.max
    if values.dtype.kind != "u":
        bad |= values < info.min
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CopeInputError(f"row {row_of(i)}: value {values[i]} does not fit {want}",
                             source=src, field=name)
    return values.astype(want, copy=False)


def _columns(table: pa.Table, spec: dict[str, str], schema: str, src: str) -> dict[str, Any]:
    """Check and cast every column of ``spec``; list columns come back as (offsets, values)."""
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
        if want == "string":
            ok = pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view"
        elif want.startswith("list"):
            # pandas infers list<null> for a column of empty lists: no ids, so nothing to cast;
            # a non-empty one fails below as a null id
            ok = ((pa.types.is_list(t) or pa.types.is_large_list(t)
                   or pa.types.is_fixed_size_list(t))
                  and (pa.types.is_integer(t.value_type) or pa.types.is_null(t.value_type)))
        elif want.startswith("float"):  # integers are exact numbers too; strings are not
            ok = pa.types.is_floating(t) or pa.types.is_integer(t)
        else:  # floats are refused even when whole: a float id means the writer got it wrong
            ok = pa.types.is_integer(t)
        if not ok:
            raise CopeInputError(f"column type {t}, expected {want}", source=src, field=name)
        if want == "string":
            out[name] = col.to_numpy(zero_copy_only=False).astype(object)
        elif want.startswith("list"):
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            flat = pc.list_flatten(col)

            def row_of(i: int, offsets: np.ndarray = offsets) -> int:
                return int(np.searchsorted(offsets, i, side="right") - 1)

            if flat.null_count:
                i = int(np.flatnonzero(pc.is_null(flat).to_numpy(zero_copy_only=False))[0])
                raise CopeInputError(f"row {row_of(i)}: null id inside the list, expected int16",
                                     source=src, field=name)
            values = flat.to_numpy(zero_copy_only=False) if len(flat) else np.zeros(0, np.int16)
            out[name] = (offsets, _fit_int(values, "int16", src, name, row_of))
        elif want.startswith("float"):
            out[name] = col.to_numpy(zero_copy_only=False).astype(want)
        else:
            out[name] = _fit_int(col.to_numpy(zero_copy_only=False), want, src, name)
    return out


def _check(bad: np.ndarray, src: str, name: str, describe: Callable[[int], str]) -> None:
    """Raise for the first True row of ``bad`` with ``describe(row)`` as the message."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CopeInputError(describe(i), source=src, field=name)


def _ids_at(lists: tuple[np.ndarray, np.ndarray], i: int) -> list[int]:
    offs, vals = lists
    return vals[offs[i]:offs[i + 1]].tolist()


def _id_lists(lists: tuple[np.ndarray, np.ndarray], E: int, src: str, name: str) -> np.ndarray:
    """Check that each row's ids are distinct and in 0..E-1; return them padded with -1."""
    offs, vals = lists
    lens, n = np.diff(offs), len(offs) - 1
    row = np.repeat(np.arange(n), lens)
    bad = np.zeros(n, bool)
    bad[row[(vals < 0) | (vals >= E)]] = True
    _check(bad, src, name, lambda i: f"row {i}: ids {_ids_at(lists, i)} out of range, "
           f"expected 0..{E - 1}")
    _check(lens > E, src, name, lambda i: f"row {i}: {lens[i]} ids, expected at most {E} "
           "distinct")  # so that W <= E below and the int16 fillers cannot overflow
    W = int(lens.max())
    padded = np.full((n, W), -1, np.int16)
    padded[row, np.arange(vals.size) - np.repeat(offs[:-1], lens)] = vals
    if W > 1:
        # Distinct negative fillers so that padding never reads as a duplicated id.
        s = np.sort(np.where(padded >= 0, padded, (-1 - np.arange(W)).astype(np.int16)), axis=1)
        _check((s[:, 1:] == s[:, :-1]).any(axis=1), src, name, lambda i: f"row {i}: duplicated "
               f"ids {_ids_at(lists, i)}, expected distinct ids")
    return padded


# --- traces -------------------------------------------------------------------------------------
def _trace_from_columns(c: dict[str, Any], g: ModelGeometry, src: str) -> dict[str, np.ndarray]:
    """Validate trace rows (DESIGN §4) and return the dense arrays a :class:`Trace` holds."""
    prompt, token, layer, ctx = c["prompt"], c["token"], c["layer"], c["context"]
    n, L, E, k = len(prompt), g.n_layers, g.n_experts, g.top_k
    if n == 0:
        raise CopeInputError("the trace has no rows, expected at least one decode token",
                             source=src, field="prompt")
    _check((layer < 0) | (layer >= L), src, "layer",
           lambda i: f"row {i}: layer {layer[i]} out of range, expected 0..{L - 1}")
    _check(ctx < 0, src, "context", lambda i: f"row {i}: context {ctx[i]}, expected >= 0")
    key = "row {} (prompt {}, token {}, layer {})"
    dp, dt, dl = (np.diff(a.astype(np.int64)) for a in (prompt, token, layer))
    back = (dp < 0) | ((dp == 0) & ((dt < 0) | ((dt == 0) & (dl < 0))))
    if back.any():
        i = int(np.flatnonzero(back)[0]) + 1
        name = "prompt" if dp[i - 1] < 0 else "token" if dt[i - 1] < 0 else "layer"
        raise CopeInputError(key.format(i, prompt[i], token[i], layer[i]) + " follows "
                             + key.format(i - 1, prompt[i - 1], token[i - 1], layer[i - 1])
                             + ", expected rows sorted by (prompt, token, layer)",
                             source=src, field=name)
    _check(np.r_[False, (dp == 0) & (dt == 0) & (dl == 0)], src, "layer",
           lambda i: key.format(i, prompt[i], token[i], layer[i]) + " duplicates the layer of "
           "the row before, expected each layer once per token")
    # Sorted and duplicate-free, so the layers of one token must equal their position 0..L-1.
    starts = np.flatnonzero(np.r_[True, (dp != 0) | (dt != 0)])
    sizes = np.diff(np.r_[starts, n])
    pos = np.arange(n) - np.repeat(starts, sizes)
    # A gap shows where layer != position; a cut-off token at its last row.
    cut = np.repeat(sizes != L, sizes) & (pos == np.repeat(sizes, sizes) - 1)
    _check((layer != pos) | cut, src, "layer", lambda i: key.format(i, prompt[i], token[i],
           layer[i]) + f": layer {pos[i] if layer[i] != pos[i] else layer[i] + 1} is missing, "
           f"expected layers 0..{L - 1} for every token")
    N = n // L
    tp = prompt[::L]
    pstarts = np.flatnonzero(np.r_[True, np.diff(tp) != 0])
    psizes = np.diff(np.r_[pstarts, N])
    tpos = np.repeat(np.arange(N) - np.repeat(pstarts, psizes), L)
    _check(token != tpos, src, "token", lambda i: f"row {i} (prompt {prompt[i]}): token "
           f"{token[i]}, expected {tpos[i]} (tokens count from 0 without gaps)")
    first = np.repeat(ctx[::L], L)
    _check(ctx != first, src, "context", lambda i: key.format(i, prompt[i], token[i], layer[i])
           + f": context {ctx[i]} differs from layer 0's {first[i]}, expected one per token")

    lens = np.diff(c["routed"][0])
    _check(lens != k, src, "routed", lambda i: f"row {i}: {lens[i]} ids, expected top_k = {k}")
    routed = _id_lists(c["routed"], E, src, "routed")
    lens = np.diff(c["predicted"][0])
    _check((layer == L - 1) & (lens > 0), src, "predicted", lambda i: f"row {i}: ids "
           f"{_ids_at(c['predicted'], i)} at the last layer {L - 1}, expected empty")
    pred = _id_lists(c["predicted"], E, src, "predicted")
    return {"prompt_ids": tp[pstarts].astype(np.int32),
            "prompt_start": np.r_[pstarts, N].astype(np.int64),
            "context": ctx[::L].astype(np.int32), "routed": routed.reshape(N, L, k),
            "predicted": pred.reshape(N, L, pred.shape[1])}


def read_trace(path: str | os.PathLike) -> Trace:
    """Read and fully validate a ``cope.trace/1`` file (DESIGN §4).

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    Trace
        ``predicted`` is padded with -1 to the longest list in the file. Anything that breaks
        the contract raises CopeInputError naming the field and the first offending row.
    """
    table, meta, src, g = _read(path, TRACE_SCHEMA)
    source = _meta_value(meta, "source", str, src)
    if source not in SOURCES:
        raise CopeInputError(f"got {source!r}, expected one of {list(SOURCES)}", source=src,
                             field="source")
    arrays = _trace_from_columns(_columns(table, TRACE_COLUMNS, TRACE_SCHEMA, src), g, src)
    return Trace(model=g, source=source, path=src,
                 description=_meta_value(meta, "description", str, src, ""),
                 predictor=_meta_value(meta, "predictor", (dict, type(None)), src, None), **arrays)


def _list_array(lengths: np.ndarray, values: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise CopeInputError("too many ids for one list<int16> column; split the trace",
                             field="routed")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                    pa.array(values, pa.int16()))


def write_trace(trace: Trace, path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Write a trace as ``cope.trace/1`` (atomic; see :func:`_write` for ``overwrite``).

    Parameters
    ----------
    trace : Trace
        Already validated (construction validates it). Prompts are written in ascending id
        order, as the format requires; each prompt's tokens keep their order.
    path : str or PathLike
    overwrite : bool
    """
    g = trace.model
    N, L, k = trace.n_tokens, g.n_layers, g.top_k
    ids, counts, perm = trace.prompt_ids, trace.tokens_per_prompt, slice(None)
    if (np.diff(ids) < 0).any():
        # The file is sorted by prompt id: move whole prompts, keeping each one's token order.
        order = np.argsort(ids, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        perm = np.argsort(np.repeat(rank, counts), kind="stable")
        ids, counts = ids[order], counts[order]
    token = np.arange(N) - np.repeat(np.r_[0, np.cumsum(counts)[:-1]], counts)
    pred = trace.predicted[perm].reshape(N * L, -1)
    valid = pred >= 0  # padding is a suffix (Trace.validate), so row-major order keeps ranks
    table = pa.table({
        "prompt": pa.array(np.repeat(np.repeat(ids, counts), L), pa.int32()),
        "token": pa.array(np.repeat(token, L), pa.int32()),
        "layer": pa.array(np.tile(np.arange(L), N), pa.int16()),
        "context": pa.array(np.repeat(trace.context[perm], L), pa.int32()),
        "routed": _list_array(np.full(N * L, k), trace.routed[perm].reshape(-1)),
        "predicted": _list_array(valid.sum(axis=1), pred[valid]),
    })
    _write(table, trace.metadata(), path, overwrite)


# --- profiles -----------------------------------------------------------------------------------
def _check_costs(c: dict[str, Any], src: str, cost_cols: tuple[str, ...], positive: bool) -> None:
    for name in cost_cols:
        v = c[name]
        sign = "positive" if positive else "non-negative"
        _check(~np.isfinite(v) | ((v <= 0) if positive else (v < 0)), src, name,
               lambda i: f"row {i}: {float(v[i])!r}, expected a finite {sign} number of "
               "microseconds")


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


def _profile_frame(table: pa.Table, top_k: int, src: str) -> pd.DataFrame:
    """Validate profile rows (DESIGN §5) and every operating point's completeness."""
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
    for col in ("hits", "cpu", "staged", "count", "context"):
        v = c[col]
        uses = np.isin(kind, [kd for kd, cols in _PROFILE_USES.items() if col in cols])
        _check(np.where(uses, v < 0, v != -1), src, col, lambda i: f"row {i} (kind {kind[i]}): "
               f"{v[i]}, expected " + (">= 0" if uses[i] else f"-1 (unused by kind {kind[i]})"))
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


def read_profile(path: str | os.PathLike) -> Profile:
    """Read a ``cope.profile/1`` file, checking every row and every operating point (DESIGN §5).

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
    return Profile(table=_profile_frame(table, g.top_k, src), model=g, **_about(meta, src),
                   analytic=_meta_value(meta, "analytic", bool, src, False), path=src)


def write_profile(profile: Profile, path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Validate and write a profile as ``cope.profile/1`` (atomic; see :func:`_write`).

    Parameters
    ----------
    profile : Profile
        Its table may use any integer/float widths that fit; they are cast to the contract.
    path : str or PathLike
    overwrite : bool
    """
    _write_frame(profile.table, lambda t, src: _profile_frame(t, profile.model.top_k, src),
                 PROFILE_COLUMNS, profile.metadata(), path, overwrite)


# --- measurements -------------------------------------------------------------------------------
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
    """Read and validate a ``cope.measurements/1`` file (DESIGN §8).

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
    return Measurements(table=_measurement_frame(table, g, src), model=g, **_about(meta, src),
                        path=src)


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


# --- writing -----------------------------------------------------------------------------------
def _write(table: pa.Table, meta: dict[str, Any], path: str | os.PathLike, overwrite: bool) -> None:
    """Write ``table`` with ``meta`` under the ``cope`` key, atomically (:mod:`cope_core.files`).

    An existing file is an error unless ``overwrite``; parent directories are created.
    """
    src = str(path)
    check_writable(path, overwrite=overwrite)
    try:
        text = json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CopeInputError(f"metadata is not plain JSON ({_short(exc)})", source=src,
                             field="cope") from None
    table = table.replace_schema_metadata({META_KEY: text.encode()})
    with atomic_path(path, overwrite=overwrite, errors=(pa.ArrowException,)) as tmp:
        pq.write_table(table, tmp)
