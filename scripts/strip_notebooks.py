"""Strip outputs, execution counts and run-specific metadata from the notebooks under notebooks/.

Git keeps the notebooks without outputs: diffs stay readable, no stale numbers or megabytes of
plotly JSON are committed, and ``tests/test_notebooks.py`` checks that this holds. Running the
script twice changes nothing the second time; a file is only rewritten when its stripped form
differs.

Usage::

    python scripts/strip_notebooks.py            # strip every notebooks/**/*.ipynb in place
    python scripts/strip_notebooks.py --check    # exit 1 (and rewrite nothing) if any is not stripped
    python scripts/strip_notebooks.py a.ipynb    # only these files
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
#: Cell metadata that records a particular run (nbclient's timings, editor view state).
RUN_CELL_KEYS = ("execution", "ExecuteTime", "collapsed", "scrolled")
#: The kernel every notebook runs on; fixed so that whoever ran it last leaves no trace.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove outputs, execution counts and run-specific metadata from ``nb`` in place.

    Parameters
    ----------
    nb : nbformat.NotebookNode
        A version-4 notebook.

    Returns
    -------
    nbformat.NotebookNode
        ``nb`` itself: code cells without outputs or execution counts, no per-run cell
        metadata, the standard ``python3`` kernel spec and ``language_info`` reduced to the
        language name (its version would change with every interpreter that ran it).
    """
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in RUN_CELL_KEYS:
            cell.metadata.pop(key, None)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("signature", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The file text nbformat writes for ``nb`` (one trailing newline)."""
    return nbformat.writes(nb).rstrip("\n") + "\n"


def notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """Every ``.ipynb`` under ``folder``, sorted, Jupyter's checkpoint copies left out."""
    return sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def strip_file(path: Path, check: bool = False) -> bool:
    """Strip one notebook file; returns True when it was not already stripped.

    With ``check`` the file is left as it is.
    """
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    new = render(strip(nb))
    if new == text:
        return False
    if not check:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path,
                        help="notebooks to strip (default: every notebook under notebooks/)")
    parser.add_argument("--check", action="store_true",
                        help="report notebooks that are not stripped and exit 1; change nothing")
    args = parser.parse_args(argv)
    paths = args.paths or notebooks()
    changed = [p for p in paths if strip_file(p, check=args.check)]
    for p in changed:
        print(f"{'not stripped' if args.check else 'stripped'}: {p}")
    if not changed:
        print(f"{len(paths)} notebook(s) already stripped")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
