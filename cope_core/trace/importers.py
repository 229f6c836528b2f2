"""Import routing traces recorded by other tools: JSON lines and numpy arrays here, the serving
runtimes' own records (vLLM, SGLang) in :mod:`cope_core.trace.import_runtimes`.

Missing records are never filled in. A token is *complete* when every MoE layer has a record;
each prompt is cut at its first incomplete token (tokens after a gap cannot be trusted: a
collector that numbers tokens by position shifts a layer's later tokens after a missing record),
and the :class:`ImportReport` says what was cut. A prompt with no complete token is dropped
and reported.

JSON lines (``format="jsonl"``)
    One object per (prompt, layer, decode token) with the fields ``layer``, a token index
    (``token_idx`` or ``token``), ``experts`` (the ``top_k`` ids) and a prompt id (``prompt``
    or ``problem_id``; with a ``dataset`` field the pair (dataset, problem_id) names the prompt).
    Optional: ``gating_probs`` (``experts`` are then ordered by descending probability, so
    "best score first" holds even if the recorder did not sort) and ``context``. Prompts get ids
    0, 1, ... in order of first appearance over the files.
numpy (``format="npz"``)
    A ``.npy`` file holds one prompt ``[tokens, layers, top_k]``; a ``.npz`` file holds either a
    ``routed`` array (one prompt, with an optional ``context`` array ``[tokens]``) or any number
    of 3-D arrays, one prompt each, in stored order. A negative id marks a missing record.

Without recorded context lengths the KV-cache length is unknown; it is set to
``context_start + token`` and the report and the trace description say so.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from .data import Trace
from .import_records import ImportReport, assemble, check_ids, prompt_block

FORMATS = ("jsonl", "npz", "vllm", "sglang")


def _field(obj: dict, names: tuple[str, ...], src: str, line: int) -> Any:
    for n in names:
        if n in obj:
            return obj[n]
    raise CopeInputError(f"line {line}: missing field {' or '.join(repr(n) for n in names)}",
                         source=src, field=names[0])


def _int(v: Any, src: str, line: int, name: str, lo: int, hi: int | None = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        want = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
        raise CopeInputError(f"line {line}: got {v!r}, expected {want}", source=src, field=name)
    return v


def _id(v: Any, src: str, line: int, name: str) -> str | int | float:
    # it becomes part of a dict key: a list or object would not hash, a bool or null names nothing
    if not isinstance(v, (str, int, float)) or isinstance(v, bool) or (
            isinstance(v, float) and not math.isfinite(v)):
        raise CopeInputError(f"line {line}: got {v!r:.60}, expected a string or a number",
                             source=src, field=name)
    return v


def import_jsonl(paths: Sequence[str | os.PathLike], model: ModelGeometry, *,
                 context_start: int = 0) -> tuple[Trace, ImportReport]:
    """Import JSON-lines routing records (format in the module docstring)."""
    g = model
    L, E, k = g.n_layers, g.n_experts, g.top_k
    recs: dict[Any, dict[tuple[int, int], list[int]]] = {}
    ctxs: dict[Any, dict[int, int]] = {}
    names: dict[Any, str] = {}
    srcs = [str(p) for p in paths]
    for src in srcs:
        if not os.path.isfile(src):
            raise CopeInputError("file not found", source=src)
        with open(src, encoding="utf-8") as fh:
            for i, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except ValueError:
                    raise CopeInputError(f"line {i} is not valid JSON", source=src) from None
                if not isinstance(obj, dict):
                    raise CopeInputError(f"line {i}: expected a JSON object", source=src)
                pid = _id(_field(obj, ("prompt", "problem_id"), src, i), src, i,
                          "prompt" if "prompt" in obj else "problem_id")
                ds = obj.get("dataset")   # null is the same as no dataset
                key = (None if ds is None else _id(ds, src, i, "dataset"), pid)
                layer = _int(_field(obj, ("layer",), src, i), src, i, "layer", 0, L - 1)
                tok = _int(_field(obj, ("token_idx", "token"), src, i), src, i, "token_idx", 0)
                ex = _field(obj, ("experts",), src, i)
                if not isinstance(ex, list) or len(ex) != k:
                    raise CopeInputError(f"line {i}: got {ex!r:.60}, expected a list of {k} "
                                         f"expert ids ({g.name} routes top-{k})", source=src,
                                         field="experts")
                ids = [_int(e, src, i, "experts", 0, E - 1) for e in ex]
                if len(set(ids)) != k:
                    raise CopeInputError(f"line {i}: repeats an expert {ids}, expected {k} "
                                         f"distinct ids", source=src, field="experts")
                probs = obj.get("gating_probs")
                if isinstance(probs, list) and len(probs) == k:
                    ids = [e for _, e in sorted(zip(probs, ids), key=lambda pe: (-pe[0], pe[1]))]
                per = recs.setdefault(key, {})
                names.setdefault(key, f"{os.path.basename(src)}: " + (
                    f"{key[0]}/{pid}" if key[0] is not None else str(pid)))
                if (tok, layer) in per and per[(tok, layer)] != ids:
                    raise CopeInputError(f"line {i}: second, different record for token {tok} "
                                         f"layer {layer}", source=src, field="token_idx")
                per[(tok, layer)] = ids
                if "context" in obj:
                    ctxs.setdefault(key, {})[tok] = _int(obj["context"], src, i, "context", 0)
    if not recs:
        raise CopeInputError("no records found", source=", ".join(srcs))
    blocks, reports = [], []
    for p, (key, per) in enumerate(recs.items()):
        T = max(t for t, _ in per) + 1
        routed = np.full((T, L, k), -1, np.int64)
        for (t, l), ids in per.items():
            routed[t, l] = ids
        c = ctxs.get(key)
        ctx = np.array([c.get(t, -1) for t in range(T)]) if c is not None else None
        if ctx is not None and (ctx < 0).any():
            ctx = None
        r, cc, rep = prompt_block(names[key], routed, ctx, p, g)
        blocks.append((r, cc))
        reports.append(rep)
    return assemble(blocks, reports, g, context_start, "jsonl", srcs)


def import_npz(paths: Sequence[str | os.PathLike], model: ModelGeometry, *,
               context_start: int = 0) -> tuple[Trace, ImportReport]:
    """Import numpy arrays ``[tokens, layers, top_k]`` (format in the module docstring)."""
    g = model
    want = (g.n_layers, g.top_k)
    blocks, reports = [], []
    srcs = [str(p) for p in paths]
    for src in srcs:
        if not os.path.isfile(src):
            raise CopeInputError("file not found", source=src)
        try:
            z = np.load(src, allow_pickle=False)
            items = ([("", z, None)] if isinstance(z, np.ndarray) else
                     [("routed", z["routed"], z["context"] if "context" in z.files else None)]
                     if "routed" in z.files else [(n, z[n], None) for n in z.files])
        except (ValueError, OSError) as exc:
            raise CopeInputError(f"not a numpy .npy/.npz file ({' '.join(str(exc).split())})",
                                 source=src) from None
        for name, arr, ctx in items:
            where = f"array {name!r}" if name else "array"
            if arr.ndim != 3 or arr.shape[1:] != want or arr.dtype.kind not in "iu":
                raise CopeInputError(f"{where}: got {arr.dtype} {arr.shape}, expected integers "
                                     f"[tokens, {want[0]}, {want[1]}] for {g.name}", source=src,
                                     field=name or "routed")
            if ctx is not None and ctx.shape != (arr.shape[0],):
                raise CopeInputError(f"shape {ctx.shape}, expected ({arr.shape[0]},)",
                                     source=src, field="context")
            routed = np.where(arr < 0, -1, arr).astype(np.int64)
            # a record with any missing id is missing as a whole
            routed[(routed < 0).any(axis=2)] = -1
            check_ids(routed, g, src, where)
            label = f"{os.path.basename(src)}" + (f": {name}" if name else "")
            r, c, rep = prompt_block(label, routed, ctx, len(blocks), g)
            blocks.append((r, c))
            reports.append(rep)
    return assemble(blocks, reports, g, context_start, "npz", srcs)


def import_trace(fmt: str, paths: Sequence[str | os.PathLike], model: ModelGeometry, *,
                 context_start: int = 0,
                 prompt_tokens: int | None = None) -> tuple[Trace, ImportReport]:
    """Dispatch on ``fmt``: ``jsonl`` and ``npz`` here, ``vllm`` and ``sglang`` in
    :mod:`cope_core.trace.import_runtimes` (``prompt_tokens``: the prompt length of bare vLLM
    ``.npy`` arrays)."""
    if fmt not in FORMATS:
        raise CopeInputError(f"expected one of {list(FORMATS)}, got {fmt!r}", field="format")
    if not paths:
        raise CopeInputError("no input files given", field="files")
    if context_start < 0:
        raise CopeInputError(f"expected >= 0, got {context_start}", field="context-start")
    if fmt in ("jsonl", "npz"):
        fn = import_jsonl if fmt == "jsonl" else import_npz
        return fn(paths, model, context_start=context_start)
    from .import_runtimes import import_sglang, import_vllm
    if fmt == "vllm":
        return import_vllm(paths, model, context_start=context_start,
                           prompt_tokens=prompt_tokens)
    return import_sglang(paths, model, context_start=context_start)
