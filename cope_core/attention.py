"""A transformer block's attention by architecture family: its weights and what it caches per
token (docs/design.md#shared-work-per-architecture). One rule, read by the geometry's KV cache
and non-expert weights, the llama.cpp tensor table and the profile's shared work.

* **full attention** (GQA; Qwen3-MoE, Mixtral, OLMoE, GLM-4.5): Q, K, V and O; the cache holds K
  and V, ``kv_heads · head_dim`` values each, for every context token;
* **multi-head latent attention** (DeepSeek-V2/V3, transformers ``modeling_deepseek_v2.py``):
  ``q_proj`` or ``q_a_proj``/``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``;
  llama.cpp caches one row of ``kv_lora_rank + qk_rope_head_dim`` values per token, K only
  (``src/llama-kv-cache.cpp`` l. 229-230 at b11434: ``n_embd_v_gqa`` is 0 for MLA);
* **hybrid linear attention** (Qwen3.5/3.6 ``qwen3_5_moe``): block ``i`` is full attention when
  ``(i + 1) % full_attention_interval == 0`` (gated: ``q_proj`` twice as wide), else a Gated
  DeltaNet (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``/``in_proj_a``, a depthwise ``conv1d``,
  ``out_proj``) that caches nothing per token but keeps a recurrent state: llama.cpp's
  ``llama_memory_recurrent`` row of ``n_embd_r = (d_conv - 1) · (d_inner + 2 · n_group ·
  d_state)`` and ``n_embd_s = d_state · d_inner`` F32 values per sequence
  (``src/llama-hparams.cpp`` l. 208-258, ``src/llama-memory-recurrent.cpp`` l. 101-103; the
  layers split by ``is_recr``, ``src/models/qwen35moe.cpp`` l. 18-25, ``src/llama-model.cpp``
  l. 2705-2711);
* **sliding-window attention with sinks** (gpt-oss): stored as full attention (the cache of its
  sliding layers is counted in full, an over-estimate).

``v_params`` are the weights llama-quantize treats as "attention-v-like" (``attn_v``,
``attn_qkv``; ``category_is_attn_v``, ``src/llama-quant.cpp`` l. 156-161): the DeltaNet's fused
``in_proj_qkv`` is stored as ``attn_qkv``; DeepSeek's ``kv_b_proj`` is written split into
``attn_k_b``/``attn_v_b`` (``conversion/deepseek.py`` l. 433-449), which are not.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class Shape(Protocol):
    """What these rules read of a model: :class:`cope_core.geometry.ModelGeometry` has it all.
    A protocol, so that this module sits below the geometry and never imports it (the geometry's
    KV cache and weights are built on top of the rules here)."""

    @property
    def name(self) -> str: ...
    @property
    def hidden(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def dense_layers(self) -> int: ...

#: llama.cpp keeps a recurrent layer's state in F32 (``llama_memory_recurrent``, r and s F32)
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

    @property
    def conv_dim(self) -> int:      # in_proj_qkv's width: Q and K of the key heads, V
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    @property
    def state_values(self) -> int:
        """F32 values of one layer's recurrent state: the convolution's last ``kernel - 1``
        inputs (``n_embd_r``) and the delta rule's matrix per value head (``n_embd_s``)."""
        return ((self.conv_kernel - 1) * self.conv_dim
                + self.value_heads * self.key_head_dim * self.value_head_dim)


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
SHAPE = ("n_layers", "n_experts", "top_k", "hidden", "expert_intermediate", "n_heads",
         "n_kv_heads", "head_dim", "dense_layers", "n_shared_experts")


def family_of(g: Shape, catalog: Mapping[str, Shape],
              aliases: Mapping[str, str]) -> Family:
    """The family of ``g``: its catalog entry's by name, else that of the catalog entry with its
    shape (a GGUF file of a catalog model is named after the file); None (full attention)
    otherwise."""
    name = aliases.get(g.name.lower(), g.name.lower())
    if name in FAMILIES:
        return FAMILIES[name]
    for entry, fam in FAMILIES.items():
        c = catalog[entry]
        if all(getattr(c, f) == getattr(g, f) for f in SHAPE):
            return fam
    return None


class BlockAttention(NamedTuple):
    """One block's attention as stored and cached: ``params`` (its matrices), of which
    ``v_params`` llama-quantize calls attention-v-like; ``k_values`` and ``v_values`` cached per
    context token; ``state`` F32 values of a recurrent state, whatever the context."""

    params: int
    v_params: int
    k_values: int
    v_values: int
    state: int = 0


def full_block(g: Shape, q_factor: int = 1) -> BlockAttention:
    """Q (``q_factor`` times: a gated query is two), K, V and O; K and V cached."""
    qd, kvd = g.n_heads * g.head_dim, g.n_kv_heads * g.head_dim
    return BlockAttention((q_factor + 1) * qd * g.hidden + 2 * kvd * g.hidden, kvd * g.hidden,
                          kvd, kvd)


def mla_block(g: Shape, m: Mla) -> BlockAttention:
    h, qk = g.n_heads, m.qk_nope_head_dim + m.qk_rope_head_dim
    q = (g.hidden * m.q_lora_rank + m.q_lora_rank * h * qk) if m.q_lora_rank else g.hidden * h * qk
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    params = (q + g.hidden * latent + m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
              + h * m.v_head_dim * g.hidden)
    return BlockAttention(params, 0, latent, 0)


def delta_net_block(g: Shape, d: GatedDeltaNet) -> BlockAttention:
    """A Gated DeltaNet layer: in_proj_qkv (attn_qkv), in_proj_z, in_proj_b and in_proj_a, the
    depthwise conv1d, out_proj; no per-token cache, a fixed recurrent state."""
    vd = d.value_heads * d.value_head_dim
    params = (g.hidden * d.conv_dim + g.hidden * vd + 2 * g.hidden * d.value_heads
              + d.conv_dim * d.conv_kernel + vd * g.hidden)
    return BlockAttention(params, g.hidden * d.conv_dim, 0, 0, d.state_values)


def block_attention(g: Shape, fam: Family) -> tuple[BlockAttention, ...]:
    """Each transformer block's attention, leading dense blocks first."""
    n = g.dense_layers + g.n_layers
    if isinstance(fam, Mla):
        return (mla_block(g, fam),) * n
    if isinstance(fam, GatedDeltaNet):
        full, linear = full_block(g, q_factor=2), delta_net_block(g, fam)
        return tuple(full if (i + 1) % fam.interval == 0 else linear for i in range(n))
    return (full_block(g),) * n


def cache_bytes(rows: tuple[BlockAttention, ...], context: int, k_bytes: float,
                v_bytes: float) -> int:
    """What ``rows`` cache at ``context`` tokens: K and V at ``k_bytes``/``v_bytes`` per value,
    and the recurrent states in F32."""
    return int(sum(context * (r.k_values * k_bytes + r.v_values * v_bytes)
                   + STATE_BYTES * r.state for r in rows))
