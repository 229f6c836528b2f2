"""``cope.trace/1`` files (docs/formats.md): one row per (prompt, decode token, MoE layer)."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..trace.data import SOURCES, Trace
from ._common import TRACE_SCHEMA, _check, _columns, _meta_value, _read, _write

TRACE_COLUMNS: dict[str, str] = {"prompt": "int32", "token": "int32", "layer": "int16",
                                 "context": "int32", "routed": "list<int16>",
                                 "predicted": "list<int16>"}


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


def _trace_from_columns(c: dict[str, Any], g: ModelGeometry, src: str) -> dict[str, np.ndarray]:
    """Validate trace rows (docs/formats.md#routing-trace-copetrace1) and return the dense
    arrays a :class:`Trace` holds."""
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
    """Read and fully validate a ``cope.trace/1`` file (docs/formats.md#routing-trace-copetrace1).

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


