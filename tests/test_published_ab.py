"""The published CPU A/Bs of issue 53 (data/published/cpu-ab-sets.json): every set names its
source, what changed and runs with decode speeds, and docs/results.md's table of them is what
scripts/cpu_ab.py writes today."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHANGES = {"memory_clock", "channels", "threads", "smt", "cores"}


def test_every_set_names_its_source_change_and_runs():
    data = json.loads((ROOT / "data" / "published" / "cpu-ab-sets.json").read_text())
    assert data["collected"] and data["sets"]
    for s in data["sets"]:
        assert s["source"].startswith("http") and s["changed"] in CHANGES, s["name"]
        assert len(s["runs"]) >= 2 and all(r["setting"] for r in s["runs"]), s["name"]
        speeds = [r["tg_tokens_per_s"] for r in s["runs"] if r["tg_tokens_per_s"] is not None]
        assert all(isinstance(t, (int, float)) and t > 0 for t in speeds), s["name"]
        assert s["not_stated"], s["name"]          # what the source leaves out is said


def test_the_table_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_ab.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
