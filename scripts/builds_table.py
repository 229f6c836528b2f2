"""Write the table of llama.cpp's builds in docs/design.md#llamacpp-builds from the data the
code reads (cope_core/llamacpp/data/builds.csv), so the page and the answers cannot disagree.

    python scripts/builds_table.py [--write | --check]

No flag prints the table; ``--write`` puts it into docs/design.md between its builds-table
markers; ``--check`` changes nothing and exits 1 when the page's table is not current
(tests/test_llamacpp_builds.py runs it).
"""
from __future__ import annotations

from pathlib import Path

from doc_blocks import block_main  # beside this script, on sys.path when it runs

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
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "design.md", START, END, table)


if __name__ == "__main__":
    raise SystemExit(main())
