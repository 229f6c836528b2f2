"""Streaming reader of ``cope.trace/1`` files and of folders of them (shards).

One Parquet row group is decoded at a time and its rows are checked and copied straight into the
preallocated arrays of the :class:`Trace`, so the peak memory is the trace itself plus one row
group, never a whole decoded table or a per-row Python object. Every check of
docs/formats.md#routing-trace-copetrace1 runs on every row, with the messages of a whole-file
check: each problem kind keeps its first offending row and the kinds are reported in a fixed
order (column values, then row structure, then ``routed``, then ``predicted``).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import CopeInputError
from ..files import short_error
from ..geometry import ModelGeometry
from ..trace.data import SOURCES
from ._common import TRACE_SCHEMA, _first_unfit, _meta_value, _open_checked, _type_ok

TRACE_COLUMNS: dict[str, str] = {"prompt": "int32", "token": "int32", "layer": "int16",
                                 "context": "int32", "routed": "list<int16>",
                                 "predicted": "list<int16>"}
_SCALARS = ("prompt", "token", "layer", "context")
_KEY = "row {} (prompt {}, token {}, layer {})"


@dataclass
class Part:
    """One file of a trace: its reader, name, rows and the metadata every shard must share."""

    pf: pq.ParquetFile
    src: str
    rows: int
    model: ModelGeometry
    source: str
    description: str
    predictor: dict | None


@dataclass
class _Errors:
    """First message per (stage, kind); the smallest key is reported."""

    found: dict[tuple, tuple[str, str]] = field(default_factory=dict)

    def add(self, key: tuple, message: str, name: str) -> None:
        self.found.setdefault(key, (message, name))

    def raise_first(self, src: str) -> None:
        if self.found:
            message, name = self.found[min(self.found)]
            raise CopeInputError(message, source=src, field=name)


def open_part(path: str) -> Part:
    pf, meta, src, g = _open_checked(path, TRACE_SCHEMA)
    source = _meta_value(meta, "source", str, src)
    if source not in SOURCES:
        raise CopeInputError(f"got {source!r}, expected one of {list(SOURCES)}", source=src,
                             field="source")
    schema = pf.schema_arrow
    missing = [c for c in TRACE_COLUMNS if c not in schema.names]
    if missing:
        raise CopeInputError(f"missing column(s) {missing}; a {TRACE_SCHEMA} file has columns "
                             f"{list(TRACE_COLUMNS)}", source=src, field=missing[0])
    for name, want in TRACE_COLUMNS.items():
        t = schema.field(name).type
        if pa.types.is_dictionary(t):  # pandas categoricals arrive dictionary-encoded
            t = t.value_type
        if not _type_ok(t, want):
            raise CopeInputError(f"column type {t}, expected {want}", source=src, field=name)
    return Part(pf, src, pf.metadata.num_rows, g, source,
                _meta_value(meta, "description", str, src, ""),
                _meta_value(meta, "predictor", (dict, type(None)), src, None))


def open_parts(path: str | os.PathLike) -> tuple[list[Part], str]:
    """The file, or the ``*.parquet`` files of a folder in name order, checked to agree."""
    src = str(path)
    if not os.path.isdir(src):
        return [open_part(src)], src
    names = sorted(n for n in os.listdir(src) if n.endswith(".parquet")
                   and os.path.isfile(os.path.join(src, n)))
    if not names:
        raise CopeInputError("folder holds no .parquet files, expected a cope.trace/1 file or a "
                             "folder of them", source=src)
    parts = [open_part(os.path.join(src, n)) for n in names]
    first = parts[0]
    for p in parts[1:]:
        for name, mine, theirs in (("model", p.model, first.model),
                                   ("source", p.source, first.source),
                                   ("predictor", p.predictor, first.predictor)):
            if mine != theirs:
                raise CopeInputError(f"{_shown(mine)} differs from {_shown(theirs)} in "
                                     f"{first.src}, expected the shards of one trace to agree",
                                     source=p.src, field=name)
    return parts, src


def _shown(v: object) -> str:
    return v.name if isinstance(v, ModelGeometry) else repr(v)


def _batches(part: Part, columns: list[str]):
    """Record batches of one file with their first row. The next row group is decoded on a
    helper thread while the caller checks this one (Arrow and the kernels release the GIL), so
    at most two row groups are in memory."""
    def read(rg: int) -> pa.Table:
        return part.pf.read_row_group(rg, columns=columns)

    base, n = 0, part.pf.num_row_groups
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            ahead = pool.submit(read, 0) if n else None
            for rg in range(n):
                assert ahead is not None          # one future per row group
                table = ahead.result()
                ahead = pool.submit(read, rg + 1) if rg + 1 < n else None
                for batch in table.to_batches():
                    yield base, batch
                    base += batch.num_rows
                del table
    except (pa.ArrowException, OSError) as exc:
        raise CopeInputError(f"not a readable Parquet file ({short_error(exc)})",
                             source=part.src) from None


def _scalar(arr: pa.Array, name: str, base: int, errs: _Errors, stage: int) -> np.ndarray | None:
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    want = TRACE_COLUMNS[name]
    if arr.null_count:
        j = int(np.argmax(pc.is_null(arr).to_numpy(zero_copy_only=False)))
        errs.add((0, stage, base + j), f"row {base + j} is null, expected {want}", name)
        return None
    v = arr.to_numpy(zero_copy_only=False)
    j = _first_unfit(v, want)
    if j >= 0:
        errs.add((0, stage, base + j), f"row {base + j}: value {v[j]} does not fit {want}", name)
        return None
    return v


def _list(arr: pa.Array, name: str, base: int, errs: _Errors,
          stage: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(offsets from 0, values) of a list column's batch, or None after noting a problem."""
    if arr.null_count:
        j = int(np.argmax(pc.is_null(arr).to_numpy(zero_copy_only=False)))
        errs.add((0, stage, base + j), f"row {base + j} is null, expected list<int16>", name)
        return None
    if pa.types.is_fixed_size_list(arr.type):
        child = arr.flatten()
        offs = np.arange(len(arr) + 1, dtype=np.int64) * arr.type.list_size
    else:
        raw = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        child = arr.values.slice(raw[0], raw[-1] - raw[0])
        offs = raw - raw[0]
    if child.null_count:
        i = int(np.argmax(pc.is_null(child).to_numpy(zero_copy_only=False)))
        j = int(np.searchsorted(offs, i, side="right") - 1)
        errs.add((0, stage, base + j), f"row {base + j}: null id inside the list, expected "
                 "int16", name)
        return None
    vals = child.to_numpy(zero_copy_only=False) if len(child) else np.zeros(0, np.int16)
    i = _first_unfit(vals, "int16")
    if i >= 0:
        j = int(np.searchsorted(offs, i, side="right") - 1)
        errs.add((0, stage, base + j), f"row {base + j}: value {vals[i]} does not fit int16",
                 name)
        return None
    return offs, vals


