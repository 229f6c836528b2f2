"""What a fresh machine runs: the README's two commands are the scripts CI runs, and the
Streamlit internal the app relies on is still where it was read."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
