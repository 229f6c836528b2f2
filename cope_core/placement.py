"""Whole-layer placement: which MoE layers' routed experts fit a VRAM budget on the GPU
(docs/design.md#layer-placement), and the number each runtime's flag takes for it.

The one rule: at a budget of ``B`` bytes for routed experts, the GPU holds the most MoE layers
whose stored experts (``E`` times the layer's bytes per expert,
:attr:`~cope_core.geometry.ModelGeometry.layer_expert_bytes`) fit in ``B``, taken from the side
the runtime keeps on the GPU; the other layers' experts stay on the CPU. ``K`` slots per layer
are worth :func:`k_budget_bytes` (``K`` experts in every MoE layer, what fixed residency at ``K``
stores). Quantised files store layers in different bytes (Qwen3-30B-A3B Q4_K_M: Q6_K or Q4_K
``ffn_down``), so the count that fits depends on which side goes to the CPU.

Runtimes name transformer *blocks* (``blk.N`` in GGUF, ``model.layers.N`` in Hugging Face
modules), and N counts a dense prefix too, while COPE counts MoE layers ``0 .. L-1``; MoE layer
``l`` is block ``dense_layers + l``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .errors import CopeInputError
from .geometry import ModelGeometry


class CpuSide(str, Enum):
    """Which MoE layers a runtime's whole-layer flag puts on the CPU."""

    FIRST = "first"
    LAST = "last"


class LayerFlag(Enum):
    """A runtime's whole-layer flag: the side it puts on the CPU, and whether its N counts the
    dense prefix blocks (the citations are in each export module)."""

    #: mainline llama.cpp ``--n-cpu-moe N``: blocks ``0 .. N-1``, dense prefix included
    #: (``common/common.h`` @ b11434); COPE's ``layer_partition`` is this side
    LLAMACPP = ("--n-cpu-moe", CpuSide.FIRST, True)
    #: ik_llama.cpp ``-ncmoe N``: the last N blocks that hold experts (PR #2262)
    IK_LLAMACPP = ("-ncmoe", CpuSide.LAST, False)
    #: fastllm ``--moe_device_layers N``: the last N MoE layers (ftllm 1.9.0 ``util.py``)
    FASTLLM = ("--moe_device_layers", CpuSide.LAST, False)
    #: exllamav3 ``-mcl N``: the first N block-sparse MoE layers (1.6.5 ``model_init.py``)
    EXLLAMAV3 = ("-mcl", CpuSide.FIRST, False)

    def __init__(self, flag: str, side: CpuSide, counts_dense: bool):
        self.flag, self.side, self.counts_dense = flag, side, counts_dense


def k_budget_bytes(g: ModelGeometry, experts_per_layer: int) -> int:
    """Bytes of routed experts ``K`` slots per layer are worth: ``K`` experts of every MoE
    layer as stored, ``K * sum(layer_expert_bytes)`` (:meth:`ModelGeometry.per_k_bytes`)."""
    K = int(experts_per_layer)
    if not 0 <= K <= g.n_experts:
        raise CopeInputError(f"experts per layer must be in [0, {g.n_experts}], got {K}",
                             field="experts_per_layer")
    return K * g.per_k_bytes


def gpu_layers(n_layers: int, n_cpu: int, side: CpuSide) -> range:
    """MoE layer indices on the GPU when ``n_cpu`` layers of ``side`` are on the CPU."""
    return range(n_cpu, n_layers) if side is CpuSide.FIRST else range(0, n_layers - n_cpu)


def gpu_expert_bytes(g: ModelGeometry, n_cpu: int, side: CpuSide = CpuSide.FIRST) -> int:
    """VRAM of the routed experts of the GPU layers (every expert of each, as stored)."""
    per = g.layer_expert_bytes
    return g.n_experts * sum(per[i] for i in gpu_layers(g.n_layers, n_cpu, side))


@dataclass(frozen=True)
class LayerPlan:
    """Which MoE layers, and which blocks, sit on each side of a whole-layer placement.

    Attributes
    ----------
    n_cpu, n_gpu : int
        MoE layers on the CPU (those of ``side``) and on the GPU (the rest).
    dense_layers : int
        Leading dense blocks (always on the GPU; they hold no routed experts).
    side : CpuSide
        Which MoE layers are on the CPU: the first (COPE's ``layer_partition``) or the last.
    gpu_bytes, budget_bytes : int
        Routed-expert bytes of the GPU layers, and the budget they fit.
    """

    n_cpu: int
    n_gpu: int
    dense_layers: int
    side: CpuSide = CpuSide.FIRST
    gpu_bytes: int = 0
    budget_bytes: int = 0

    @property
    def n_layers(self) -> int:
        return self.n_cpu + self.n_gpu

    @property
    def n_blocks(self) -> int:
        """Transformer blocks of the whole model (dense prefix included)."""
        return self.dense_layers + self.n_layers

    @property
    def cpu_blocks(self) -> tuple[int, ...]:
        gpu = set(self.gpu_blocks)
        return tuple(b for b in range(self.dense_layers, self.n_blocks) if b not in gpu)

    @property
    def gpu_blocks(self) -> tuple[int, ...]:
        return tuple(self.dense_layers + i
                     for i in gpu_layers(self.n_layers, self.n_cpu, self.side))

    def flag_value(self, flag: LayerFlag) -> int:
        """The N ``flag`` takes for this placement (``flag.side`` must be this plan's side)."""
        if flag.side is not self.side:
            raise ValueError(f"{flag.flag} puts the {flag.side.value} layers on the CPU; this "
                             f"plan the {self.side.value}")
        return self.dense_layers + self.n_cpu if flag.counts_dense and self.n_cpu else self.n_cpu

    @property
    def n_cpu_moe(self) -> int:
        """llama.cpp's ``--n-cpu-moe``: it counts blocks from the first, dense ones included."""
        return self.flag_value(LayerFlag.LLAMACPP)


def fit_layers(g: ModelGeometry, budget_bytes: float,
               side: CpuSide = CpuSide.FIRST) -> LayerPlan:
    """The most GPU MoE layers (taken from the side opposite ``side``) whose stored routed
    experts fit ``budget_bytes``; the others' experts on the CPU."""
    L = g.n_layers
    n_cpu = next((n for n in range(L + 1) if gpu_expert_bytes(g, n, side) <= budget_bytes), L)
    return LayerPlan(n_cpu=n_cpu, n_gpu=L - n_cpu, dense_layers=g.dense_layers, side=side,
                     gpu_bytes=gpu_expert_bytes(g, n_cpu, side),
                     budget_bytes=int(max(budget_bytes, 0)))


def layer_plan(g: ModelGeometry, experts_per_layer: int,
               side: CpuSide = CpuSide.FIRST) -> LayerPlan:
    """The whole-layer placement that fits the bytes of ``experts_per_layer`` slots per layer
    (:func:`k_budget_bytes`), with ``side``'s layers on the CPU."""
    return fit_layers(g, k_budget_bytes(g, experts_per_layer), side)


# --- how a runtime writes a set of blocks ------------------------------------------------------
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
