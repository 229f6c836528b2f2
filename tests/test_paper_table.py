"""The paper-vs-what-if table of docs/design.md and docs/results.md is what scripts/paper_table.py
computes from the shipped traces and today's analytic model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_paper_table_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "paper_table.py"), "--check"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
