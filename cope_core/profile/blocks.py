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

from typing import NamedTuple

import numpy as np

# the families and each block's weights are one rule, cope_core.attention's (re-exported here)
from ..attention import (
    FAMILIES,
    STATE_BYTES,
    Family,
    GatedDeltaNet,
    Mla,
    SlidingWindow,
    delta_net_block,
    full_block,
    mla_block,
)
from ..geometry import ModelGeometry

__all__ = ["FAMILIES", "STATE_BYTES", "BlockWork", "Family", "GatedDeltaNet", "Mla",
           "SlidingWindow", "attention_work", "dense_block_work", "family", "moe_block_work"]


def family(g: ModelGeometry) -> Family:
    """The attention family of ``g`` (:attr:`cope_core.geometry.ModelGeometry.family`)."""
    return g.family


class BlockWork(NamedTuple):
    """One block's attention for one token: weights it reads (parameters), the other bytes it
    moves (KV cache, recurrent state) and the FLOPs beyond two per weight."""

    params: float
    extra_bytes: np.ndarray
    extra_flops: np.ndarray


def _full(g: ModelGeometry, ctx: np.ndarray, q_factor: int = 1) -> BlockWork:
    kvd = g.n_kv_heads * g.head_dim
    return BlockWork(float(full_block(g, q_factor).params), 2.0 * kvd * g.dtype_bytes * ctx,
                     4.0 * g.n_heads * g.head_dim * ctx)


def _mla(g: ModelGeometry, m: Mla, ctx: np.ndarray) -> BlockWork:
    h, latent = g.n_heads, m.kv_lora_rank + m.qk_rope_head_dim
    params = mla_block(g, m).params
    # scores against latent + rope key, then the weighted sum of the latent, per head
    return BlockWork(float(params), 1.0 * latent * g.dtype_bytes * ctx,
                     2.0 * h * (latent + m.kv_lora_rank) * ctx)


def _delta_net(g: ModelGeometry, d: GatedDeltaNet, ctx: np.ndarray) -> BlockWork:
    state = d.value_heads * d.key_head_dim * d.value_head_dim
    # the state (the convolution's last kernel-1 inputs too) read and written once; the
    # delta rule's few passes over the state (decay, k^T S, rank-1 update, q S) in FLOPs
    moved = 2.0 * STATE_BYTES * d.state_values
    linear = BlockWork(float(delta_net_block(g, d).params), np.full_like(ctx, moved),
                       np.full_like(ctx, 8.0 * state))
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
