"""Print the hot-set table of docs/traces.md: fixed caches of 10/25/50 % of the experts on every
shipped trace (popularity from its calibration trace) and on the real Mixtral trace of
../shared/realdata (popularity from itself, flagged), by cope_core.trace.stats.hot_set.

Run: ``python scripts/hot_sets.py [--write]`` (``--write`` puts the table into docs/traces.md
between its hot-sets markers); tests/test_trace_scale.py checks the docs table against it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from cope_core.files import write_atomic

ROOT = Path(__file__).resolve().parents[1]
REALDATA = ROOT.parent / "shared" / "realdata" / "mixtral-8x7b-instruct-decode"
DOC = ROOT / "docs" / "traces.md"
START, END = "<!-- hot-sets:start -->", "<!-- hot-sets:end -->"
REAL_ROW = "| real Mixtral decode trace (itself) |"


def doc_rows() -> list[str]:
    """The table now in docs/traces.md."""
    text = DOC.read_text()
    return text[text.index(START) + len(START):text.index(END)].strip().splitlines()


def rows() -> list[str]:
    from cope_core.geometry import get_model
    from cope_core.parquet_io import read_trace
    from cope_core.trace.sources.importers import import_trace
    from cope_core.trace.stats import hot_set

    out = ["| trace | 10 % cache | 25 % cache | 50 % cache | verdict |",
           "|---|---|---|---|---|"]

    def row(name: str, hs) -> str:
        cells = [f"{c:.1%} ({c / u:.2f}x)" for c, u in zip(hs.caught, hs.uniform, strict=True)]
        return f"| {name} | " + " | ".join(cells) + f" | {hs.kind} |"

    for trace in sorted((ROOT / "data" / "examples").glob("*-trace.parquet")):
        if trace.name.startswith("gguf-"):  # another example's routing, priced as a file
            continue
        cal = trace.with_name(trace.name.replace("-trace", "-calibration"))
        out.append(row(trace.name, hot_set(read_trace(trace), read_trace(cal))))
    files = sorted(REALDATA.glob("*.jsonl"))
    if files:
        real, _ = import_trace("jsonl", files, get_model("mixtral-8x7b"))
        out.append(row("real Mixtral decode trace (itself)", hot_set(real)))
    return out


if __name__ == "__main__":
    table = "\n".join(rows())
    if "--write" in sys.argv[1:]:
        text = DOC.read_text()
        a, b = text.index(START) + len(START), text.index(END)
        write_atomic(DOC, text[:a] + "\n" + table + "\n" + text[b:], overwrite=True)
    print(table)
