"""Write the table of llama.cpp's builds in docs/design.md#llamacpp-builds from the data the
code reads (cope_core/llamacpp/data/builds.csv), so the page and the answers cannot disagree.

    python scripts/builds_table.py [--check]

``--check`` changes nothing and exits 1 when the page's table is not current
(tests/test_llamacpp_builds.py runs it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from doc_blocks import update_blocks  # beside this script, on sys.path when it runs

from cope_core.llamacpp import BUILD_EVIDENCE, build_rows

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- builds-table:start -->", "<!-- builds-table:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    """The Markdown table: one row per feature, with its first build and its sources."""
    out = ["| runtime | feature | flag | first build | PR | commit | read in | how the build is "
           "known | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in build_rows():
        first = f"b{r.build}" if r.build is not None else "(no numbered releases)"
        out.append("| " + " | ".join(_cell(x) for x in (
            r.runtime, f"`{r.feature}`", f"`{r.flag}`" if r.flag else "", first, r.pr,
            f"`{r.commit[:9]}`" if r.commit else "", r.source, r.tag_evidence, r.note)) + " |")
    out += ["", "How each build is known (the `how` column):", ""]
    out += [f"* `{k}`: {v}" for k, v in BUILD_EVIDENCE.items()]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the table is not current")
    args = ap.parse_args()
    stale = update_blocks(START, END, [(ROOT / "docs" / "design.md", table())],
                          write=not args.check)
    if stale and args.check:
        print(f"builds_table: {', '.join(stale)} is not current: run scripts/builds_table.py",
              file=sys.stderr)
        return 1
    print("current" if not stale else f"rewrote {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
