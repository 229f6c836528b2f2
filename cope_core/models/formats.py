"""A geometry in a llama-quantize preset: one rule for a catalog entry and an HF config
(docs/design.md#bytes-as-stored)."""
from __future__ import annotations

import dataclasses

from ..errors import CopeInputError
from ..geometry import ExpertTensors, ModelGeometry
from ..weight_formats import (
    FLOAT_TYPES,
    PRESETS,
    bits_per_weight,
    fit_type,
    preset_expert_types,
    preset_other_type,
    tensor_bytes,
    use_more_bits,
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
    # a tied embedding is quantised as the output is (llama-quant.cpp l. 490)
    embed = g.vocab * h if tied_head else 0
    nbytes = ((params - head - embed - f32) * bits_per_weight(other)
              + (head + embed) * bits_per_weight(head_type)) / 8 + 4 * f32 \
        + mix_bytes(g, key, other)
    return dataclasses.replace(g, dtype_bytes=2, weight_format=key, expert_layers=tuple(layers),
                               non_expert_bytes=int(round(nbytes)), non_expert_params=params)


def mix_bytes(g: ModelGeometry, preset: str, other: str) -> float:
    """Bytes llama-quantize's mix gives non-expert matrices beyond the preset's default type
    ``other`` (``llama_tensor_get_type_impl``, src/llama-quant.cpp at b11434):

    - attention-v-like tensors (``attn_v``, ``attn_qkv``; one per block, counted in block
      order: the loader sorts tensors by block, src/llama-model-loader.h l. 54-65) at the
      preset's ``ffn_down`` type where ``use_more_bits`` holds (Q4_K_M, Q5_K_M: l. 590-591);
    - ``ffn_down`` of the shared experts and the dense blocks likewise, by block (l. 624-657);
    - with 8 experts (Mixtral) ``attn_v`` and ``attn_k`` at Q8_0 (l. 597-611) and, under Q4_K_M,
      ``attn_output`` at Q5_K (l. 669-676).

    Only for a quantised default type (a float preset is never mixed, l. 757-770); MXFP4_MOE
    stores every non-expert matrix at Q8_0 (l. 510-523)."""
    base, more = PRESETS[preset]
    if base in FLOAT_TYPES or preset == "MXFP4_MOE":
        return 0.0
    rows, h = g.attention_blocks, g.hidden

    def up(params: float, to: str, row: int) -> float:
        return params * (bits_per_weight(fit_type(to, row)) - bits_per_weight(other)) / 8
    out = 0.0
    if g.n_experts == 8:
        kvd, qd = g.n_kv_heads * g.head_dim, g.n_heads * g.head_dim
        full = sum(1 for r in rows if r.k_values)
        out += up(full * 2 * kvd * h, "Q8_0", h)
        if preset == "Q4_K_M":
            out += up(full * qd * h, "Q5_K", qd)
    elif more:
        v_like = [r.v_params for r in rows if r.v_params]
        out += sum(up(p, more, h) for i, p in enumerate(v_like) if use_more_bits(i, len(v_like)))
    if more:
        n = len(rows)
        for b in range(n):
            if not use_more_bits(b, n):
                continue
            if b < g.dense_layers:
                out += up(h * g.dense_intermediate, more, g.dense_intermediate)
            elif g.n_shared_experts:
                out += up(g.n_shared_experts * h * g.expert_intermediate, more,
                          g.expert_intermediate)
    return out
