"""Settings that live in the URL query string, so that a view can be shared as a link.

Each setting has a codec: ``parse`` turns the query-string text into a value (raising
ValueError on nonsense, which then falls back to the default) and ``fmt`` writes it back.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..estimate.costs import ESTIMATORS
from ..matrix import CANDIDATE_IDS, EXECUTIONS, RESIDENCIES
from .compare_view import format_custom, parse_custom


@dataclass(frozen=True)
class Codec:
    """How one setting is read from and written to the query string."""

    parse: Callable[[str], Any]
    fmt: Callable[[Any], str]


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return v


def _choice(options: tuple[str, ...]) -> Codec:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(text)
        return text
    return Codec(parse, str)


def _subset(options: tuple[str, ...]) -> Codec:
    def parse(text: str) -> list[str]:
        items = [t for t in text.split(",") if t]
        if any(t not in options for t in items):
            raise ValueError(text)
        return [o for o in options if o in items]  # canonical order, each once
    return Codec(parse, lambda v: ",".join(v))


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


_TEXT = Codec(str, str)
_NAMES = Codec(lambda t: [x for x in t.split(",") if x], lambda v: ",".join(v))
_FLOAT = Codec(_float, lambda v: f"{float(v):g}")
_INT = Codec(int, lambda v: str(int(v)))
_FLAG = Codec(_flag, lambda v: "1" if v else "0")

#: Every setting the app keeps in the URL.
CODECS: dict[str, Codec] = {
    "example": _TEXT,          # shipped example (model name)
    "profile": _TEXT,          # shipped profile file name, when an example has several
    "vram": _FLOAT,            # VRAM budget in GiB
    "op": _TEXT,               # operating point "THREADS@SHARE"
    "est": _choice(ESTIMATORS),
    "res": _subset(tuple(r.value for r in RESIDENCIES)),
    "exe": _subset(tuple(e.value for e in EXECUTIONS)),
    "lp": _FLAG,               # show the layer-partition baseline
    "cell": _choice(CANDIDATE_IDS),
    "hits": _INT,
    "ncmoe": _INT,             # Landscape: MoE layers on the host for the cache-size sweep
    "cachesweep": _FLAG,       # Landscape: show that sweep
    "cmp": _TEXT,              # compare timeline with this execution ("none" for none)
    "prompt": _INT,
    "verify_cell": _TEXT,      # Predicted vs measured: the verify cell whose race is drawn
    "compare": _TEXT,          # second profile on the Profiles page
    "sort": _FLAG,             # sort experts by popularity on the Traces page
    "cand": _TEXT,             # candidate to export ("best" or an id)
    "strict": _FLAG,           # Export: a runtime that cannot run the candidate is an error
    "plat": _NAMES,            # Compare: platforms (catalog names, "this", "custom")
    "custom": Codec(parse_custom, format_custom),  # Compare: the custom platform's numbers
    # Your machine (sidebar), spelled as the CLI spells a machine: parts of the catalog
    # ("example": the example's own profile;
    # memory or link "default": the CPU's usual memory, the card's own link) and a catalog
    # model's weights ("catalog": as the catalog has it)
    "gpu": _TEXT,
    "more": _TEXT,             # Your machine: the cards beside the GPU (catalog names, a,b)
    "cpu": _TEXT,
    "memory": _TEXT,
    "pcie": _TEXT,
    "quant": _TEXT,
    "ctx": _INT,               # Your machine: context length in tokens (the KV cache)
    "llamacpp": _TEXT,         # the llama.cpp build the answers are for ("latest" or bNNNN)
    "ptok": _INT,              # Your request: prompt tokens (0: rank llama.cpp by decode alone)
    "gtok": _INT,              # Your request: answer tokens
    "ramgib": _INT,            # Your request: host memory, GiB (0: not known, no --load-mode none)
    "yaxis": _choice(("tpot", "request")),   # Landscape: the budget chart's y axis
}


#: Keys that links shared before the machine's one spelling carry, read as the new ones (a link
#: someone saved still opens the same view; the URL is written with the new keys only).
OLD_KEYS: dict[str, str] = {"mem": "memory", "link": "pcie"}


def parse_query(params: dict[str, Any]) -> dict[str, Any]:
    """Values of the known settings found in a query-string mapping; nonsense is dropped; an
    old key (:data:`OLD_KEYS`) stands for its new one when that is absent."""
    out: dict[str, Any] = {}
    for name, codec in CODECS.items():
        raw = params.get(name)
        if raw is None:
            raw = next((params[o] for o, n in OLD_KEYS.items() if n == name and o in params),
                       None)
        if isinstance(raw, list):  # a repeated key: the last one wins, as in st.query_params
            raw = raw[-1] if raw else None
        if raw is None:
            continue
        try:
            out[name] = codec.parse(str(raw))
        except (ValueError, TypeError):
            continue
    return out


def format_setting(name: str, value: Any) -> str:
    return CODECS[name].fmt(value)


def op_key(cpu_threads: int, gpu_share: float) -> str:
    """Text form of an operating point, e.g. ``"32@100"``."""
    return f"{int(cpu_threads)}@{float(gpu_share):g}"


def op_label(cpu_threads: int, gpu_share: float) -> str:
    return f"{int(cpu_threads)} CPU threads · GPU share {float(gpu_share):g}%"
