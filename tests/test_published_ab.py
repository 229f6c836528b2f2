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


def test_every_set_is_priced_or_says_why_and_its_runs_exist():
    from cope_core import parts
    from cope_core.models import resolve_model
    data = json.loads((ROOT / "data" / "published" / "cpu-ab-sets.json").read_text())
    priced = 0
    for s in data["sets"]:
        price = s["price"]
        if price is None:
            assert s["not_priced"], s["name"]
            continue
        priced += 1
        assert price["assumed"] and parts.cpu_part(price["cpu"])
        assert ("memory" in price) != ("memory_measured_gbs" in price) or all(
            "memory" in r for r in price["runs"]), s["name"]
        for r in price["runs"]:
            run = s["runs"][r["run"]]
            assert run["tg_tokens_per_s"] > 0 and str(r["threads"]) in run["setting"] \
                or s["changed"] == "memory_clock", (s["name"], r)
            resolve_model(price["model"], r.get("preset", price["preset"]))
    assert priced >= 5
