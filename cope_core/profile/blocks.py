"""The policy-invariant work of one transformer block per decoded token, by architecture family
(docs/design.md#shared-work-per-architecture).

A block's attention is not priced one way for every model: what one decoded token reads and
computes depends on the family, at the user's context ``x``:

* **full attention** (GQA; Qwen3-MoE, Mixtral, OLMoE, GLM-4.5): Q, K, V and O weights, and K and
  V of every context token, ``2 · kv_heads · head_dim`` values each;
* **multi-head latent attention** (DeepSeek-V2/V3, transformers ``modeling_deepseek_v2.py``:
  ``q_proj`` or ``q_a_proj``/``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``):
  the cache holds the compressed latent and the shared rope key, ``kv_lora_rank +
  qk_rope_head_dim`` values per token, as llama.cpp's ``deepseek2`` graph stores and reads it
  (``kv_b_proj`` absorbed into the query and the output); each head scores against the latent
  and rope key and sums the latent;
* **hybrid linear attention** (Qwen3.5/3.6 ``qwen3_5_moe``, transformers
  ``modeling_qwen3_5_moe.py``): three of every four layers (``full_attention_interval`` 4) are a
  Gated DeltaNet — ``in_proj_qkv`` (hidden to ``2 · key_dim + value_dim``), ``in_proj_z``
  (to ``value_dim``), ``in_proj_b``/``in_proj_a`` (to the value heads), a depthwise
  ``conv1d`` over ``conv_dim`` channels and ``out_proj`` — with a recurrent state of
  ``value_heads · key_head_dim · value_head_dim`` F32 values per layer, read and written once per
  token whatever the context; the fourth is gated full attention (``q_proj`` twice as wide: the
  query and its output gate) over a KV cache;
* **sliding-window attention with sinks** (gpt-oss, transformers ``modeling_gpt_oss.py``):
  ``layer_types`` alternate sliding (window 128) and full attention, so half the blocks read at
  most 128 tokens of K and V; a sink is one logit per head, no bytes to speak of.

The router and the shared experts are the same in every family. The family of a geometry is
its catalog entry's (by name, or for a model file by the catalog shape it has); a model of no
known family is priced as full attention over its geometry's heads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..geometry import ALIASES, CATALOG, ModelGeometry

#: llama.cpp keeps a recurrent layer's state in F32 (``llama_memory_recurrent``)
STATE_BYTES = 4


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention (DeepSeek-V2/V3 ``config.json``)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0          # 0: one ``q_proj`` (V2-Lite); else ``q_a_proj`` + ``q_b_proj``


@dataclass(frozen=True)
class GatedDeltaNet:
    """Qwen3.5's hybrid layout: linear-attention layers, one full layer every ``interval``."""

    interval: int
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int


@dataclass(frozen=True)
class SlidingWindow:
    """Alternating sliding-window and full attention (gpt-oss)."""

    window: int
    every: int = 2                # one full-attention layer in every ``every``


Family = Mla | GatedDeltaNet | SlidingWindow | None
#: Catalog entries whose attention is not plain full attention, each from its ``config.json``
#: (the catalog's geometry cites them, docs/design.md#model-geometry-and-memory).
FAMILIES: dict[str, Family] = {
    "deepseek-v2-lite": Mla(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                            v_head_dim=128),
    "deepseek-v3": Mla(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                       v_head_dim=128, q_lora_rank=1536),
    "qwen3.5-35b-a3b": GatedDeltaNet(interval=4, key_heads=16, value_heads=32, key_head_dim=128,
                                     value_head_dim=128, conv_kernel=4),
    "gpt-oss-20b": SlidingWindow(window=128),
    "gpt-oss-120b": SlidingWindow(window=128),
}
_SHAPE = ("n_layers", "n_experts", "top_k", "hidden", "expert_intermediate", "n_heads",
          "n_kv_heads", "head_dim", "dense_layers", "n_shared_experts")


def family(g: ModelGeometry) -> Family:
    """The attention family of ``g``: its catalog entry's by name, else that of the catalog
    entry with its shape (a GGUF file of a catalog model is named after the file); None, full
    attention, otherwise."""
    name = ALIASES.get(g.name.lower(), g.name.lower())
    if name in FAMILIES:
        return FAMILIES[name]
    for entry, fam in FAMILIES.items():
        c = CATALOG[entry]
        if all(getattr(c, f) == getattr(g, f) for f in _SHAPE):
            return fam
    return None


