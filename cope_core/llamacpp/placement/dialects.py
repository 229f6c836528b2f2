"""The runtimes of the llama.cpp family whose command lines :mod:`.command` writes, each a
:class:`Dialect` of the same flags (mainline ggml-org/llama.cpp and ikawrakow/ik_llama.cpp; the
sources are named in :mod:`.command`'s docstring), and the routed-expert tensor patterns each
names."""
from __future__ import annotations

from dataclasses import dataclass

#: The routed-expert tensors llama.cpp's own ``--n-cpu-moe`` matches (``LLM_FFN_EXPS_REGEX``).
EXPERT_TENSORS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: A block's routed experts as ik_llama.cpp's ``-ncmoe`` names them, weights and scales
#: (src/llama-load-tensors.cpp @ da2293ded).
IK_EXPERT_TENSORS = r"\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)"


@dataclass(frozen=True)
class Dialect:
    """How one runtime of the llama.cpp family spells the flags written here (module
    docstring): its ``--n-cpu-moe``, what ``fit`` off and on write (and whether ``-fitt``
    exists), the explicit override of a set of blocks (``head`` + blocks + ``tail``), ``-ngl``
    for every layer, and the keys of :data:`_ORDER` it has for ``server`` (None: all) and
    whether its llama-bench is written here."""

    name: str
    n_cpu_moe: str
    fit_off: tuple[str, ...]
    fit_on: tuple[str, ...]
    fit_margin: bool
    ot_head: str
    ot_tail: str
    every_layer: int
    keys: tuple[str, ...] | None = None
    bench: bool = True


#: mainline llama.cpp (ggml-org/llama.cpp)
MAINLINE = Dialect("llama.cpp", "--n-cpu-moe", ("-fit", "off"), ("--fit", "on"), True,
                   r"^blk\.", EXPERT_TENSORS, 99)
#: ik_llama.cpp: -ncmoe takes the last N, no -fit off, its own expert pattern, -ngl 999
IK = Dialect("ik_llama.cpp", "-ncmoe", (), ("--fit",), False, r"blk\.", IK_EXPERT_TENSORS, 999,
             keys=("ctx", "ngl", "fit", "threads", "n_cpu_moe", "ot", "no_mmap"), bench=False)
DIALECTS = {d.name: d for d in (MAINLINE, IK)}
