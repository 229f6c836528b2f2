"""A geometry in a llama-quantize preset: one rule for a catalog entry and an HF config
(docs/design.md#bytes-as-stored)."""
from __future__ import annotations

import dataclasses

from ..errors import CopeInputError
from ..geometry import ExpertTensors, ModelGeometry
from ..weight_formats import (
    PRESETS,
    bits_per_weight,
    fit_type,
    preset_expert_types,
    preset_other_type,
    tensor_bytes,
)

#: The presets ``cope models`` tabulates for every catalog entry.
COMMON = ("BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "MXFP4_MOE")
#: Families whose published GGUFs keep the experts in MXFP4 whatever the file's label (the
#: checkpoint ships them so; llama-quantize converts the rest).
NATIVE_MXFP4 = ("gpt-oss",)


def apply_preset(g: ModelGeometry, preset: str, *, vector_params: int = 0,
                 tied_head: bool = False,
                 expert_bias: tuple[int, int, int] = (0, 0, 0)) -> ModelGeometry:
    """``g`` stored as llama-quantize's ``preset`` would store it.

    The routed experts take the preset's type per projection and block exactly
    (:func:`cope_core.weight_formats.preset_expert_types`; blocks counted with the leading
    dense ones), plus ``expert_bias`` F32 values per projection; the non-expert matrices take
    the preset's default type, the LM head ``Q6_K`` under a K-quant preset, and
    ``vector_params`` (norms, biases) F32.
    """
    key = preset.upper()
    if key not in PRESETS:
        raise CopeInputError(f"unknown format {preset!r}; expected one of {sorted(PRESETS)}",
                             field="--quant")
    if g.stored:
        raise CopeInputError(f"the model is already stored as {g.format_name}", field="--quant")
    h, i, blocks = g.hidden, g.expert_intermediate, g.dense_layers + g.n_layers
    layers = []
    for j in range(g.n_layers):
        tg, tu, td = preset_expert_types(key, g.dense_layers + j, blocks, h, i)
        layers.append(ExpertTensors(tg, tu, td,
                                    tensor_bytes(tg, h * i, h) + 4 * expert_bias[0],
                                    tensor_bytes(tu, h * i, h) + 4 * expert_bias[1],
                                    tensor_bytes(td, h * i, i) + 4 * expert_bias[2]))
    params = g.non_expert_params or g.non_expert_bytes // g.dtype_bytes
    head = 0 if tied_head else g.head_params
    other = fit_type(preset_other_type(key), h)
    head_type = fit_type("Q6_K", h) if PRESETS[key][0].endswith("_K") else other
    f32 = g.n_layers * g.n_experts * g.hidden + vector_params      # routers, norms, biases
    nbytes = ((params - head - f32) * bits_per_weight(other)
              + head * bits_per_weight(head_type)) / 8 + 4 * f32
    return dataclasses.replace(g, dtype_bytes=2, weight_format=key, expert_layers=tuple(layers),
                               non_expert_bytes=int(round(nbytes)), non_expert_params=params)