def _row_messages(first: np.ndarray, info: np.ndarray, L: int, errs: _Errors) -> None:
    from . import _trace_kernels as K  # numba loads with the first kernel (see read_part)
    says: dict[int, tuple[str, Callable[[int, list], str] | None]] = {
        K.LAYER_RANGE: ("layer", lambda i, a: f"row {i}: layer {a[0]} out of range, expected "
                        f"0..{L - 1}"),
        K.CONTEXT_NEGATIVE: ("context", lambda i, a: f"row {i}: context {a[0]}, expected >= 0"),
        K.DUPLICATE_LAYER: ("layer", None),
        K.MISSING_LAYER: ("layer", lambda i, a: _KEY.format(i, a[0], a[1], a[2]) + f": layer "
                          f"{a[3]} is missing, expected layers 0..{L - 1} for every token"),
        K.TOKEN_GAP: ("token", lambda i, a: f"row {i} (prompt {a[0]}): token {a[1]}, expected "
                      f"{a[2]} (tokens count from 0 without gaps)"),
        K.CONTEXT_CHANGES: ("context", lambda i, a: _KEY.format(i, a[0], a[1], a[2]) + f": "
                            f"context {a[3]} differs from layer 0's {a[4]}, expected one per "
                            "token"),
    }
    for kind in range(K.N_KINDS):
        i = int(first[kind])
        if i < 0:
            continue
        a = info[kind].tolist()
        if kind == K.UNSORTED:
            name = ("prompt", "token", "layer")[a[0]]
            errs.add((1, kind, i), _KEY.format(i, a[4], a[5], a[6]) + " follows "
                     + _KEY.format(i - 1, a[1], a[2], a[3]) + ", expected rows sorted by (prompt, "
                     "token, layer)", name)
        elif kind == K.DUPLICATE_LAYER:
            errs.add((1, kind, i), _KEY.format(i, a[0], a[1], a[2]) + " duplicates the layer of "
                     "the row before, expected each layer once per token", "layer")
        else:
            name, text = says[kind]
            assert text is not None               # the two kinds without one are handled above
            errs.add((1, kind, i), text(i, a), name)


