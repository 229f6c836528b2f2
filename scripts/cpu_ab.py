"""The published CPU A/Bs of issue 53 (data/published/cpu-ab-sets.json) as a table: per set what
changed, each run's decode tokens/s as published (the first six) and how far apart its slowest
and fastest runs are.

    python scripts/cpu_ab.py [--write | --check]

They are recorded to check the CPU model, not to fit it; the model's predictions for them come
with issue 53's CPU model. ``--write`` puts the table into docs/results.md between its cpu-ab
markers; ``--check`` exits 1 when it is not current (tests/test_published_ab.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from doc_blocks import block_main  # beside this script, on sys.path when it runs

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
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "results.md", START, END, table)


if __name__ == "__main__":
    raise SystemExit(main())
