"""docs/export.md shows what the code prints: its worked examples regenerate unchanged."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_worked_examples_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_examples.py"), "--check"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
