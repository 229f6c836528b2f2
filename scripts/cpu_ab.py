"""The published CPU A/Bs of issue 53 (data/published/cpu-ab-sets.json) as a table: per set what
changed, each run's decode tokens/s as published (the first six) and how far apart its slowest
and fastest runs are.

    python scripts/cpu_ab.py [--write | --check]

They are recorded to check the CPU model, not to fit it; the model's predictions for them come
with issue 53's CPU model. ``--write`` puts the table into docs/results.md between its cpu-ab
markers; ``--check`` exits 1 when it is not current (tests/test_published_ab.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from doc_blocks import update_blocks  # beside this script, on sys.path when it runs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "published" / "cpu-ab-sets.json"
START, END = "<!-- cpu-ab:start -->", "<!-- cpu-ab:end -->"


def _runs(s: dict) -> list[tuple[str, float]]:
    """The runs with a decode speed, as published (a run with none is left out)."""
    return [(r["setting"], float(r["tg_tokens_per_s"])) for r in s["runs"]
            if r.get("tg_tokens_per_s") is not None]


def table() -> str:
    data = json.loads(DATA.read_text())
    lines = ["| set | changed | runs (setting: tg tokens/s) | slowest to fastest | source |",
             "|---|---|---|---|---|"]
    for s in data["sets"]:
        runs = _runs(s)
        if not runs:
            continue
        low, best = min(t for _, t in runs), max(t for _, t in runs)
        shown = "; ".join(f"{k}: {t:g}" for k, t in runs[:6]) + (
            f"; … ({len(runs)} runs)" if len(runs) > 6 else "")
        source = s["source"].split(" ")[0]
        label = "/".join(source.rstrip("/").split("/")[-3:]) if "github.com" in source \
            else source.split("/")[2]
        lines.append(f"| `{s['name']}` | {s['changed']} | {shown} | "
                     f"x{best / low:.2f} | [{label}]({source}) |")
    n = sum(1 for s in data["sets"] if _runs(s))
    by = sorted({s["changed"] for s in data["sets"]})
    counts = ", ".join(f"{sum(s['changed'] == c for s in data['sets'])} {c}" for c in by)
    return "\n".join(lines + ["", f"{n} sets ({counts}), collected {data['collected']}; "
                              "what each source does not state is in the file."])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite docs/results.md's table")
    g.add_argument("--check", action="store_true", help="exit 1 if it is not current")
    args = ap.parse_args()
    text = table()
    if not args.write and not args.check:
        print(text)
        return 0
    stale = update_blocks(START, END, [(ROOT / "docs" / "results.md", text)], write=args.write)
    if stale and args.check:
        print(f"cpu_ab: {', '.join(stale)} is not current: run scripts/cpu_ab.py --write",
              file=sys.stderr)
        return 1
    print("current" if not stale else f"rewrote {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
