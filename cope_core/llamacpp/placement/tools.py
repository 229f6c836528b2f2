"""The environment a llama.cpp tool runs in (the build's own folder on the library path)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def tool_env(exe: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment a llama.cpp tool runs in: the build's own folder first on the library
    path (a build run from its folder finds its libggml there), plus ``extra``."""
    lib = str(exe.parent)
    old = os.environ.get("LD_LIBRARY_PATH")
    return {**os.environ, "LD_LIBRARY_PATH": f"{lib}{os.pathsep}{old}" if old else lib,
            **(extra or {})}
