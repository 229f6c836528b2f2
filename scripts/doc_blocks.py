"""The generated blocks of the docs: the text between a script's start and end markers (such as
``<!-- paper-table:start -->``), replaced by what the script computes now. Beside the scripts that
write them (paper_table.py, published_sweeps.py), on ``sys.path`` when they run."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
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


def block_main(description: str, doc: Path, start: str, end: str, table: Callable[[], str],
               *, run: Callable[[], None] | None = None,
               also: Callable[[bool], list[str]] | None = None) -> int:
    """The command line of a script that writes one generated block: no flag prints the block,
    ``--write`` puts it into ``doc``, ``--check`` exits 1 naming what is not current; ``run``
    given, ``--run`` measures first (then ``--write`` writes); ``also(write)``: the script's other
    generated files, the names of those not current (rewritten when ``write``)."""
    ap = argparse.ArgumentParser(description=description)
    g = ap.add_mutually_exclusive_group()
    if run is not None:
        g.add_argument("--run", action="store_true", help="measure, then write the record")
    g.add_argument("--write", action="store_true", help=f"rewrite {doc.name}'s block")
    g.add_argument("--check", action="store_true", help="exit 1 if it is not current")
    args = ap.parse_args()
    if getattr(args, "run", False):
        assert run is not None
        run()
        return 0
    text = table()
    if not args.write and not args.check:
        print(text)
        return 0
    stale = update_blocks(start, end, [(doc, text)], write=args.write)
    stale += also(args.write) if also is not None else []
    script = Path(sys.argv[0]).name
    if stale and args.check:
        print(f"{script}: {', '.join(stale)} is not current: run scripts/{script} --write",
              file=sys.stderr)
        return 1
    print("current" if not stale else f"rewrote {', '.join(stale)}")
    return 0
