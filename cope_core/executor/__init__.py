"""The reference executor: every candidate run for real over a routing trace.

It writes :class:`~cope_core.measurements.Measurements` records (re-exported here). Everything
else loads lazily: the decoder's torch mechanisms must not load before ``cope measure`` has set
the OpenMP wait policy (:func:`cope_core.cli.measure_cmd.prepare_threads`).
"""
from __future__ import annotations

import importlib
from typing import Any

from ..measurements import Measurements

_LAZY = {"CandidateDecoder": "decode", "LayerRecord": "decode", "PromptRun": "decode",
         "ExecutorSettings": "cell", "measure": "run"}

__all__ = ["CandidateDecoder", "ExecutorSettings", "LayerRecord", "Measurements", "PromptRun",
           "measure"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
