"""Model geometry, the built-in catalog and the VRAM-budget <-> cache-size (K) memory model.

docs/design.md#model-geometry-and-memory. ``n_layers`` counts MoE layers only (``L``);
``dense_layers`` are leading dense blocks such as DeepSeek's ``first_k_dense_replace``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CopeInputError

GIB = 1024**3
MIB = 1024**2

#: Defaults of the memory model: a 4k-token KV cache and 512 MiB of runtime workspace.
DEFAULT_CONTEXT = 4096
DEFAULT_WORKSPACE_BYTES = 512 * MIB


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
        Weights that always sit in VRAM: everything but the routed experts.
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

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name == "name":
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

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert: gate, up and down projections."""
        return 3 * self.hidden * self.expert_intermediate * self.dtype_bytes

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
    def attention_params(self) -> int:
        """Weights of one block's attention with full heads: Q, K and V, and the output."""
        qd, kvd = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return 2 * qd * self.hidden + 2 * kvd * self.hidden

    @property
    def moe_block_params(self) -> int:
        """Policy-invariant weights one MoE block reads per token: attention, the router and the
        shared experts (the routed experts are the policy's)."""
        return (self.attention_params + self.n_experts * self.hidden
                + self.n_shared_experts * 3 * self.hidden * self.expert_intermediate)

    @property
    def dense_block_params(self) -> int:
        """Weights one leading dense block reads per token: attention and its FFN."""
        return self.attention_params + 3 * self.hidden * self.dense_intermediate

    @property
    def head_params(self) -> int:
        """The LM head's weights (the embedding is one row per token, negligible)."""
        return self.vocab * self.hidden

    @property
    def all_expert_bytes(self) -> int:
        return self.n_layers * self.n_experts * self.expert_bytes

    def kv_cache_bytes(self, context: int = DEFAULT_CONTEXT) -> int:
        """K and V for ``context`` tokens in every transformer block."""
        if not (isinstance(context, (int, np.integer)) and context >= 0):
            raise CopeInputError(f"expected a whole number of tokens >= 0, got {context!r}",
                                 field="context")
        blocks = self.n_layers + self.dense_layers
        return 2 * blocks * self.n_kv_heads * self.head_dim * self.dtype_bytes * int(context)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> ModelGeometry:
        """Build from the ``model`` object of a file's metadata (keys = field names exactly);
        anything but a mapping with every field is a one-line CopeInputError."""
        if not isinstance(data, Mapping):
            raise CopeInputError("expected a JSON object with the model geometry", source=source,
                                 field="model")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise CopeInputError(f"missing geometry keys {missing}", source=source, field="model")
        extra = sorted(set(data) - set(names))
        if extra:
            raise CopeInputError(f"unknown geometry keys {extra}; expected exactly {names}",
                                 source=source, field="model")
        try:
            return cls(**{n: data[n] for n in names})
        except CopeInputError as exc:
            raise CopeInputError(exc.detail, source=source, field=f"model.{exc.field}") from None

    def same_shape(self, other: ModelGeometry) -> bool:
        """True when every field but the name agrees."""
        a, b = self.to_dict(), other.to_dict()
        a.pop("name"), b.pop("name")
        return a == b

    def with_layers(self, n_layers: int) -> ModelGeometry:
        """The same model cut (or grown) to ``n_layers`` MoE layers, e.g. for small examples."""
        return dataclasses.replace(self, n_layers=int(n_layers))

    # --- memory model (docs/design.md#model-geometry-and-memory) --------------------------
    def experts_per_layer_for_vram(self, vram_bytes: float, *, context: int = DEFAULT_CONTEXT,
                                   workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> int:
        """Cache size ``K`` that a VRAM budget buys, clamped to ``[0, E]``."""
        _finite(vram_bytes, "vram")
        _finite(workspace_bytes, "workspace", nonnegative=True)
        free = vram_bytes - self.non_expert_bytes - self.kv_cache_bytes(context) - workspace_bytes
        k = math.floor(free / (self.n_layers * self.expert_bytes))
        return int(min(max(k, 0), self.n_experts))

    def vram_for_experts_per_layer(self, k: int, *, context: int = DEFAULT_CONTEXT,
                                   workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> int:
        """Smallest VRAM budget in bytes at which ``K = k`` experts per layer fit."""
        if not 0 <= k <= self.n_experts:
            raise CopeInputError(f"experts per layer must be in [0, {self.n_experts}], got {k}",
                                 field="experts_per_layer")
        _finite(workspace_bytes, "workspace", nonnegative=True)
        return int(self.non_expert_bytes + self.kv_cache_bytes(context) + workspace_bytes
                   + k * self.n_layers * self.expert_bytes)


def _finite(value: float, field: str, nonnegative: bool = False) -> None:
    if not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value) \
            or (nonnegative and value < 0):
        want = "a finite number >= 0" if nonnegative else "a finite number"
        raise CopeInputError(f"expected {want} of bytes, got {value!r}", field=field)


def _routed_params(L: int, E: int, hidden: int, inter: int) -> int:
    return L * E * 3 * hidden * inter


def _entry(name: str, *, L: int, dense: int, E: int, k: int, shared: int, hidden: int, inter: int,
           heads: int, kv: int, head_dim: int, vocab: int, total_params: float,
           dtype_bytes: int = 2) -> ModelGeometry:
    # non-expert weights = published total parameter count minus the routed experts.
    non_expert = int(round(total_params)) - _routed_params(L, E, hidden, inter)
    return ModelGeometry(name=name, n_layers=L, n_experts=E, top_k=k, hidden=hidden,
                         expert_intermediate=inter, dtype_bytes=dtype_bytes,
                         n_shared_experts=shared, dense_layers=dense, n_heads=heads,
                         n_kv_heads=kv, head_dim=head_dim, vocab=vocab,
                         non_expert_bytes=non_expert * dtype_bytes)


#: Built-in models (F16/BF16). Geometry from each model's published config.json; total
#: parameter counts from the model cards. DeepSeek-V2-Lite uses MLA attention: its KV cache is
#: modelled with 16 full heads of 128, an over-estimate noted in the README.
CATALOG: dict[str, ModelGeometry] = {g.name: g for g in [
    _entry("deepseek-v2-lite", L=26, dense=1, E=64, k=6, shared=2, hidden=2048, inter=1408,
           heads=16, kv=16, head_dim=128, vocab=102400, total_params=15.706e9),
    _entry("qwen3-30b-a3b", L=48, dense=0, E=128, k=8, shared=0, hidden=2048, inter=768,
           heads=32, kv=4, head_dim=128, vocab=151936, total_params=30.532e9),
    _entry("qwen3.5-35b-a3b", L=40, dense=0, E=256, k=8, shared=1, hidden=2048, inter=512,
           heads=16, kv=2, head_dim=256, vocab=248320, total_params=35.0e9),
    _entry("mixtral-8x7b", L=32, dense=0, E=8, k=2, shared=0, hidden=4096, inter=14336,
           heads=32, kv=8, head_dim=128, vocab=32000, total_params=46.703e9),
    _entry("olmoe-1b-7b", L=16, dense=0, E=64, k=8, shared=0, hidden=2048, inter=1024,
           heads=16, kv=16, head_dim=128, vocab=50304, total_params=6.919e9),
    _entry("qwen1.5-moe-a2.7b", L=24, dense=0, E=60, k=4, shared=1, hidden=2048, inter=1408,
           heads=16, kv=16, head_dim=128, vocab=151936, total_params=14.316e9),
    _entry("gpt-oss-20b", L=24, dense=0, E=32, k=4, shared=0, hidden=2880, inter=2880,
           heads=64, kv=8, head_dim=64, vocab=201088, total_params=20.914e9),
]}

#: Other names users type for catalog models.
ALIASES = {"deepseek-coder-v2-lite": "deepseek-v2-lite",
           "deepseek-v2-lite-chat": "deepseek-v2-lite",
           "deepseek-coder-v2-lite-instruct": "deepseek-v2-lite"}


def get_model(name: str) -> ModelGeometry:
    """Look a model up in the catalog.

    Parameters
    ----------
    name : str
        A catalog name (``cope models``), case-insensitive; aliases accepted.

    Returns
    -------
    ModelGeometry

    Raises
    ------
    CopeInputError
        For a name the catalog does not know, listing the ones it does.
    """
    key = ALIASES.get(name.lower(), name.lower())
    if key not in CATALOG:
        raise CopeInputError(f"unknown model {name!r}; expected one of {sorted(CATALOG)}",
                             field="model")
    return CATALOG[key]
