"""The ``llamacpp_cache`` object of a cope.policy/1 record: llama.cpp's own MoE expert cache
searched at the policy's VRAM (:func:`cope_core.estimate.llamacpp_cache.cache_record` writes it;
docs/formats.md#policy-copepolicy1). Optional: records written before it existed have none."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import CopeInputError

_CANDIDATES = ("layer_partition", "llamacpp_cache/lru", "llamacpp_cache/classlru")
_BEST = {"candidate": str, "build": str, "cpu_layers": int, "n_cpu_moe": int, "cache_mib": int,
         "cpu_share": float, "slots": int, "tpot_us": float, "hits": float, "uploads": float,
         "cpu_misses": float}


def _number(v: Any, kind: type) -> bool:
    if isinstance(v, bool):
        return False
    if kind is int:
        return isinstance(v, int) and v >= 0
    return isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


def check_cache_record(d: Any, src: str | None) -> None:
    """One-line errors for a malformed ``llamacpp_cache`` object (empty is allowed)."""
    if not isinstance(d, Mapping):
        raise CopeInputError(f"expected an object, got {d!r}", source=src, field="llamacpp_cache")
    if not d:
        return
    where = "llamacpp_cache"
    for key in ("expert_budget_gib", "configurations", "cache_start", "best", "versus"):
        if key not in d:
            raise CopeInputError("missing", source=src, field=f"{where}.{key}")
    if d["cache_start"] not in ("server", "prompt"):
        raise CopeInputError(f"expected 'server' or 'prompt', got {d['cache_start']!r}",
                             source=src, field=f"{where}.cache_start")
    if not isinstance(d["best"], list) or not d["best"]:
        raise CopeInputError("expected a non-empty list", source=src, field=f"{where}.best")
    for i, row in enumerate(d["best"]):
        if not isinstance(row, Mapping) or set(row) != set(_BEST):
            raise CopeInputError(f"expected exactly the keys {sorted(_BEST)}", source=src,
                                 field=f"{where}.best[{i}]")
        for key, kind in _BEST.items():
            ok = (row[key] in _CANDIDATES if key == "candidate" else
                  isinstance(row[key], str) if kind is str else _number(row[key], kind))
            if not ok:
                raise CopeInputError(f"unexpected value {row[key]!r}", source=src,
                                     field=f"{where}.best[{i}].{key}")
    for i, row in enumerate(d["versus"] if isinstance(d["versus"], list) else [None]):
        ok = isinstance(row, Mapping) and isinstance(row.get("name"), str) \
            and _number(row.get("tpot_us"), float) \
            and (row.get("cache_faster") is None or _number(row["cache_faster"], float))
        if not ok:
            raise CopeInputError("expected {name, tpot_us, tpot_ci_us, cache_faster}",
                                 source=src, field=f"{where}.versus[{i}]")
