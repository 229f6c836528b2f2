"""Whole-layer placement shared by the layer-granular runtimes (llama.cpp, KTransformers, vLLM).

Runtimes name transformer *blocks* (``blk.N`` in GGUF, ``model.layers.N`` in Hugging Face modules),
and N counts a dense prefix too, while COPE counts MoE layers ``0 .. L-1``; MoE layer ``l`` is block
``dense_layers + l``. The layer partition (docs/design.md#the-policy-matrix) runs the *first*
``N_cpu`` MoE layers on the CPU; ``N_gpu = floor(K * L / E)`` layers fit the same VRAM as ``K``
slots per layer.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..geometry import ModelGeometry


@dataclass(frozen=True)
class LayerPlan:
    """Which MoE layers, and which blocks, sit on each side of a layer partition.

    Attributes
    ----------
    n_cpu, n_gpu : int
        MoE layers on the CPU (the first ones) and on the GPU (the rest).
    dense_layers : int
        Leading dense blocks (always on the GPU; they hold no routed experts).
    """

    n_cpu: int
    n_gpu: int
    dense_layers: int

    @property
    def n_layers(self) -> int:
        return self.n_cpu + self.n_gpu

    @property
    def n_blocks(self) -> int:
        """Transformer blocks of the whole model (dense prefix included)."""
        return self.dense_layers + self.n_layers

    @property
    def cpu_blocks(self) -> tuple[int, ...]:
        return tuple(range(self.dense_layers, self.dense_layers + self.n_cpu))

    @property
    def gpu_blocks(self) -> tuple[int, ...]:
        return tuple(range(self.dense_layers + self.n_cpu, self.n_blocks))

    @property
    def n_cpu_moe(self) -> int:
        """llama.cpp's ``--n-cpu-moe``: it counts blocks from the first, dense ones included."""
        return self.dense_layers + self.n_cpu if self.n_cpu else 0


def layer_plan(geometry: ModelGeometry, experts_per_layer: int) -> LayerPlan:
    """The layer partition that fits the VRAM of ``experts_per_layer`` slots per MoE layer."""
    L, E = geometry.n_layers, geometry.n_experts
    n_gpu = min(experts_per_layer * L // E, L)
    return LayerPlan(n_cpu=L - n_gpu, n_gpu=n_gpu, dense_layers=geometry.dense_layers)


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
