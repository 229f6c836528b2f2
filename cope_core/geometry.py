"""Model geometry, the built-in catalog and the VRAM-budget <-> cache-size (K) memory model.

docs/design.md#model-geometry-and-memory. ``n_layers`` counts MoE layers only (``L``);
``dense_layers`` are leading dense blocks such as DeepSeek's ``first_k_dense_replace``.

Weights are priced as stored (docs/design.md#bytes-as-stored): a geometry read from a quantised
file (``cope_core.models``) carries every MoE layer's routed-expert tensors, each projection's
type and exact bytes, and the non-expert weights' bytes and parameter count; a geometry without
them (the catalog's BF16 entries, collected models) stores every weight in ``dtype_bytes``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .attention import BlockAttention, Family, block_attention, cache_bytes, family_of
from .errors import CopeInputError

GIB = 1024**3
MIB = 1024**2

#: Defaults of the memory model: a 4k-token KV cache and 512 MiB of runtime workspace.
DEFAULT_CONTEXT = 4096
DEFAULT_WORKSPACE_BYTES = 512 * MIB


@dataclass(frozen=True)
class ExpertTensors:
    """How one MoE layer stores one routed expert: each projection's type and exact bytes.

    The type is the stored format's own name (a ggml type such as ``"Q4_K"``, ``"Q6_K"``,
    ``"MXFP4"`` or ``"BF16"``); the bytes are one expert's share of the layer's stacked tensor,
    expert biases included (gpt-oss has them).
    """

    gate_type: str
    up_type: str
    down_type: str
    gate_bytes: int
    up_bytes: int
    down_bytes: int

    def __post_init__(self) -> None:
        for f in ("gate_type", "up_type", "down_type", "gate_bytes", "up_bytes", "down_bytes"):
            v, name = getattr(self, f), f.endswith("_type")
            if (not isinstance(v, str) or not v) if name else (
                    not isinstance(v, int) or isinstance(v, bool) or v < 1):
                want = "a type name" if name else "a positive whole number of bytes"
                raise CopeInputError(f"expected {want}, got {v!r}", field=f)

    @property
    def total(self) -> int:
        return self.gate_bytes + self.up_bytes + self.down_bytes

    def projections(self) -> tuple[tuple[str, int], tuple[str, int], tuple[str, int]]:
        return ((self.gate_type, self.gate_bytes), (self.up_type, self.up_bytes),
                (self.down_type, self.down_bytes))


#: The fields a geometry may leave out: a file written before weights were priced as stored
#: reads as a geometry stored at ``dtype_bytes`` throughout (and one that stores so omits them).
STORED_FIELDS = ("weight_format", "expert_layers", "non_expert_params")


@dataclass(frozen=True)
class ModelGeometry:
    """Shape of a MoE model as far as offloading cares.

    Attributes
    ----------
    name : str
        Catalog name, e.g. ``"qwen3-30b-a3b"``.
    n_layers : int
        MoE layers ``L`` (dense layers excluded).
    n_experts : int
        Routed experts per MoE layer ``E``.
    top_k : int
        Routed experts selected per token and layer.
    hidden, expert_intermediate : int
        Model width and one routed expert's FFN width.
    dtype_bytes : int
        Bytes per stored weight (2 for F16/BF16).
    n_shared_experts : int
        Always-on shared experts per MoE layer (policy-invariant work).
    dense_layers : int
        Leading dense transformer blocks before the first MoE layer.
    n_heads, n_kv_heads, head_dim : int
        Attention shape (for the KV-cache size and shared-work roofline).
    vocab : int
        Vocabulary size (LM head).
    non_expert_bytes : int
        Weights that always sit in VRAM: everything but the routed experts, in bytes as stored.
    weight_format : str
        The stored format's name (``"Q4_K_M"``, ``"MXFP4"``, ``"BF16"``, ...); empty for a
        geometry that stores every weight in ``dtype_bytes``.
    expert_layers : tuple of ExpertTensors
        One per MoE layer, in order: the routed experts' stored types and bytes; empty when
        every weight takes ``dtype_bytes``.
    non_expert_params : int
        Parameters of the non-expert weights (their bytes per parameter price the shared work);
        0 when they are stored in ``dtype_bytes``.

    ``dtype_bytes`` stays the activations' and KV cache's element size.
    """

    name: str
    n_layers: int
    n_experts: int
    top_k: int
    hidden: int
    expert_intermediate: int
    dtype_bytes: int
    n_shared_experts: int
    dense_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    non_expert_bytes: int
    weight_format: str = ""
    expert_layers: tuple[ExpertTensors, ...] = ()
    non_expert_params: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name in ("name", "weight_format", "expert_layers"):
                continue
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise CopeInputError(f"expected a non-negative integer, got {v!r}", field=f.name)
        for key in ("n_layers", "n_experts", "top_k", "hidden", "expert_intermediate",
                    "dtype_bytes"):
            if getattr(self, key) < 1:
                raise CopeInputError("expected a positive integer, got 0", field=key)
        if self.top_k > self.n_experts:
            raise CopeInputError(
                f"top_k={self.top_k} exceeds n_experts={self.n_experts}", field="top_k")
        if self.n_experts > 32767:
            raise CopeInputError("expert ids must fit int16 (n_experts <= 32767)",
                                 field="n_experts")
        if not isinstance(self.weight_format, str):
            raise CopeInputError(f"expected a format name, got {self.weight_format!r}",
                                 field="weight_format")
        if not isinstance(self.expert_layers, tuple) or not all(
                isinstance(x, ExpertTensors) for x in self.expert_layers):
            raise CopeInputError("expected a tuple of ExpertTensors", field="expert_layers")
        if self.expert_layers and len(self.expert_layers) != self.n_layers:
            raise CopeInputError(f"{len(self.expert_layers)} layers of expert tensors for "
                                 f"n_layers={self.n_layers}", field="expert_layers")

    # --- bytes as stored (docs/design.md#bytes-as-stored) ----------------------------------------
    @property
    def stored(self) -> bool:  # the experts' bytes come from a format, not dtype_bytes
        return bool(self.expert_layers)

    @property
    def format_name(self) -> str:
        """The weights' format as shown to a user (``"16-bit"`` for ``dtype_bytes`` 2)."""
        return self.weight_format or {1: "8-bit", 2: "16-bit", 4: "F32"}.get(
            self.dtype_bytes, f"{self.dtype_bytes}-byte")

    @property
    def layer_expert_bytes(self) -> tuple[int, ...]:
        """Bytes of one routed expert in each MoE layer (gate, up and down as stored)."""
        if self.expert_layers:
            return tuple(x.total for x in self.expert_layers)
        return (3 * self.hidden * self.expert_intermediate * self.dtype_bytes,) * self.n_layers

    @property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert: gate, up and down projections; the mean over layers
        when a stored format mixes types across layers (exact, an int, otherwise)."""
        if not self.expert_layers:
            return 3 * self.hidden * self.expert_intermediate * self.dtype_bytes
        total = sum(self.layer_expert_bytes)
        return total // self.n_layers if total % self.n_layers == 0 else total / self.n_layers

    @property
    def per_k_bytes(self) -> int:  # VRAM one more expert per layer takes
        return sum(self.layer_expert_bytes)

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes per non-expert parameter as stored (the shared work reads them)."""
        if self.non_expert_params:
            return self.non_expert_bytes / self.non_expert_params
        return self.dtype_bytes

    @property
    def expert_flops(self) -> int:
        """FLOPs of one routed expert for one token (three GEMVs, 2 FLOPs per weight)."""
        return 2 * 3 * self.hidden * self.expert_intermediate

    # --- shared work per part (docs/design.md#shared-work-per-part) -----------------------------
    @property
    def dense_intermediate(self) -> int:
        """FFN width of a leading dense block, as the profiler builds it: the routed and shared
        experts' combined width (DeepSeek-V2-Lite's first block: 10944 real, 11264 here)."""
        return self.expert_intermediate * (self.top_k + self.n_shared_experts)

    @property
    def family(self) -> Family:  # the attention's architecture family (cope_core.attention)
        return family_of(self, CATALOG, ALIASES)

    @property
    def attention_blocks(self) -> tuple[BlockAttention, ...]:
        """Each transformer block's attention weights and cache by its family."""
        return block_attention(self, self.family)

    @property
    def attention_params(self) -> float:
        """Weights of one block's attention (:mod:`cope_core.attention`), mean over blocks."""
        rows = self.attention_blocks
        return sum(r.params for r in rows) / len(rows)

    @property
    def moe_block_params(self) -> float:
        """Policy-invariant weights one MoE block reads per token: attention, the router and the
        shared experts (the routed experts are the policy's)."""
        return (self.attention_params + self.n_experts * self.hidden
                + self.n_shared_experts * 3 * self.hidden * self.expert_intermediate)

    @property
    def dense_block_params(self) -> float:
        """Weights one leading dense block reads per token: attention and its FFN."""
        return self.attention_params + 3 * self.hidden * self.dense_intermediate

    @property
    def head_params(self) -> int:
        """The LM head's weights (the embedding is one row per token, negligible)."""
        return self.vocab * self.hidden

    all_expert_bytes = property(lambda self: self.n_experts * self.per_k_bytes)

    def kv_cache_bytes(self, context: int = DEFAULT_CONTEXT) -> int:
        """What every block caches at ``context`` tokens, by its family: K and V (MLA's latent
        row; none in a linear-attention layer) in ``dtype_bytes``, and recurrent states in F32."""
        if not (isinstance(context, (int, np.integer)) and context >= 0):
            raise CopeInputError(f"expected a whole number of tokens >= 0, got {context!r}",
                                 field="context")
        return cache_bytes(self.attention_blocks, int(context), self.dtype_bytes, self.dtype_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The geometry as JSON-ready values; a geometry stored in ``dtype_bytes`` leaves out
        the stored-format keys, so its files read as before."""
        out = dataclasses.asdict(self)
        if not self.stored and not self.weight_format and not self.non_expert_params:
            for key in STORED_FIELDS:
                out.pop(key)
        else:
            out["expert_layers"] = [dataclasses.asdict(x) for x in self.expert_layers]
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> ModelGeometry:
        """Build from the ``model`` object of a file's metadata (keys = field names exactly;
        the stored-format keys may be left out); anything else is a one-line CopeInputError."""
        if not isinstance(data, Mapping):
            raise CopeInputError("expected a JSON object with the model geometry", source=source,
                                 field="model")
        names = [f.name for f in dataclasses.fields(cls)]
        if missing := [n for n in names if n not in data and n not in STORED_FIELDS]:
            raise CopeInputError(f"missing geometry keys {missing}", source=source, field="model")
        if extra := sorted(set(data) - set(names)):
            raise CopeInputError(f"unknown geometry keys {extra}; expected exactly {names}",
                                 source=source, field="model")
        values = {n: data[n] for n in names if n in data}
        layers = values.get("expert_layers", ())
        try:
            if not isinstance(layers, (list, tuple)) or not all(
                    isinstance(x, Mapping) for x in layers):
                raise CopeInputError("expected a list of objects, one per MoE layer",
                                     field="expert_layers")
            parts = [f.name for f in dataclasses.fields(ExpertTensors)]
            for x in layers:
                if sorted(x) != sorted(parts):
                    raise CopeInputError(f"expected exactly the keys {parts}, got {sorted(x)}",
                                         field="expert_layers")
            values["expert_layers"] = tuple(ExpertTensors(**x) for x in layers)
            return cls(**values)
        except CopeInputError as exc:
            raise CopeInputError(exc.detail, source=source, field=f"model.{exc.field}") from None

    def same_shape(self, other: ModelGeometry) -> bool:
        """True when every field but the name agrees."""
        return {**self.to_dict(), "name": ""} == {**other.to_dict(), "name": ""}

    def with_layers(self, n_layers: int) -> ModelGeometry:
        """The same model cut (or grown) to ``n_layers`` MoE layers, e.g. for small examples; a
        stored format keeps its first ``n_layers`` layers' tensors (it cannot grow)."""
        n = int(n_layers)
        if self.expert_layers:
            if n > len(self.expert_layers):
                raise CopeInputError(f"the model stores {len(self.expert_layers)} MoE layers' "
                                     f"tensors; cannot grow it to {n}", field="layers")
            return dataclasses.replace(self, n_layers=n, expert_layers=self.expert_layers[:n])
        return dataclasses.replace(self, n_layers=n)

    # --- memory model (docs/design.md#model-geometry-and-memory) --------------------------
    def expert_budget_bytes(self, vram_bytes: float, *, context: int = DEFAULT_CONTEXT,
                            workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> float:
        """VRAM left for routed experts (negative when the rest does not fit)."""
        _finite(vram_bytes, "vram")
        _finite(workspace_bytes, "workspace", nonnegative=True)
        return vram_bytes - self.non_expert_bytes - self.kv_cache_bytes(context) - workspace_bytes

    def experts_per_layer_for_vram(self, vram_bytes: float, **memory: int) -> int:
        """``K`` a VRAM budget buys, at most ``E`` (``memory``: :meth:`expert_budget_bytes`'s);
        a budget below K = 0's need is a one-line CopeInputError naming it in GiB."""
        if (left := self.expert_budget_bytes(vram_bytes, **memory)) < 0:
            need = math.ceil((vram_bytes - left) / GIB * 100) / 100      # never shown as fitting
            raise CopeInputError(f"{vram_bytes / GIB:g} GiB is below the {need:.2f} GiB that K = 0 "
                                 "needs (non-expert weights, KV cache, workspace)", field="vram")
        return int(min(math.floor(left / self.per_k_bytes), self.n_experts))

    def vram_for_experts_per_layer(self, k: int, *, context: int = DEFAULT_CONTEXT,
                                   workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> int:
        """Smallest VRAM budget in bytes at which ``K = k`` experts per layer fit."""
        if not 0 <= k <= self.n_experts:
            raise CopeInputError(f"experts per layer must be in [0, {self.n_experts}], got {k}",
                                 field="experts_per_layer")
        _finite(workspace_bytes, "workspace", nonnegative=True)
        return int(self.non_expert_bytes + self.kv_cache_bytes(context) + workspace_bytes
                   + k * self.per_k_bytes)


def _finite(value: float, field: str, nonnegative: bool = False) -> None:
    if not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value) \
            or (nonnegative and value < 0):
        want = "a finite number >= 0" if nonnegative else "a finite number"
        raise CopeInputError(f"expected {want} of bytes, got {value!r}", field=field)


def _entry(name: str, *, L: int, dense: int, E: int, k: int, shared: int, hidden: int, inter: int,
           heads: int, kv: int, head_dim: int, vocab: int, total_params: float,
           dtype_bytes: int = 2) -> ModelGeometry:
    # non-expert weights = published total parameter count minus the routed experts.
    non_expert = int(round(total_params)) - L * E * 3 * hidden * inter
    return ModelGeometry(name=name, n_layers=L, n_experts=E, top_k=k, hidden=hidden,
                         expert_intermediate=inter, dtype_bytes=dtype_bytes,
                         n_shared_experts=shared, dense_layers=dense, n_heads=heads,
                         n_kv_heads=kv, head_dim=head_dim, vocab=vocab,
                         non_expert_bytes=non_expert * dtype_bytes)


#: Built-in models (F16/BF16). Geometry from each model's published config.json; total
#: parameter counts from the model cards, but Qwen3.5's (see below).
CATALOG: dict[str, ModelGeometry] = {g.name: g for g in [
    _entry("deepseek-v2-lite", L=26, dense=1, E=64, k=6, shared=2, hidden=2048, inter=1408,
           heads=16, kv=16, head_dim=128, vocab=102400, total_params=15.706e9),
    _entry("qwen3-30b-a3b", L=48, dense=0, E=128, k=8, shared=0, hidden=2048, inter=768,
           heads=32, kv=4, head_dim=128, vocab=151936, total_params=30.532e9),
    # the card's "35B" is rounded (and its checkpoint has an MTP block and a vision tower that
    # llama.cpp does not load as the model): its text model counted from config.json, per
    # block by cope_core.attention plus norms, router, shared expert and its gate (design.md)
    _entry("qwen3.5-35b-a3b", L=40, dense=0, E=256, k=8, shared=1, hidden=2048, inter=512,
           heads=16, kv=2, head_dim=256, vocab=248320, total_params=34_660_610_688),
    _entry("mixtral-8x7b", L=32, dense=0, E=8, k=2, shared=0, hidden=4096, inter=14336,
           heads=32, kv=8, head_dim=128, vocab=32000, total_params=46.703e9),
    _entry("olmoe-1b-7b", L=16, dense=0, E=64, k=8, shared=0, hidden=2048, inter=1024,
           heads=16, kv=16, head_dim=128, vocab=50304, total_params=6.919e9),
    _entry("qwen1.5-moe-a2.7b", L=24, dense=0, E=60, k=4, shared=1, hidden=2048, inter=1408,
           heads=16, kv=16, head_dim=128, vocab=151936, total_params=14.316e9),
    _entry("gpt-oss-20b", L=24, dense=0, E=32, k=4, shared=0, hidden=2880, inter=2880,
           heads=64, kv=8, head_dim=64, vocab=201088, total_params=20.914e9),
    # the MoE models users run most (docs/design.md#model-geometry-and-memory cites each config)
    _entry("qwen3-235b-a22b", L=94, dense=0, E=128, k=8, shared=0, hidden=4096, inter=1536,
           heads=64, kv=4, head_dim=128, vocab=151936, total_params=235.0e9),
    _entry("glm-4.5-air", L=45, dense=1, E=128, k=8, shared=1, hidden=4096, inter=1408,
           heads=96, kv=8, head_dim=128, vocab=151552, total_params=106.0e9),
    _entry("gpt-oss-120b", L=36, dense=0, E=128, k=4, shared=0, hidden=2880, inter=2880,
           heads=64, kv=8, head_dim=64, vocab=201088, total_params=116.8e9),
    _entry("deepseek-v3", L=58, dense=3, E=256, k=8, shared=1, hidden=7168, inter=2048,
           heads=128, kv=128, head_dim=128, vocab=129280, total_params=671.0e9),
]}

#: Other names users type for catalog models.
ALIASES = {"deepseek-coder-v2-lite": "deepseek-v2-lite",
           "deepseek-v2-lite-chat": "deepseek-v2-lite",
           "deepseek-coder-v2-lite-instruct": "deepseek-v2-lite",
           "glm-4.5-air-base": "glm-4.5-air", "deepseek-r1": "deepseek-v3",
           "deepseek-v3-0324": "deepseek-v3", "qwen3-235b-a22b-instruct-2507": "qwen3-235b-a22b"}


def get_model(name: str) -> ModelGeometry:
    """The catalog model ``name`` (``cope models``; case-insensitive, aliases accepted); a name
    the catalog does not know is a one-line CopeInputError listing the ones it does."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in CATALOG:
        raise CopeInputError(f"unknown model {name!r}; expected one of {sorted(CATALOG)}",
                             field="model")
    return CATALOG[key]
