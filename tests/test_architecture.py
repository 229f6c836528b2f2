"""House rules the import-linter contracts cannot state: no private name crosses a package."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "cope_core"


def _package_of(module: str) -> str:
    """``cope_core.profile.measure`` -> ``cope_core.profile``; top-level modules stand alone."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(path: Path):
    module = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    if module.endswith(".__init__"):
        module = module[: -len(".__init__")]
        base = module.split(".")
    else:
        base = module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                src = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module
                                                                      else []))
            else:
                src = node.module or ""
            if src.startswith("cope_core"):
                yield module, src, [a.name for a in node.names]


def test_no_private_name_is_imported_from_another_package():
    bad = []
    for path in PKG.rglob("*.py"):
        for module, src, names in _imports(path):
            if _package_of(module) == _package_of(src):
                continue
            bad += [f"{module} imports {src}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_the_check_sees_relative_imports():
    found = {(m, s) for m, s, _ in _imports(PKG / "profile" / "bench.py")}
    assert ("cope_core.profile.bench", "cope_core.mechanisms.execution") in found
    found = {(m, s) for m, s, _ in _imports(PKG / "trace" / "__init__.py")}
    assert ("cope_core.trace", "cope_core.trace.data") in found


def test_no_test_module_imports_another():
    """Shared test helpers live in helper modules (tests/tiny.py, llama_tools.py, naive.py, ...),
    not in test modules: a test file never depends on another's internals."""
    tests = Path(__file__).resolve().parent
    bad = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name} imports {n}" for n in names
                    if n.split(".")[0].startswith("test_")]
    assert bad == []
