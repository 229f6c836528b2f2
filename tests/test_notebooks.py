"""The teaching notebooks: committed without outputs, and each runs top to bottom in a fresh kernel.

Each notebook is executed with nbclient on the ``python3`` kernel (ipykernel provides it) from a
temporary copy, with ``notebooks/`` as the working directory, so the committed file is never
written. A cell that raises fails the test with that cell's source and traceback. Execution
times are printed (``pytest -s`` shows them).
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
EXPECTED = ("01-what-if-vram.ipynb", "02-policy-matrix.ipynb", "03-validate-your-platform.ipynb")
CELL_TIMEOUT_S = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # IPython colours its tracebacks


def _notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOK_DIR.glob("*.ipynb"))


def _stripped(path: Path) -> str:
    """``path`` as ``scripts/strip_notebooks.sh`` (nbstripout) would commit it."""
    out = subprocess.run(["bash", str(ROOT / "scripts" / "strip_notebooks.sh"), "--textconv",
                          str(path)], capture_output=True, text=True, check=True)
    return out.stdout


def test_the_three_notebooks_exist():
    # guards the parametrised tests below against passing vacuously on an empty folder
    names = [p.name for p in _notebooks()]
    assert len(names) >= 3
    assert set(EXPECTED) <= set(names)


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_notebook_is_committed_stripped(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
        assert "execution" not in cell.metadata, f"{path.name} cell {i} has run timings"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    # the strip script leaves a committed notebook byte for byte as it is
    assert _stripped(path) == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=[pytest.mark.slow] if p.name.startswith("03-") else [])
    for p in _notebooks()], ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path):
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    nb = nbformat.read(copy, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell raised\n{_ANSI.sub('', str(exc))}", pytrace=False)
    seconds = time.perf_counter() - start
    print(f"\n{path.name} executed in {seconds:.1f} s")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert errors == []
    # every notebook draws at least one plotly figure
    assert any("application/vnd.plotly.v1+json" in o.get("data", {})
               for c in code for o in c.outputs), f"{path.name} showed no plotly figure"
    # stripping the executed copy gives back the committed notebook: the script removes
    # everything a run adds, and nothing else
    nbformat.write(nb, copy)
    assert _stripped(copy) == path.read_text(encoding="utf-8")
