"""The values of a llama-bench row, checked one by one: each failure a one-line error naming the
file, the line and the field (:mod:`.bench_file` reads the rows)."""
from __future__ import annotations

import math
from typing import Any

from ...errors import CopeInputError
from ..answer.prompt_rates import DEFAULT_LOAD_MODE, LOAD_MODES


def fail(src: str, line: int, field: str | None, message: str) -> CopeInputError:
    return CopeInputError(f"line {line}: {message}", source=src, field=field)


def as_int(src: str, line: int, field: str, value: Any, least: int | None = None) -> int:
    """A whole number (at least ``least`` when given)."""
    want = "a whole number" + ("" if least is None else f" >= {least}")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise fail(src, line, field, f"expected {want}, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise fail(src, line, field, f"expected {want}, got {value!r}") from None
    if least is not None and n < least:
        raise fail(src, line, field, f"expected {want}, got {value!r}")
    return n


def as_float(src: str, line: int, field: str, value: Any, *, positive: bool = False) -> float:
    try:
        x = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise fail(src, line, field, f"expected a finite number of tokens per second "
                    f"{'> 0' if positive else '>= 0'}, got {value!r}")
    return x


def as_bool(src: str, line: int, field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("0", "1", 0, 1):    # CSV: std::to_string(bool); JSON's no_op_offload: an int
        return value in ("1", 1)
    raise fail(src, line, field, f"expected true/false (or 0/1), got {value!r}")


def read_load_mode(src: str, line: int, v: dict[str, Any]) -> str:
    """llama-bench's ``load_mode`` (b10105 on), else its older ``use_mmap`` (true: ``mmap``,
    false: ``none``), else its default ``auto``."""
    if "load_mode" in v:
        mode = str(v["load_mode"])
        if mode not in LOAD_MODES:
            raise fail(src, line, "load_mode", f"expected one of {', '.join(LOAD_MODES)}, got "
                       f"{mode!r}")
        return mode
    if "use_mmap" in v:
        return "mmap" if as_bool(src, line, "use_mmap", v["use_mmap"]) else "none"
    return DEFAULT_LOAD_MODE


#: llama-bench's split modes (``split_mode_str``, tools/llama-bench/llama-bench.cpp of b11434)
SPLIT_MODES = ("none", "layer", "row", "tensor")


def read_devices(src: str, line: int, v: dict[str, Any]
                 ) -> tuple[str, tuple[float, ...], str, int]:
    """llama-bench's ``devices`` (``auto``, ``none`` or names joined by ``/``,
    ``devices_to_string``), ``tensor_split`` (``%.2f`` values joined by ``/`` up to the last
    non-zero one), ``split_mode`` and ``main_gpu``; each its default where an older build did
    not write it (tools/llama-bench/llama-bench.cpp l. 198-215, 1598-1698 of b11434)."""
    devices = str(v.get("devices", "auto")) or "auto"
    text = str(v.get("tensor_split", "0.00")).strip()
    try:
        split = tuple(float(x) for x in text.split("/")) if text else (0.0,)
    except ValueError:
        raise fail(src, line, "tensor_split", f"expected numbers joined by '/', got {text!r}"
                   ) from None
    if any(not math.isfinite(x) or x < 0 for x in split):
        raise fail(src, line, "tensor_split", f"expected numbers >= 0, got {text!r}")
    mode = str(v.get("split_mode", "layer"))
    if mode not in SPLIT_MODES:
        raise fail(src, line, "split_mode", f"expected one of {', '.join(SPLIT_MODES)}, got "
                   f"{mode!r}")
    return devices, split, mode, as_int(src, line, "main_gpu", v.get("main_gpu", 0), 0)
