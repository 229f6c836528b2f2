"""Whole-layer placement shared by the layer-granular runtimes (llama.cpp, ik_llama.cpp, fastllm,
exllamav3, KTransformers, vLLM): the one placement rule and its record live in
:mod:`cope_core.placement` (docs/design.md#layer-placement); here, how blocks are written.
"""
from __future__ import annotations


def describe_blocks(blocks: tuple[int, ...]) -> str:
    """``"blocks 1-20"``, ``"block 4"`` or ``"no blocks"`` for a contiguous run."""
    if not blocks:
        return "no blocks"
    if len(blocks) == 1:
        return f"block {blocks[0]}"
    return f"blocks {blocks[0]}-{blocks[-1]}"


# --- a regular expression for a set of block numbers ------------------------------------------
def int_set_regex(values) -> str:
    """A group ``(...)`` matching exactly the decimal forms of ``values`` (no leading zeros).

    Only ``|``, ``[a-b]`` classes and parentheses are used, so the same text works in Python
    ``re`` (KTransformers) and in C++ ``std::regex`` ECMAScript (llama.cpp), and it holds no
    comma (llama.cpp splits ``-ot`` on commas) and no ``=``.
    """
    vals = sorted({int(v) for v in values})
    if not vals or vals[0] < 0:
        raise ValueError("expected a non-empty set of non-negative integers")
    parts: list[str] = []
    start = prev = vals[0]
    for v in vals[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts += _range_regex(start, prev)
        if v is not None:
            start = prev = v
    return "(" + "|".join(parts) + ")"


def _range_regex(lo: int, hi: int) -> list[str]:
    out: list[str] = []
    while len(str(lo)) < len(str(hi)):  # split at each change in digit count
        top = 10 ** len(str(lo)) - 1
        out += _same_length(str(lo), str(top))
        lo = top + 1
    return out + _same_length(str(lo), str(hi))


def _same_length(a: str, b: str) -> list[str]:
    """Patterns for the equal-length digit strings ``a .. b`` (inner digits may be 0)."""
    if a == b:
        return [a]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + p for p in _same_length(a[1:], b[1:])]
    rest = len(a) - 1
    head: list[str] = []
    tail: list[str] = []
    first, last = int(a[0]), int(b[0])
    if a[1:] != "0" * rest:           # a partial run under a's first digit
        head = [a[0] + p for p in _same_length(a[1:], "9" * rest)]
        first += 1
    if b[1:] != "9" * rest:           # a partial run under b's first digit
        tail = [b[0] + p for p in _same_length("0" * rest, b[1:])]
        last -= 1
    middle = []
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        middle = [digit + "[0-9]" * rest]
    return head + middle + tail
