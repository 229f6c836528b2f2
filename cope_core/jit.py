"""The options every numba kernel of the package compiles with: release the GIL (the replay runs
residencies on threads), cache the machine code on disk (a fresh process loads it instead of
compiling), no bounds checks (the Python wrappers validate every array first)."""
from __future__ import annotations

from typing import Any

NJIT: dict[str, Any] = {"nogil": True, "cache": True, "boundscheck": False}
