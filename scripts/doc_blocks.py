"""The generated blocks of the docs: the text between a script's start and end markers (such as
``<!-- paper-table:start -->``), replaced by what the script computes now. Beside the scripts that
write them (paper_table.py, published_sweeps.py), on ``sys.path`` when they run."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cope_core.files import write_atomic


def update_blocks(start: str, end: str, blocks: Iterable[tuple[Path, str]],
                  write: bool) -> list[str]:
    """Put each ``(doc, text)``'s text between the doc's ``start`` and ``end`` markers.

    Returns the names of the docs whose block was not that text (stale); they are rewritten
    (atomically) only when ``write``.
    """
    stale = []
    for doc, text in blocks:
        old = doc.read_text()
        a, b = old.index(start) + len(start), old.index(end)
        new = old[:a] + "\n" + text + "\n" + old[b:]
        if new != old:
            stale.append(doc.name)
            if write:
                write_atomic(doc, new, overwrite=True)
    return stale
