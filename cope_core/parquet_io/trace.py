"""``cope.trace/1`` files (docs/formats.md): one row per (prompt, decode token, MoE layer)."""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CopeInputError
from ..files import atomic_path, check_writable
from ..trace.data import Trace
from ._common import META_KEY, meta_bytes
from ._trace_read import TRACE_COLUMNS, Outputs, open_parts, prompt_runs, read_part

__all__ = ["TRACE_COLUMNS", "read_trace", "trace_prompts", "write_trace", "write_trace_parts"]


def read_trace(path: str | os.PathLike, *, prompts: np.ndarray | None = None) -> Trace:
    """Read and fully validate a ``cope.trace/1`` file, or a folder of them read as one trace
    (docs/formats.md#routing-trace-copetrace1).

    Parameters
    ----------
    path : str or PathLike
        A Parquet file, or a folder whose ``*.parquet`` files are shards of one trace: same
        model, source and predictor, each prompt in one file. Shards are read in name order.
    prompts : array of int, optional
        Keep only these prompt ids (every row is still checked). Ids not in the trace are an
        error.

    Returns
    -------
    Trace
        ``predicted`` is padded with -1 to the longest list. Anything that breaks the contract
        raises CopeInputError naming the file, the field and the first offending row.
    """
    parts, src = open_parts(path)
    first = parts[0]
    g = first.model
    rows = sum(p.rows for p in parts)
    keep = None
    if prompts is not None:
        keep = np.unique(np.asarray(prompts, dtype=np.int64))
        found = [prompt_runs(p) for p in parts]
        ids = np.concatenate([f[0] for f in found])
        counts = np.concatenate([f[1] for f in found])
        missing = np.setdiff1d(keep, ids)
        if missing.size:
            raise CopeInputError(f"prompt {int(missing[0])} is not in the trace", source=src,
                                 field="prompt")
        rows = int(counts[np.isin(ids, keep)].sum())
    if rows == 0:
        raise CopeInputError("the trace has no rows, expected at least one decode token",
                             source=src, field="prompt")
    out = Outputs.allocate(rows, rows // g.n_layers + len(parts), g.top_k)
    owner: list[tuple[np.ndarray, str]] = []
    for part in parts:
        owner.append((read_part(part, out, keep), part.src))
    if len(parts) > 1:
        _one_file_per_prompt(owner)
    N = out.token
    tp = out.tok_prompt[:N]
    pstarts = np.flatnonzero(np.r_[True, tp[1:] != tp[:-1]])
    L, W = g.n_layers, out.predicted.shape[1]
    return Trace(model=g, source=first.source, path=src, description=first.description,
                 predictor=first.predictor, prompt_ids=tp[pstarts].astype(np.int32),
                 prompt_start=np.r_[pstarts, N].astype(np.int64),
                 context=out.tok_ctx[:N].astype(np.int32),
                 routed=out.routed[:out.row].reshape(N, L, g.top_k),
                 predicted=out.predicted[:out.row].reshape(N, L, W))


def _one_file_per_prompt(owner: list[tuple[np.ndarray, str]]) -> None:
    ids = np.concatenate([o[0] for o in owner])
    which = np.concatenate([np.full(len(o[0]), i) for i, o in enumerate(owner)])
    order = np.argsort(ids, kind="stable")
    ids, which = ids[order], which[order]
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        i = int(dup[0])
        a, b = owner[which[i]][1], owner[which[i + 1]][1]
        raise CopeInputError(f"prompt {int(ids[i])} is also in {a}, expected each prompt in one "
                             "file of the folder", source=b, field="prompt")


def trace_prompts(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Prompt ids of a trace file or folder in reading order, with their row counts.

    Reads only the ``prompt`` column (fast, little memory); the rows themselves are checked
    when the prompts are read with :func:`read_trace`.
    """
    parts, _ = open_parts(path)
    found = [prompt_runs(p) for p in parts]
    return (np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found]))


def _list_array(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    if offsets[-1] >= 2**31:
        raise CopeInputError("too many ids for one list<int16> column; split the trace",
                             field="routed")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32, copy=False)),
                                    pa.array(values, pa.int16()))


ROW_GROUP_ROWS = 1 << 20  # rows per Parquet row group: what one streaming read step holds


def _table(trace: Trace) -> pa.Table:
    """The rows of ``trace`` sorted by prompt id (whole prompts move, tokens keep their order)."""
    g = trace.model
    N, L, k = trace.n_tokens, g.n_layers, g.top_k
    ids, counts = trace.prompt_ids, trace.tokens_per_prompt
    perm: slice | np.ndarray = slice(None)
    if (np.diff(ids) < 0).any():
        order = np.argsort(ids, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        perm = np.argsort(np.repeat(rank, counts), kind="stable")
        ids, counts = ids[order], counts[order]
    token = np.arange(N) - np.repeat(np.r_[0, np.cumsum(counts)[:-1]], counts)
    pred = np.ascontiguousarray(trace.predicted[perm]).reshape(N * L, -1)
    offsets = np.empty(N * L + 1, np.int64)
    values = np.empty(pred.size, np.int16)
    from ._trace_kernels import _compact  # numba loads with the first kernel (_trace_read)
    used = _compact(pred, offsets, values)
    return pa.table({
        "prompt": pa.array(np.repeat(np.repeat(ids, counts), L), pa.int32()),
        "token": pa.array(np.repeat(token, L), pa.int32()),
        "layer": pa.array(np.tile(np.arange(L, dtype=np.int16), N), pa.int16()),
        "context": pa.array(np.repeat(trace.context[perm], L), pa.int32()),
        "routed": _list_array(np.arange(N * L + 1, dtype=np.int64) * k,
                              np.ascontiguousarray(trace.routed[perm]).reshape(-1)),
        "predicted": _list_array(offsets, values[:used]),
    })


def write_trace(trace: Trace, path: str | os.PathLike, *, overwrite: bool = False,
                row_group_rows: int = ROW_GROUP_ROWS) -> None:
    """Write a trace as ``cope.trace/1`` (atomic; an existing file needs ``overwrite``).

    Parameters
    ----------
    trace : Trace
        Already validated (construction validates it). Prompts are written in ascending id
        order, as the format requires; each prompt's tokens keep their order.
    path : str or PathLike
    overwrite : bool
    row_group_rows : int
        Rows per Parquet row group.
    """
    write_trace_parts([trace], path, overwrite=overwrite, row_group_rows=row_group_rows)


def _one_ahead(parts: Iterable[Trace]) -> Iterator[Trace]:
    """The parts, the next one made on a helper thread while the caller writes this one."""
    it = iter(parts)
    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = pool.submit(next, it, None)
        while (part := ahead.result()) is not None:
            ahead = pool.submit(next, it, None)
            yield part


def write_trace_parts(parts: Iterable[Trace], path: str | os.PathLike, *,
                      overwrite: bool = False, row_group_rows: int = ROW_GROUP_ROWS) -> None:
    """Write consecutive parts of one trace to one ``cope.trace/1`` file, part by part, so only
    one part is ever in memory (e.g. :func:`cope_core.trace.synth.synthesize_parts`).

    Parameters
    ----------
    parts : iterable of Trace
        Same metadata (model, source, description, predictor); each part's prompt ids all
        above the previous part's. Anything else is a CopeInputError and nothing is written.
    path, overwrite, row_group_rows
        As :func:`write_trace`.
    """
    src = str(path)
    check_writable(path, overwrite=overwrite)
    meta = schema = None
    top = -1
    with atomic_path(path, overwrite=overwrite, errors=(pa.ArrowException,)) as tmp:
        writer = None
        try:
            for part in _one_ahead(parts):
                if meta is None:
                    meta = part.metadata()
                elif part.metadata() != meta:
                    raise CopeInputError("parts of one trace differ in their metadata, expected "
                                         "the same model, source, description and predictor",
                                         source=src, field="cope")
                if part.prompt_ids.min() <= top:
                    raise CopeInputError(f"a part starts at prompt {part.prompt_ids.min()} after "
                                         f"prompt {top}, expected ascending prompt ids across "
                                         "parts", source=src, field="prompt")
                top = int(part.prompt_ids.max())
                table = _table(part)
                if writer is None:
                    schema = table.schema.with_metadata({META_KEY: meta_bytes(meta, src)})
                    writer = pq.ParquetWriter(tmp, schema)
                writer.write_table(table.cast(schema), row_group_size=row_group_rows)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise CopeInputError("no parts to write, expected at least one", source=src)
