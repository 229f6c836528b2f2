"""llama.cpp's package is used through its face (issue 61): nothing outside
``cope_core/llamacpp/`` — the rest of the package, the app's pages, scripts, benchmarks —
imports one of its modules or a name its ``__all__`` does not give (tests may); every name of
the face is used outside the package. import-linter holds the same rule for the package
(pyproject.toml); this test also covers the code import-linter does not see."""
from __future__ import annotations

import ast
from pathlib import Path

import cope_core.llamacpp as face

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "cope_core.llamacpp"
#: the code that must go through the face (tests may reach in)
USERS = ("cope_core", "pages", "scripts", "benchmarks")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def deep_imports(text: str, module: str, is_package: bool = False) -> list[str]:
    """What ``text`` (the source of ``module``) imports of the llama.cpp package past its face:
    a module of it, or a name the face does not export."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith(PACKAGE + ".")]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(node, module, is_package)
            if src.startswith(PACKAGE + "."):
                out += [f"{src}.{a.name}" for a in node.names]
            elif src == PACKAGE:
                out += [f"{src}.{a.name}" for a in node.names if a.name not in face.__all__]
    return out


def _user_files() -> list[Path]:
    files = [ROOT / "app.py"]
    for top in USERS:
        files += [p for p in (ROOT / top).rglob("*.py")
                  if "cope_core/llamacpp" not in p.as_posix()]
    return files


def test_the_check_finds_a_deep_import():
    assert deep_imports("from cope_core.llamacpp.placement.vram import read_llama_model",
                        "scripts.x") \
        == ["cope_core.llamacpp.placement.vram.read_llama_model"]
    assert deep_imports("from ..llamacpp.placement.fit import fit", "cope_core.cli.x") \
        == ["cope_core.llamacpp.placement.fit.fit"]
    assert deep_imports("from ..llamacpp import fit", "cope_core.export.x") \
        == ["cope_core.llamacpp.fit"]
    assert deep_imports("from ..llamacpp import placement", "cope_core.export.x") \
        == ["cope_core.llamacpp.placement"]
    assert deep_imports("import cope_core.llamacpp.placement.command as c", "benchmarks.b") \
        == ["cope_core.llamacpp.placement.command"]
    assert deep_imports("from .llamacpp import cache_lines", "cope_core.export.advising") == []
    assert deep_imports("from ..llamacpp import LlamaFlags, share_text", "cope_core.app.v") \
        == []


def test_nothing_outside_the_package_imports_past_its_face():
    bad = {}
    for p in _user_files():
        if found := deep_imports(p.read_text(), _module_of(p), p.name == "__init__.py"):
            bad[str(p.relative_to(ROOT))] = found
    assert not bad, bad


def test_every_name_of_the_face_is_used_outside_the_package():
    used = set()
    for p in _user_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and \
                    _absolute(node, _module_of(p), p.name == "__init__.py") == PACKAGE:
                used |= {a.name for a in node.names}
    assert set(face.__all__) - used == set()
