"""Regenerate the worked examples of docs/export.md from the code.

Every fenced ``console`` block of the page is a list of ``$ command`` lines (continued with a
trailing backslash) and their output; the commands run again, in order, in a scratch folder where
``data/`` is the repository's, and their output (stdout and stderr as they come) replaces the old.
The ``json`` block after "(excerpt" is rebuilt from the policy file the examples wrote, with long
parts shortened the same way every time. The table of formats between its two marker comments is
written from the format records (``cope_core.export.formats.markdown_table``). ``--check``
changes nothing and exits 1 when the page is not current (tests/test_export_doc.py runs it);
``--table-only`` rewrites the table alone, without running the examples (seconds, not minutes).

    python3 scripts/export_examples.py [--check] [--table-only]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cope_core.export.formats import markdown_table
from cope_core.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "export.md"
FENCE = re.compile(r"```(console|json)\n(.*?)```", re.S)
TABLE_BEGIN = ("<!-- the formats' table: written from cope_core/export/formats.py by "
               "scripts/export_examples.py -->\n")
TABLE_END = "\n<!-- end of the formats' table -->\n"


def with_format_table(text: str) -> str:
    """``text`` with the table between the two markers written from the format records."""
    if text.count(TABLE_BEGIN) != 1 or text.count(TABLE_END) != 1:
        raise SystemExit("export_examples: docs/export.md needs exactly one pair of the "
                         "formats' table markers")
    head, rest = text.split(TABLE_BEGIN)
    return head + TABLE_BEGIN + markdown_table() + TABLE_END + rest.split(TABLE_END)[1]


def _commands(block: str) -> list[str]:
    """The ``$ ...`` commands of a console block, continuation lines joined."""
    cmds, cur = [], None
    for line in block.splitlines():
        if line.startswith("$ "):
            cur = line[2:]
        elif cur is not None and cur.endswith("\\"):
            cur = cur + "\n" + line
        else:
            if cur is not None:
                cmds.append(cur)
            cur = None
            continue
        if not cur.endswith("\\"):
            cmds.append(cur)
            cur = None
    return cmds


def _run(cmd: str, cwd: Path) -> str:
    env = dict(os.environ, COLUMNS="200", PYTHONWARNINGS="ignore")
    r = subprocess.run(["bash", "-c", "{ " + cmd + "\n} 2>&1"], cwd=cwd, capture_output=True,
                       text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"export_examples: `{cmd}` exited {r.returncode}:\n{r.stdout}")
    return r.stdout


def excerpt(policy: dict) -> str:
    """The page's excerpt of a policy record: every key, long values shortened with ``...``."""
    p = dict(policy)
    rows = p["resident_experts"]
    lines = ["{"]
    items = list(p.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "model":
            text = json.dumps({k: value[k] for k in ("name", "n_layers", "n_experts", "top_k")})
            text = text[:-1] + ", ...}"
        elif key == "platform":
            text = json.dumps({k: value[k] for k in ("gpu", "cpu", "link") if k in value})
            text = text[:-1] + ', ..., "spec": {...}}'
        elif key == "resident_experts":
            body = ",\n".join("    " + json.dumps(r) for r in rows[:2])
            text = f"[\n{body},\n    ... {len(rows) - 2} more rows, one per MoE layer ...\n  ]"
        elif key == "predictions_us":
            first = {c: value["cope"][c] for c in list(value["cope"])[:2]}
            text = ('{\n    "cope": ' + json.dumps(first)[:-1] + ', ...},\n'
                    '    "atomic": {...}, "hrm": ' + ("{...}" if value["hrm"] else "null")
                    + "\n  }")
        elif key == "confidence":
            cand = policy["candidate"]["id"]
            parts = [f'    "{k}": {json.dumps(v)}' for k, v in value.items()
                     if k not in ("tpot_ci_us", "win_probability", "equivalent_to")]
            parts += [f'    "{k}": ' + json.dumps({cand: value[k][cand]})[:-1] + ", ...}"
                      for k in ("tpot_ci_us", "win_probability", "equivalent_to") if k in value]
            text = "{\n" + ",\n".join(parts) + "\n  }"
        elif key == "provenance":
            v = dict(value, created="...")
            text = json.dumps(v, indent=2).replace("\n", "\n  ")
        else:
            text = json.dumps(value, indent=2).replace("\n", "\n  ")
        lines.append(f'  "{key}": {text}{comma}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def regenerate(text: str, work: Path) -> str:
    (work / "data").symlink_to(ROOT / "data")
    out, pos = [], 0
    for m in FENCE.finditer(text):
        kind, body = m.group(1), m.group(2)
        out.append(text[pos:m.start()])
        if kind == "console":
            parts = []
            for cmd in _commands(body):
                parts.append("$ " + cmd + "\n" + _run(cmd, work))
            new = "".join(parts)
        elif "(excerpt" in text[max(0, m.start() - 200):m.start()]:
            name = re.findall(r"`([^`]+\.json)` \(excerpt", text[max(0, m.start() - 200):
                                                               m.start()])[-1]
            new = excerpt(json.loads((work / name).read_text()))
        else:
            new = body
        out.append(f"```{kind}\n{new}```")
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is not current")
    ap.add_argument("--table-only", action="store_true",
                    help="rewrite the table of formats only, not the worked examples")
    args = ap.parse_args(argv)
    old = DOC.read_text(encoding="utf-8")
    new = with_format_table(old)
    if not args.table_only:
        with tempfile.TemporaryDirectory() as tmp:
            new = regenerate(new, Path(tmp))
    if new == old:
        print("docs/export.md is current")
        return 0
    if args.check:
        print("docs/export.md is not current: run python3 scripts/export_examples.py",
              file=sys.stderr)
        return 1
    write_atomic(DOC, new, overwrite=True)
    print("rewrote docs/export.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
