"""``cope verify``: confirm a predicted pick on the user's machine by measuring only the
contenders (docs/design.md#verifying-a-pick).

:mod:`.record` (the ``cope.verify/1`` record, plain data) loads at once; :mod:`.race` (the
executor's torch side) only when asked for, so the app reads records without torch and
``cope verify`` can set the OpenMP wait policy first.
"""
from __future__ import annotations

import importlib
from typing import Any

from .record import (
    VERIFY_SCHEMA,
    VerifyCell,
    VerifyRecord,
    parse_verify,
    read_verify,
    verify_json,
    write_verify,
)

_LAZY = {"verify": "race", "VerifySettings": "race"}

__all__ = ["VERIFY_SCHEMA", "VerifyCell", "VerifyRecord", "VerifySettings", "parse_verify",
           "read_verify", "verify", "verify_json", "write_verify"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
