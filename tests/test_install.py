"""What a fresh machine runs: the README's two commands are the scripts CI runs, a runtime the
tests need that cannot be set up stops the test command, and the Streamlit internal the app
relies on is still where it was read."""
from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import streamlit
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _two_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Two commands"):]
    section = section[:section.index("\n## ", 3)]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_commands_are_the_scripts_ci_runs():
    assert _two_commands() == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    runs = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    assert any(line.endswith("bash scripts/quickstart.sh >\"$log\" 2>&1 < /dev/null &")
               for line in runs), "CI must run README command 1 as written"
    assert "bash scripts/test.sh" in runs, "CI must run README command 2 as written"


def test_the_main_job_installs_predicts_and_serves():
    script = (ROOT / "scripts" / "quickstart.sh").read_text()
    steps = [line.split()[0:2] for line in script.splitlines()
             if line and not line.startswith((" ", "#", "set ", "cd "))]
    assert steps == [["bash", "scripts/install.sh"], [".", "scripts/env.sh"],
                     ["cope", "predict"], ["exec", "cope"]], steps


def test_streamlit_is_bounded_to_the_version_whose_internals_the_app_reads():
    """cope_core/app/session.py clears ``PagesManager.uses_pages_directory`` (read at 1.67): the
    pyproject bound admits the installed release only while that flag exists, loudly."""
    from streamlit.runtime.pages_manager import PagesManager

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("streamlit"))
    assert Version(streamlit.__version__) in SpecifierSet(spec.removeprefix("streamlit"))
    assert SpecifierSet(spec.removeprefix("streamlit")).contains("1.67.0")
    assert not SpecifierSet(spec.removeprefix("streamlit")).contains("1.68.0"), \
        "streamlit has no upper bound: the app's private flag may move in any release"
    assert hasattr(PagesManager, "uses_pages_directory"), (
        "streamlit moved PagesManager.uses_pages_directory: cope_core/app/session.py "
        "run_through_app must be re-read against this release")


def test_a_runtime_that_cannot_be_set_up_stops_the_test_command(tmp_path):
    """scripts/runtimes.sh names every runtime it could not set up and exits 1 (scripts/test.sh
    stops there, before pytest), unless COPE_ALLOW_MISSING_RUNTIMES=1. Here no runtime can be set
    up: the interpreter it installs with is ``false``; nothing is left half made."""
    env = {k: v for k, v in os.environ.items() if k != "COPE_ALLOW_MISSING_RUNTIMES"}
    env |= {"PYTHON": "false", "COPE_RUNTIMES_DIR": str(tmp_path / "cache"),
            "TMPDIR": str(tmp_path)}

    def run(**extra):
        return subprocess.run(["bash", str(ROOT / "scripts" / "runtimes.sh")], env=env | extra,
                              capture_output=True, text=True, timeout=120)
    r = run()
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    for name in ("llama.cpp b11434", "vLLM 0.33.0", "exllamav3 1.6.5", "sglang-kt 0.7.2",
                 "freetoken-0.2.1", "ftllm-1.9.0"):
        assert f"runtimes: {name} could not be" in r.stderr and name in last, name
    assert "COPE_ALLOW_MISSING_RUNTIMES=1" in last
    r = run(COPE_ALLOW_MISSING_RUNTIMES="1")
    assert r.returncode == 0, r.stderr
    assert "COPE_ALLOW_MISSING_RUNTIMES=1, so their tests will skip" in r.stderr
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["logs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    # the test command runs it before pytest and stops when it fails
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert test_sh.index("if ! bash scripts/runtimes.sh; then\n") < test_sh.index(
        "python3 -m pytest")
    assert "exit 1" in test_sh[test_sh.index("if ! bash scripts/runtimes.sh"):][:300]


def test_a_missing_runtime_fails_its_test_unless_allowed(monkeypatch):
    """tests/llama_tools.py's missing_runtime: a failure naming the runtime and the opt-out, a
    skip with COPE_ALLOW_MISSING_RUNTIMES=1."""
    from llama_tools import missing_runtime
    monkeypatch.delenv("COPE_ALLOW_MISSING_RUNTIMES", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"^vLLM 0\.33\.0 is not set up: set it up "
                       r"with bash scripts/runtimes\.sh.*COPE_ALLOW_MISSING_RUNTIMES=1"):
        missing_runtime("vLLM 0.33.0 is not set up")
    monkeypatch.setenv("COPE_ALLOW_MISSING_RUNTIMES", "1")
    with pytest.raises(pytest.skip.Exception, match=r"^vLLM 0\.33\.0 is not set up \("
                       r"COPE_ALLOW_MISSING_RUNTIMES=1"):
        missing_runtime("vLLM 0.33.0 is not set up")
