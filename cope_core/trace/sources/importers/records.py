"""What every trace importer shares (:mod:`.jsonl`, :mod:`.arrays`, :mod:`.runtimes`): the
JSON-lines reader, a prompt's block of complete tokens, the checks on expert ids, and the trace
with its :class:`ImportReport`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ....errors import CopeInputError
from ....geometry import ModelGeometry
from ...data import Trace


@dataclass(frozen=True)
class PromptReport:
    """What happened to one source prompt."""

    prompt: int
    source: str
    tokens_seen: int
    tokens_kept: int
    cut_at: int | None
    records_dropped: int
    prefill_dropped: int = 0


@dataclass(frozen=True)
class ImportReport:
    """Per-prompt outcome of an import; ``dropped`` lists prompts with no complete token."""

    prompts: tuple[PromptReport, ...]
    context_recorded: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def records_dropped(self) -> int:
        return sum(p.records_dropped for p in self.prompts)

    @property
    def prefill_dropped(self) -> int:
        return sum(p.prefill_dropped for p in self.prompts)

    @property
    def dropped(self) -> tuple[PromptReport, ...]:
        return tuple(p for p in self.prompts if p.tokens_kept == 0)

    def lines(self) -> list[str]:
        out = []
        for p in self.prompts:
            pre = (f"; {p.prefill_dropped} prefill tokens left out" if p.prefill_dropped
                   else "")
            if p.tokens_seen == 0:
                out.append(f"prompt {p.prompt} ({p.source}): dropped, no decode token"
                           f"{pre}")
            elif p.tokens_kept == 0:
                out.append(f"prompt {p.prompt} ({p.source}): dropped, token 0 is incomplete "
                           f"({p.records_dropped} records discarded){pre}")
            elif p.cut_at is not None:
                out.append(f"prompt {p.prompt} ({p.source}): cut at token {p.cut_at} (first "
                           f"incomplete), kept {p.tokens_kept} of {p.tokens_seen} tokens, "
                           f"{p.records_dropped} records discarded{pre}")
            else:
                out.append(f"prompt {p.prompt} ({p.source}): complete, {p.tokens_kept} "
                           f"tokens{pre}")
        return out + list(self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": [p.__dict__ for p in self.prompts],
                "records_dropped": self.records_dropped,
                "prefill_dropped": self.prefill_dropped, "context_recorded":
                self.context_recorded, "notes": list(self.notes)}


#: One prompt's routed ids and contexts as :func:`prompt_block` cut them (None: dropped).
Block = tuple[np.ndarray | None, np.ndarray | None]


def prompt_block(src_name: str, routed: np.ndarray, context: np.ndarray | None, prompt: int,
                  g: ModelGeometry, prefill: int = 0
                  ) -> tuple[np.ndarray | None, np.ndarray | None, PromptReport]:
    """Cut one prompt's ``routed`` [T, L, k] (-1 = missing) at its first incomplete token;
    ``prefill`` counts the prompt's prefill tokens the source held and the import left out."""
    T = routed.shape[0]
    complete = np.all(routed >= 0, axis=(1, 2))
    bad = np.flatnonzero(~complete)
    cut = int(bad[0]) if bad.size else None
    keep = T if cut is None else cut
    dropped = int((routed[keep:] >= 0).all(axis=2).sum())
    rep = PromptReport(prompt, src_name, T, keep, cut, dropped, prefill)
    if keep == 0:
        return None, None, rep
    return routed[:keep], None if context is None else context[:keep], rep


def check_ids(routed: np.ndarray, g: ModelGeometry, src: str, where: str) -> None:
    ok = routed >= 0
    if (routed[ok] >= g.n_experts).any():
        raise CopeInputError(f"{where}: expert id {int(routed[ok].max())} out of range, expected "
                             f"0..{g.n_experts - 1} for {g.name}", source=src, field="experts")
    full = ok.all(axis=2)
    s = np.sort(routed, axis=2)
    dup = ((s[:, :, 1:] == s[:, :, :-1]).any(axis=2)) & full
    if dup.any():
        t, l = np.argwhere(dup)[0]
        raise CopeInputError(f"{where}: token {t} layer {l} repeats an expert "
                             f"{routed[t, l].tolist()}, expected {g.top_k} distinct ids",
                             source=src, field="experts")


def assemble(blocks: Sequence[Block], reports: Sequence[PromptReport], g: ModelGeometry,
             context_start: int, fmt: str, sources: Sequence[str],
             notes: tuple[str, ...] = ()) -> tuple[Trace, ImportReport]:
    kept = [(p, r, c) for p, (r, c) in enumerate(blocks) if r is not None]
    if not kept:
        raise CopeInputError("no prompt has a complete first token (every MoE layer recorded); "
                             "nothing to import", source=", ".join(sources))
    recorded = all(c is not None for _, _, c in kept)
    ctx: list[np.ndarray] = [c if recorded and c is not None
                             else context_start + np.arange(r.shape[0]) for _, r, c in kept]
    if not recorded:
        notes = (f"context lengths were not recorded: set to {context_start} + token index",
                 *notes)
    routed = np.concatenate([r for _, r, _ in kept]).astype(np.int16)
    counts = [r.shape[0] for _, r, _ in kept]
    rep = ImportReport(tuple(reports), recorded, notes)
    text = (f"imported from {fmt} ({', '.join(os.path.basename(s) for s in sources)}); "
            f"{rep.records_dropped} records after a prompt's first incomplete token discarded")
    if rep.prefill_dropped:
        text += f"; {rep.prefill_dropped} prefill tokens left out (decode tokens only)"
    if not recorded:
        text += f"; {notes[0]}"
    tr = Trace(model=g, prompt_ids=np.asarray([p for p, _, _ in kept], np.int32),
               prompt_start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
               context=np.concatenate(ctx).astype(np.int32), routed=routed,
               predicted=np.empty((routed.shape[0], g.n_layers, 0), np.int16),
               source="imported", description=text, predictor=None)
    return tr, rep


def existing_files(paths: Sequence[str | os.PathLike]) -> list[str]:
    """The import's input paths as strings, each an existing file (else a one-line
    CopeInputError naming it)."""
    srcs = [str(p) for p in paths]
    for src in srcs:
        if not os.path.isfile(src):
            raise CopeInputError("file not found", source=src)
    return srcs


def json_lines(src: str) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` for every non-blank line of a JSON-lines file; a missing
    file or a line that is not JSON is a one-line CopeInputError naming the file and line."""
    if not os.path.isfile(src):
        raise CopeInputError("file not found", source=src)
    with open(src, encoding="utf-8") as fh:
        for i, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                yield i, json.loads(raw)
            except ValueError:
                raise CopeInputError(f"line {i} is not valid JSON", source=src) from None
