"""JSON lines (``format="jsonl"``): one object per (prompt, layer, decode token); the fields are
in :mod:`cope_core.trace.sources.importers`."""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ....errors import CopeInputError
from ....geometry import ModelGeometry
from ...data import Trace
from .records import Block, ImportReport, PromptReport, assemble, json_lines, prompt_block


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
    """Import JSON-lines routing records (the format: :mod:`cope_core.trace.sources.importers`)."""
    g = model
    L, E, k = g.n_layers, g.n_experts, g.top_k
    recs: dict[Any, dict[tuple[int, int], list[int]]] = {}
    ctxs: dict[Any, dict[int, int]] = {}
    names: dict[Any, str] = {}
    srcs = [str(p) for p in paths]
    for src in srcs:
        for i, obj in json_lines(src):
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
    blocks: list[Block] = []
    reports: list[PromptReport] = []
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
