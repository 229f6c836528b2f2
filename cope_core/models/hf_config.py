"""A model's geometry from a Hugging Face ``config.json``, in the format the user will run
(docs/design.md#model-files).

Parameter counts follow the transformers modelling code of each family (5.24: the attention's
projections, biases and norms, MLA's low-rank projections, the router, shared experts, leading
dense blocks, embeddings and LM head); the tests check them against the real model classes.
Without ``quant`` the weights are stored in the config's ``torch_dtype``; with one of
llama-quantize's presets the geometry is :func:`cope_core.models.formats.apply_preset`'s.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ..errors import CopeInputError
from ..geometry import ExpertTensors, ModelGeometry
from .formats import apply_preset
from .gguf_file import ModelFile

#: model_type -> the key of its expert width (``intermediate_size`` where the config has no
#: separate MoE width); the expert count and top-k are read from any of :data:`EXPERT_KEYS`
#: and :data:`TOPK_KEYS` (transformers 5 saves Qwen3-MoE's ``num_experts`` as
#: ``num_local_experts``).
FAMILIES: dict[str, str] = {
    "qwen3_moe": "moe_intermediate_size", "qwen2_moe": "moe_intermediate_size",
    "deepseek_v2": "moe_intermediate_size", "deepseek_v3": "moe_intermediate_size",
    "glm4_moe": "moe_intermediate_size", "mixtral": "intermediate_size",
    "olmoe": "intermediate_size", "gpt_oss": "intermediate_size",
}
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token")
_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}


def read_hf_config(path: str | os.PathLike, quant: str | None = None) -> ModelFile:
    """Read a model folder's ``config.json`` (or the file itself) into a :class:`ModelFile`.

    Parameters
    ----------
    path : a model folder or its ``config.json``.
    quant : a llama-quantize preset (``Q4_K_M``, ``Q8_0``, ``MXFP4_MOE``, ...) the user will
        run; ``None`` keeps the checkpoint's ``torch_dtype``.
    """
    src = os.fspath(path)
    file = os.path.join(src, "config.json") if os.path.isdir(src) else src
    try:
        with open(file, encoding="utf-8") as fh:
            c = json.load(fh)
    except json.JSONDecodeError as exc:
        raise CopeInputError(f"not valid JSON ({exc.msg} at line {exc.lineno})",
                             source=file, field="config") from None
    if not isinstance(c, Mapping):
        raise CopeInputError("expected a JSON object", source=file, field="config")
    mt = c.get("model_type")
    if mt is None:
        raise CopeInputError("missing key", source=file, field="model_type")
    if mt not in FAMILIES:
        raise CopeInputError(f"unknown model_type {mt!r}; COPE reads {sorted(FAMILIES)}",
                             source=file, field="model_type")
    g = geometry_from_config(c, quant, source=file,
                             name=os.path.basename(os.path.dirname(os.path.abspath(file))))
    details = (("model_type", str(mt)), ("format", g.format_name))
    return ModelFile(g, file, "hf-config", str(mt), details)


def _get(c: Mapping[str, Any], key: str | tuple[str, ...], src: str | None,
         default: Any = None) -> Any:
    keys = (key,) if isinstance(key, str) else key
    v = next((c[k] for k in keys if c.get(k) is not None), default)
    if v is None:
        raise CopeInputError("missing key", source=src, field=" or ".join(keys))
    if not isinstance(v, (int, float, bool, list)):
        raise CopeInputError(f"expected a number, got {v!r}", source=src, field=" or ".join(keys))
    return v


def _dense_blocks(c: Mapping[str, Any], mt: str, L: int) -> list[int]:
    """Indices of the blocks whose MLP is dense (as the modelling code decides)."""
    if mt in ("deepseek_v2", "deepseek_v3", "glm4_moe"):
        return list(range(int(c.get("first_k_dense_replace") or 0)))
    if mt in ("qwen2_moe", "qwen3_moe"):
        only = set(c.get("mlp_only_layers") or [])
        step = int(c.get("decoder_sparse_step") or 1)
        return [i for i in range(L) if i in only or (i + 1) % step != 0]
    return []


def non_expert_counts(c: Mapping[str, Any], src: str | None = None) -> dict[str, int]:
    """Parameters per kind of non-expert tensor: ``matrix`` (2-D), ``vector`` (biases, norms,
    sinks), ``embed`` and ``head`` (0 when tied)."""
    mt = c["model_type"]
    L, hidden = int(_get(c, "num_hidden_layers", src)), int(_get(c, "hidden_size", src))
    heads = int(_get(c, "num_attention_heads", src))
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or hidden // heads)
    E = int(_get(c, EXPERT_KEYS, src))
    vocab = int(_get(c, "vocab_size", src))
    dense = _dense_blocks(c, mt, L)
    mat = vec = 0
    if mt in ("deepseek_v2", "deepseek_v3"):
        nope, rope = int(_get(c, "qk_nope_head_dim", src)), int(_get(c, "qk_rope_head_dim", src))
        vdim, kvr = int(_get(c, "v_head_dim", src)), int(_get(c, "kv_lora_rank", src))
        qr = c.get("q_lora_rank")
        qk = heads * (nope + rope)
        q = (hidden * qr + qr * qk, qr) if qr else (hidden * qk, 0)
        mat += L * (q[0] + hidden * (kvr + rope) + kvr * heads * (nope + vdim)
                    + heads * vdim * hidden)
        vec += L * (q[1] + kvr)
    else:
        mat += L * (2 * hidden * heads * hd + 2 * hidden * kv * hd)
        bias = {"qwen2_moe": True, "gpt_oss": True}.get(mt, bool(c.get("attention_bias")))
        if bias:
            vec += L * (heads * hd + 2 * kv * hd)
            if mt == "gpt_oss":
                vec += L * (hidden + heads)      # o_proj bias and the attention sinks
        if mt == "qwen3_moe" or (mt == "glm4_moe" and c.get("use_qk_norm")):
            vec += L * 2 * hd
        if mt == "olmoe":
            vec += L * (heads * hd + kv * hd)
    vec += L * 2 * hidden + hidden               # two norms per block and the final norm
    moe = L - len(dense)
    mat += moe * E * hidden                      # the routers
    if mt == "gpt_oss":
        vec += moe * E
    if mt in ("deepseek_v3", "glm4_moe"):
        vec += moe * E                           # e_score_correction_bias
    inter = int(_get(c, FAMILIES[mt], src))
    if mt == "qwen2_moe":
        sh = int(c.get("shared_expert_intermediate_size") or 0)
        mat += moe * (3 * hidden * sh + (hidden if sh else 0))
    elif c.get("n_shared_experts"):
        mat += moe * 3 * hidden * inter * int(c["n_shared_experts"])
    if dense:
        mat += len(dense) * 3 * hidden * int(_get(c, "intermediate_size", src))
    head = 0 if c.get("tie_word_embeddings") else vocab * hidden
    return {"matrix": mat, "vector": vec, "embed": vocab * hidden, "head": head}


def geometry_from_config(c: Mapping[str, Any], quant: str | None = None, *,
                         source: str | None = None, name: str = "model") -> ModelGeometry:
    """The :class:`ModelGeometry` of a parsed ``config.json`` (see :func:`read_hf_config`)."""
    mt = str(c["model_type"])
    L, hidden = int(_get(c, "num_hidden_layers", source)), int(_get(c, "hidden_size", source))
    E, top_k, inter = (int(_get(c, k, source)) for k in (EXPERT_KEYS, TOPK_KEYS, FAMILIES[mt]))
    heads = int(_get(c, "num_attention_heads", source))
    dense = _dense_blocks(c, mt, L)
    moe_blocks = [i for i in range(L) if i not in dense]
    if mt in ("deepseek_v2", "deepseek_v3"):
        kv, hd = heads, int(_get(c, "v_head_dim", source))
    else:
        kv = int(c.get("num_key_value_heads") or heads)
        hd = int(c.get("head_dim") or hidden // heads)
    shared = int(c.get("n_shared_experts") or 0)
    if mt == "qwen2_moe" and c.get("shared_expert_intermediate_size"):
        shared = max(1, round(int(c["shared_expert_intermediate_size"]) / inter))
    counts = non_expert_counts(c, source)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    width = _DTYPES.get(dtype, 2)
    # gpt-oss experts carry biases: 2 * inter (fused gate and up) and hidden (down) each
    bias = (inter, inter, hidden) if mt == "gpt_oss" else (0, 0, 0)
    common: dict[str, Any] = dict(
        name=name, n_layers=len(moe_blocks), n_experts=E, top_k=top_k, hidden=hidden,
        expert_intermediate=inter, n_shared_experts=shared, dense_layers=len(dense),
        n_heads=heads, n_kv_heads=kv, head_dim=hd, vocab=int(_get(c, "vocab_size", source)))
    ne = sum(counts.values())
    if quant is not None:
        dense_g = ModelGeometry(**common, dtype_bytes=2, non_expert_bytes=2 * ne)
        return apply_preset(dense_g, quant, vector_params=counts["vector"],
                            tied_head=counts["head"] == 0, expert_bias=bias)
    if any(bias):
        t = dtype_name(dtype)
        layers = tuple(ExpertTensors(t, t, t, *(hidden * inter * width + b * width for b in bias))
                       for _ in moe_blocks)
        return ModelGeometry(**common, dtype_bytes=width, non_expert_bytes=ne * width,
                             weight_format=t, expert_layers=layers, non_expert_params=ne)
    return ModelGeometry(**common, dtype_bytes=width, non_expert_bytes=ne * width)


def dtype_name(torch_dtype: str) -> str:
    return {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(torch_dtype, "BF16")
