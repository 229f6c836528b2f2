"""Stored weight formats: the exact bytes a tensor takes in a ggml type, llama-quantize's choice
of type per routed-expert projection for its common presets, and how fast a CPU streams each
type (docs/design.md#bytes-as-stored).

Block sizes and bytes per block are the ``gguf`` package's own table (``GGML_QUANT_SIZES``, the
copy of ggml's that llama.cpp's gguf-py ships), so a byte count here is the one in a GGUF file.
The presets follow ``llama_tensor_get_type_impl`` and ``tensor_type_fallback`` of llama.cpp's
``src/llama-quant.cpp`` at tag b11434 (ggml-org/llama.cpp): a preset's default type for every
projection, ``Q6_K`` for ``ffn_down`` where ``use_more_bits`` holds (``Q4_K_M``, ``Q5_K_M``),
MXFP4 for the experts of ``MXFP4_MOE``, and the fallback when a row is not a whole number of
blocks.
"""
from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from .errors import CopeInputError

#: The 16-bit and 32-bit float types: a kernel on them does no dequantising.
FLOAT_TYPES = ("F32", "F16", "BF16")

#: Per-core streaming rate of a type's CPU decode kernel (matrix-vector product, dequantising
#: on the fly) relative to the 16-bit kernel's: mainline llama.cpp's llama-bench TG on an M2 Max
#: CPU at 3-4 threads, bytes per second of each type over F16's (ik_llama.cpp discussion #164,
#: LLaMA-3.1-8B; docs/design.md#bytes-as-stored). MXFP4 takes IQ4_NL's: ggml's CPU kernels
#: dot both through the same 16-entry lookup table. It limits the cores, not the memory: an
#: analytic CPU streams ``min(memory bandwidth, efficiency * threads * per-thread bandwidth)``,
#: so with enough threads every type is memory-bound (as an EPYC 9554's Q4_K_M..Q8_0 runs are).
CPU_EFFICIENCY: dict[str, float] = {
    "F32": 1.0, "F16": 1.0, "BF16": 1.0,
    "Q8_0": 0.95, "Q4_0": 0.88, "IQ4_NL": 0.86, "MXFP4": 0.86,
    "Q4_K": 0.65, "Q6_K": 0.60, "IQ4_XS": 0.56, "Q5_K": 0.54, "Q5_0": 0.54,
}
#: Types with no published measurement: the lowest efficiency above, stated as an assumption.
CPU_EFFICIENCY_DEFAULT = min(CPU_EFFICIENCY.values())


def type_names() -> list[str]:
    """Every ggml type the gguf package knows, by name."""
    return [t.name for t in GGML_QUANT_SIZES]


def ggml_type(name: str, field: str = "type") -> GGMLQuantizationType:
    """The ggml type called ``name`` (case-insensitive), or a one-line error listing them."""
    try:
        return GGMLQuantizationType[name.upper()]
    except KeyError:
        raise CopeInputError(f"unknown weight type {name!r}; expected one of {type_names()}",
                             field=field) from None


def tensor_bytes(type_name: str, n_elements: int, row: int | None = None) -> int:
    """Exact bytes of ``n_elements`` weights stored as ``type_name``; ``row`` (the tensor's
    first dimension) must be a whole number of the type's blocks."""
    t = ggml_type(type_name)
    block, size = GGML_QUANT_SIZES[t]
    if (row if row is not None else n_elements) % block:
        raise CopeInputError(f"{type_name} stores blocks of {block} weights; a row of "
                             f"{row if row is not None else n_elements} is not a whole number "
                             "of them", field="type")
    return n_elements // block * size


def bits_per_weight(type_name: str) -> float:
    block, size = GGML_QUANT_SIZES[ggml_type(type_name)]
    return 8.0 * size / block


def cpu_efficiency(type_name: str) -> float:
    """Relative CPU streaming efficiency of ``type_name`` (:data:`CPU_EFFICIENCY`)."""
    return CPU_EFFICIENCY.get(type_name.upper(), CPU_EFFICIENCY_DEFAULT)


def file_type_name(value: int) -> str:
    """``general.file_type`` as llama.cpp names it (``15`` -> ``"Q4_K_M"``)."""
    try:
        name = LlamaFileType(int(value)).name
    except ValueError:
        return f"file type {int(value)}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


# --- llama-quantize presets (src/llama-quant.cpp, b11434) ---------------------------------------
#: preset -> (default type, ffn_down type where use_more_bits holds or None)
PRESETS: dict[str, tuple[str, str | None]] = {
    "F16": ("F16", None), "BF16": ("BF16", None), "Q8_0": ("Q8_0", None),
    "Q6_K": ("Q6_K", None), "Q5_K_M": ("Q5_K", "Q6_K"), "Q5_K_S": ("Q5_K", None),
    "Q4_K_M": ("Q4_K", "Q6_K"), "Q4_0": ("Q4_0", None), "MXFP4_MOE": ("MXFP4", None),
}
#: ``tensor_type_fallback``: the type a 256-block type becomes when a row is not whole blocks.
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0",
            "IQ4_XS": "IQ4_NL"}


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quantize's choice of the blocks whose ``ffn_down`` gets more bits."""
    return (i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8
            or (i_layer - n_layers // 8) % 3 == 2)


def fit_type(type_name: str, row: int) -> str:
    """``type_name``, or llama-quantize's fallback when ``row`` is not a whole number of its
    blocks (F16 when the fallback does not fit either)."""
    block = GGML_QUANT_SIZES[ggml_type(type_name)][0]
    if row % block == 0:
        return type_name
    alt = FALLBACK.get(type_name, type_name)
    return alt if row % GGML_QUANT_SIZES[ggml_type(alt)][0] == 0 else "F16"


def preset_expert_types(preset: str, block: int, n_blocks: int, hidden: int,
                        inter: int) -> tuple[str, str, str]:
    """Types of gate, up and down of the routed experts of transformer block ``block`` (of
    ``n_blocks``) under a llama-quantize preset. gate and up rows have ``hidden`` weights,
    down rows ``inter``."""
    key = preset.upper()
    if key not in PRESETS:
        raise CopeInputError(f"unknown format {preset!r}; expected one of {sorted(PRESETS)}",
                             field="--quant")
    base, more = PRESETS[key]
    down = more if more and use_more_bits(block, n_blocks) else base
    return fit_type(base, hidden), fit_type(base, hidden), fit_type(down, inter)


def preset_other_type(preset: str) -> str:
    """The type of the non-expert matrices under a preset (its default; MXFP4_MOE keeps them
    at Q8_0)."""
    base = PRESETS[preset.upper()][0]
    return "Q8_0" if preset.upper() == "MXFP4_MOE" else base