@dataclass
class Outputs:
    """Arrays being filled: ``rows`` of ids, per-token prompt and context, and where we are."""

    routed: np.ndarray
    predicted: np.ndarray
    tok_prompt: np.ndarray
    tok_ctx: np.ndarray
    row: int = 0
    token: int = 0

    @classmethod
    def allocate(cls, rows: int, tokens: int, k: int) -> Outputs:
        return cls(np.empty((rows, k), np.int16), np.empty((rows, 0), np.int16),
                   np.empty(tokens, np.int64), np.empty(tokens, np.int64))

    def widen(self, W: int) -> None:
        if W > self.predicted.shape[1]:
            wider = np.full((self.predicted.shape[0], W), -1, np.int16)
            wider[:self.row, :self.predicted.shape[1]] = self.predicted[:self.row]
            self.predicted = wider


def read_part(part: Part, out: Outputs, keep: np.ndarray | None) -> np.ndarray:
    """Check every row of ``part`` and append its (kept) rows to ``out``; raise its first problem.

    ``keep``: sorted prompt ids to copy (None: all of them). Returns the ids of every prompt
    in the file, kept or not (sorted), for the one-file-per-prompt check of a folder.
    """
    # numba (about 0.3 s) loads with the first kernel, not with the package: a server answering
    # from its disk cache (cope_core/app/persisted.py) reads no trace
    from . import _trace_kernels as K
    g, src = part.model, part.src
    L, E, k = g.n_layers, g.n_experts, g.top_k
    if part.rows == 0:
        return np.zeros(0, np.int64)
    errs = _Errors()
    st = np.zeros(K.N_STATE, np.int64)
    first = np.full(K.N_KINDS, -1, np.int64)
    info = np.zeros((K.N_KINDS, 7), np.int64)
    cap = part.rows // L + 1
    tok_p, tok_c = np.empty(cap, np.int64), np.empty(cap, np.int64)
    seen = {"routed": np.full(E, -1, np.int64), "predicted": np.full(E, -1, np.int64)}
    # (stage, rank) of each list problem: routed's lengths (rank 0) come before its ids
    order = {"routed": (2, {K.LIST_RANGE: 1, K.LIST_DUPLICATE: 3}),
             "predicted": (3, {K.LIST_LAST_LAYER: 0, K.LIST_RANGE: 1, K.LIST_TOO_LONG: 2,
                               K.LIST_DUPLICATE: 3})}
    bad_values = bad_lists = False
    for base, batch in _batches(part, list(TRACE_COLUMNS)):
        m = batch.num_rows
        cols = [_scalar(batch.column(n), n, base, errs, s) for s, n in enumerate(_SCALARS)]
        lists = [_list(batch.column(n), n, base, errs, 4 + s)
                 for s, n in enumerate(("routed", "predicted"))]
        bad_values = bad_values or any(c is None for c in cols + lists)
        if bad_values:
            continue  # later rows are still scanned for value problems, which come first
        prompt, token, layer, ctx = cols
        routed_l, predicted_l = lists
        assert prompt is not None and token is not None and layer is not None \
            and ctx is not None and routed_l is not None and predicted_l is not None
        K._scan_rows(prompt, token, layer, ctx, base, L, st, first, info, tok_p, tok_c)
        offs, _ = routed_l
        lens = np.diff(offs)
        if (lens != k).any():
            j = int(np.argmax(lens != k))
            errs.add((2, 0, base + j), f"row {base + j}: {lens[j]} ids, expected top_k = {k}",
                     "routed")
            bad_lists = True
        if bad_lists:
            continue  # the row structure is still checked: it is reported before the lists
        if keep is None:
            dest = np.arange(out.row, out.row + m, dtype=np.int64)
        else:
            sel = np.isin(prompt, keep)
            dest = np.full(m, -1, np.int64)
            dest[sel] = np.arange(out.row, out.row + int(sel.sum()))
        for name, (offs, vals) in zip(("routed", "predicted"), (routed_l, predicted_l),
                                      strict=True):
            lens = np.diff(offs)
            if name == "predicted":
                out.widen(min(int(lens.max(initial=0)), E))
            found = np.full(K.N_LIST_KINDS, -1, np.int64)
            K._pad_lists(offs, vals, layer, L, E, name == "predicted",
                         out.routed if name == "routed" else out.predicted, dest, seen[name],
                         base, found)
            stage, ranks = order[name]
            for kind, rank in ranks.items():
                j = int(found[kind])
                if j >= 0:
                    ids = vals[offs[j]:offs[j + 1]].tolist()
                    errs.add((stage, rank, base + j),
                             _list_message(kind, base + j, ids, int(lens[j]), L, E), name)
        out.row += int((dest >= 0).sum())
    if not bad_values and st[K.HAVE_PREV] and st[K.GROUP_ROWS] != L:
        K._note(first, info, K.MISSING_LAYER, part.rows - 1, st[K.PREV_PROMPT],
                st[K.PREV_TOKEN], st[K.PREV_LAYER], st[K.PREV_LAYER] + 1, 0, 0, 0)
    _row_messages(first, info, L, errs)
    errs.raise_first(src)
    n_tok = int(st[K.N_TOKENS])
    tp, tc = tok_p[:n_tok], tok_c[:n_tok]
    every = tp[np.r_[True, tp[1:] != tp[:-1]]] if n_tok else tp
    if keep is not None:
        sel = np.isin(tp, keep)
        tp, tc = tp[sel], tc[sel]
    out.tok_prompt[out.token:out.token + len(tp)] = tp
    out.tok_ctx[out.token:out.token + len(tp)] = tc
    out.token += len(tp)
    return every


