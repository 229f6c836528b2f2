"""Import routing traces recorded by other tools: JSON lines and numpy arrays here, the serving
runtimes' own records (vLLM, SGLang) in :mod:`.runtimes`.

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

import os
from collections.abc import Sequence

from ....errors import CopeInputError
from ....geometry import ModelGeometry
from ...data import Trace
from .arrays import import_npz
from .jsonl import import_jsonl
from .records import ImportReport, PromptReport
from .runtimes import import_sglang, import_vllm

FORMATS = ("jsonl", "npz", "vllm", "sglang")


def import_trace(fmt: str, paths: Sequence[str | os.PathLike], model: ModelGeometry, *,
                 context_start: int = 0,
                 prompt_tokens: int | None = None) -> tuple[Trace, ImportReport]:
    """Dispatch on ``fmt``: ``jsonl`` (:mod:`.jsonl`), ``npz`` (:mod:`.arrays`), ``vllm`` and
    ``sglang`` (:mod:`.runtimes`; ``prompt_tokens``: the prompt length of bare vLLM ``.npy``
    arrays)."""
    if fmt not in FORMATS:
        raise CopeInputError(f"expected one of {list(FORMATS)}, got {fmt!r}", field="format")
    if not paths:
        raise CopeInputError("no input files given", field="files")
    if context_start < 0:
        raise CopeInputError(f"expected >= 0, got {context_start}", field="context-start")
    if fmt in ("jsonl", "npz"):
        fn = import_jsonl if fmt == "jsonl" else import_npz
        return fn(paths, model, context_start=context_start)
    if fmt == "vllm":
        return import_vllm(paths, model, context_start=context_start,
                           prompt_tokens=prompt_tokens)
    return import_sglang(paths, model, context_start=context_start)


__all__ = ["FORMATS", "ImportReport", "PromptReport", "import_jsonl", "import_npz",
           "import_sglang", "import_trace", "import_vllm"]