class BlockWork(NamedTuple):
    """One block's attention for one token: weights it reads (parameters), the other bytes it
    moves (KV cache, recurrent state) and the FLOPs beyond two per weight."""

    params: float
    extra_bytes: np.ndarray
    extra_flops: np.ndarray


def _full(g: ModelGeometry, ctx: np.ndarray, q_factor: int = 1) -> BlockWork:
    qd, kvd = g.n_heads * g.head_dim, g.n_kv_heads * g.head_dim
    params = (q_factor + 1) * qd * g.hidden + 2 * kvd * g.hidden
    return BlockWork(float(params), 2.0 * kvd * g.dtype_bytes * ctx,
                     4.0 * g.n_heads * g.head_dim * ctx)


def _mla(g: ModelGeometry, m: Mla, ctx: np.ndarray) -> BlockWork:
    h, qk = g.n_heads, m.qk_nope_head_dim + m.qk_rope_head_dim
    q = (g.hidden * m.q_lora_rank + m.q_lora_rank * h * qk) if m.q_lora_rank else g.hidden * h * qk
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    params = (q + g.hidden * latent + m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
              + h * m.v_head_dim * g.hidden)
    # scores against latent + rope key, then the weighted sum of the latent, per head
    return BlockWork(float(params), 1.0 * latent * g.dtype_bytes * ctx,
                     2.0 * h * (latent + m.kv_lora_rank) * ctx)


def _delta_net(g: ModelGeometry, d: GatedDeltaNet, ctx: np.ndarray) -> BlockWork:
    kd, vd = d.key_heads * d.key_head_dim, d.value_heads * d.value_head_dim
    conv = 2 * kd + vd
    params = (g.hidden * conv + g.hidden * vd + 2 * g.hidden * d.value_heads
              + conv * d.conv_kernel + vd * g.hidden)
    state = d.value_heads * d.key_head_dim * d.value_head_dim
    # the state read and written once, the convolution's last kernel-1 inputs likewise; the
    # delta rule's few passes over the state (decay, k^T S, rank-1 update, q S) in FLOPs
    moved = 2.0 * STATE_BYTES * (state + conv * (d.conv_kernel - 1))
    linear = BlockWork(float(params), np.full_like(ctx, moved), np.full_like(ctx, 8.0 * state))
    full = _full(g, ctx, q_factor=2)            # gated attention: query and gate
    n_full = 1.0 / d.interval
    return BlockWork((1 - n_full) * linear.params + n_full * full.params,
                     (1 - n_full) * linear.extra_bytes + n_full * full.extra_bytes,
                     (1 - n_full) * linear.extra_flops + n_full * full.extra_flops)


def attention_work(g: ModelGeometry, context: np.ndarray | float) -> BlockWork:
    """One block's attention at ``context`` tokens, the mean over the model's blocks."""
    ctx = np.asarray(context, np.float64)
    fam = family(g)
    if isinstance(fam, Mla):
        return _mla(g, fam, ctx)
    if isinstance(fam, GatedDeltaNet):
        return _delta_net(g, fam, ctx)
    if isinstance(fam, SlidingWindow):
        full, window = _full(g, ctx), _full(g, np.minimum(ctx, fam.window))
        f = 1.0 / fam.every
        return BlockWork(full.params, f * full.extra_bytes + (1 - f) * window.extra_bytes,
                         f * full.extra_flops + (1 - f) * window.extra_flops)
    return _full(g, ctx)


def moe_block_work(g: ModelGeometry, context: np.ndarray | float) -> BlockWork:
    """One MoE block's policy-invariant work: attention, the router and the shared experts."""
    a = attention_work(g, context)
    rest = g.n_experts * g.hidden + g.n_shared_experts * 3 * g.hidden * g.expert_intermediate
    return a._replace(params=a.params + rest)


def dense_block_work(g: ModelGeometry, context: np.ndarray | float) -> BlockWork:
    """One leading dense block: attention and its FFN."""
    a = attention_work(g, context)
    return a._replace(params=a.params + 3 * g.hidden * g.dense_intermediate)