def _list_message(kind: int, i: int, ids: list[int], n: int, L: int, E: int) -> str:
    from . import _trace_kernels as K  # numba loads with the first kernel (see read_part)
    if kind == K.LIST_LAST_LAYER:
        return f"row {i}: ids {ids} at the last layer {L - 1}, expected empty"
    if kind == K.LIST_RANGE:
        return f"row {i}: ids {ids} out of range, expected 0..{E - 1}"
    if kind == K.LIST_TOO_LONG:
        return f"row {i}: {n} ids, expected at most {E} distinct"
    return f"row {i}: duplicated ids {ids}, expected distinct ids"


def prompt_runs(part: Part) -> tuple[np.ndarray, np.ndarray]:
    """Prompt ids of one file in row order and their row counts, from the ``prompt`` column only
    (the rows are not checked here; reading them does that)."""
    ids, counts = [], []
    for _, batch in _batches(part, ["prompt"]):
        v = batch.column(0)
        if v.null_count:
            raise CopeInputError("null prompt id, expected int32", source=part.src,
                                 field="prompt")
        v = v.to_numpy(zero_copy_only=False)
        if not len(v):
            continue
        starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]])
        ids.append(v[starts].astype(np.int64))
        counts.append(np.diff(np.r_[starts, len(v)]))
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ids_a, counts_a = np.concatenate(ids), np.concatenate(counts)
    # a prompt cut by a row-group boundary shows up twice in a row: merge the halves
    cont = np.r_[False, ids_a[1:] == ids_a[:-1]]
    group = np.cumsum(~cont) - 1
    return ids_a[~cont], np.bincount(group, weights=counts_a).astype(np.int64)
