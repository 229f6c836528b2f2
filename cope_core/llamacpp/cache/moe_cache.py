"""llama.cpp's MoE expert cache: its memory layout (MiB -> slots) and its replay over a trace
(docs/design.md#llamacpp-moe-cache).

Read in ggml-org/llama.cpp ``src/llama-moe-cache.cpp`` at commit 4b060f27a806 (b11480, the LRU
version) and at c4fb57969532 (tag b12191, the class-LRU version with ``--moe-cache-cpu-share``);
``docs/moe-cache.md`` at b12191. The rules here cite those lines; what could not be read there is
named in the docs and in :data:`INFERRED`.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...errors import CopeInputError
from ...geometry import MIB, ModelGeometry
from ...trace.data import Trace
from ...weight_formats import tensor_bytes
from ._cache_plan import CLASS_LRU_WEIGHT, buckets, distinct_per_layer, first_use_counts

#: ggml-cuda's buffer alignment (ggml/src/ggml-cuda/ggml-cuda.cu,
#: ggml_backend_cuda_buffer_type_get_alignment returns 128); each bank is padded to it once
ALIGNMENT = 128
#: the CPU shares moe-cache-tune.py chooses among (scripts/moe-cache-tune.py @ b12191, SHARES)
TUNER_SHARES = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98)

class Reading(NamedTuple):
    """One reading of the class-LRU rules the readable source does not show
    (docs/design.md#llamacpp-moe-cache): what a key's age is measured on, and which misses
    the CPU share takes.

    ``clock``: ``token`` (one clock, one tick per decoded token: COPE's reading), ``layer``
    (each layer's own clock, ticked after its lookup: the header's "layer clock at the last
    use") or ``layer-first`` (ticked before it). ``cpu_order``: ``coldest`` (lowest decayed
    score: COPE's) or ``ascending`` (the lowest ids, the order the plan uploads misses in)."""

    clock: str
    cpu_order: str

    @property
    def label(self) -> str:
        return f"{self.clock} clock, {self.cpu_order} to the CPU"


# each reading's constant in the kernels, by name: numba loads with the first replay, not with
# the package (a server answering from its disk cache runs none)
_CLOCKS = {"token": "TOKEN_CLOCK", "layer": "LAYER_CLOCK", "layer-first": "LAYER_CLOCK_FIRST"}
_ORDERS = {"coldest": "COLDEST", "ascending": "ASCENDING"}
#: every plausible reading, COPE's first; the class-LRU's predictions are replayed under each
READINGS = tuple(Reading(c, o) for c in _CLOCKS for o in _ORDERS)
OURS = READINGS[0]

#: Rules that the readable source does not state, and the reading chosen for each.
INFERRED = (
    "class-LRU score update: score = score * 2**(-age/128) + 1 at each use (hit, upload or "
    "CPU miss); the clock advances by one per decoded token",
    "class-LRU victim ties: the lower class",
    "CPU share: decided per lookup once the group has no empty slot; a running credit per "
    "group makes the long-run share F exactly (credit += F*m, floor of it to the CPU); the "
    "coldest misses (lowest decayed score) go to the CPU; they are not uploaded",
    "the clock and which misses the CPU share takes are replayed under every reading of "
    "READINGS; predictions state the spread",
)


class CacheVersion(str, enum.Enum):
    """The eviction rule of a llama.cpp build: the one record of each rule (the search, the
    replay kernel, the policy record, the exports and the CLI read it from here).

    Attributes
    ----------
    build : str
        The first llama.cpp release with this rule (b11480: PR #29887, the cache and
        ``--moe-cache-mib``; b12170: PR #31233).
    share_build : str or None
        The first release with ``--moe-cache-cpu-share`` under this rule (b12191), None when
        the rule has none.
    kernel : int
        The rule's number in the replay kernels (``_cache_kernels._cache_sweep``).
    label : str
        Its name in prose.
    needs : str
        What a configuration under it needs of a build, as the exports say it.
    builds : str
        The releases that run it, for the CLI's help.
    """

    build: str
    share_build: str | None
    kernel: int
    label: str
    needs: str
    builds: str

    LRU = ("lru", "b11480", None, 0, "LRU", "--moe-cache-mib with LRU eviction",
           "b11480-b12169")
    CLASS_LRU = ("classlru", "b12170", "b12191", 1, "class-LRU", "the class-LRU eviction",
                 "b12170+")

    # the defaults only let ``CacheVersion("lru")`` (a lookup by value) type-check
    def __new__(cls, value: str, build: str = "", share_build: str | None = None,
                kernel: int = 0, label: str = "", needs: str = "",
                builds: str = "") -> CacheVersion:
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.build, obj.share_build, obj.kernel = build, share_build, kernel
        obj.label, obj.needs, obj.builds = label, needs, builds
        return obj

    @classmethod
    def of_candidate(cls, candidate: str) -> CacheVersion:
        """The rule of a candidate id ``llamacpp_cache/<rule>``."""
        return cls(candidate.rpartition("/")[2])


@dataclass(frozen=True)
class CacheGroup:
    """Cached layers with one expert tensor layout: one pool of slots and its eviction state.

    Attributes
    ----------
    layers : tuple of int
        MoE layers (0-based) in the group.
    bank_bytes : tuple of int
        One expert's bytes in each bank (gate, up, down as stored: the tensors' ``nb[2]``).
    budget : int
        Bytes of the cache this group may take (its share of ``--moe-cache-mib``).
    n_slots : int
        Experts the group caches; 0 when the budget holds fewer than ``top_k``, and then its
        layers are not cached (computed on the CPU).
    """

    layers: tuple[int, ...]
    bank_bytes: tuple[int, ...]
    budget: int
    n_slots: int

    @property
    def slot_bytes(self) -> int:
        return sum(self.bank_bytes)

    @property
    def alloc_bytes(self) -> int:
        return alloc_size(self.bank_bytes, self.n_slots) if self.n_slots else 0


@dataclass(frozen=True)
class CacheLayout:
    """Where a llama.cpp configuration keeps each MoE layer's experts.

    ``n_cpu`` MoE layers (the first ones) keep their experts in host memory; of those, the
    layers of groups with slots are cached, the others computed on the CPU; the rest are on the
    GPU. ``cache_mib`` is the ``--moe-cache-mib`` value."""

    n_layers: int
    n_cpu: int
    cache_mib: int
    groups: tuple[CacheGroup, ...]

    @property
    def cached_layers(self) -> tuple[int, ...]:
        return tuple(sorted(x for g in self.groups if g.n_slots for x in g.layers))

    @property
    def uncached_cpu_layers(self) -> int:
        return self.n_cpu - len(self.cached_layers)

    @property
    def n_gpu(self) -> int:
        return self.n_layers - self.n_cpu

    @property
    def alloc_bytes(self) -> int:
        return sum(g.alloc_bytes for g in self.groups)

    @property
    def n_slots(self) -> int:
        return sum(g.n_slots for g in self.groups)


def bank_bytes(g: ModelGeometry, layer: int) -> tuple[int, int, int]:
    """One expert's bytes in each of layer ``layer``'s expert tensors (gate, up, down): the
    weights only, at their stored type (biases and scales are not cached)."""
    n = g.hidden * g.expert_intermediate
    if not g.expert_layers:
        b = n * g.dtype_bytes
        return (b, b, b)
    x = g.expert_layers[layer]
    return (tensor_bytes(x.gate_type, n, g.hidden), tensor_bytes(x.up_type, n, g.hidden),
            tensor_bytes(x.down_type, n, g.expert_intermediate))


def _layout_key(g: ModelGeometry, layer: int) -> tuple:
    if not g.expert_layers:
        return ()
    x = g.expert_layers[layer]
    return (x.gate_type, x.up_type, x.down_type)


def alloc_size(banks: Sequence[int], n_slots: int) -> int:
    """Bytes of a group's banks at ``n_slots``: each bank holds one extra slot ("CUDA MMQ can
    read past the last expert") and is padded once to the buffer alignment."""
    return sum(-(-b * (n_slots + 1) // ALIGNMENT) * ALIGNMENT for b in banks)


def cache_layout(g: ModelGeometry, n_cpu: int, cache_mib: int) -> CacheLayout:
    """The cache of ``--n-cpu-moe`` covering ``n_cpu`` MoE layers and ``--moe-cache-mib
    cache_mib`` on one GPU.

    Upstream (llama-moe-cache.cpp @4b060f27, the constructor): layers with the same expert
    layout form a group (L138, L246); the budget is split among groups by their host expert
    bytes, "so each group caches the same fraction of its experts" (L304-L310); a group takes the
    most slots whose banks fit (L312), and a group with fewer than ``n_expert_used`` slots is not
    cached (L315). The size counts MiB as ``value * 1024 * 1024`` (common/arg.cpp)."""
    L = g.n_layers
    if not 0 <= n_cpu <= L:
        raise CopeInputError(f"layers on the CPU must be in [0, {L}], got {n_cpu}",
                             field="n_cpu_moe")
    if isinstance(cache_mib, bool) or not isinstance(cache_mib, (int, np.integer)) \
            or cache_mib < 0:
        raise CopeInputError(f"expected a whole number of MiB >= 0, got {cache_mib!r}",
                             field="moe_cache_mib")
    members: dict[tuple, list[int]] = {}
    for layer in range(n_cpu):
        members.setdefault(_layout_key(g, layer), []).append(layer)
    size = int(cache_mib) * MIB
    host = {key: len(ls) * g.n_experts * sum(bank_bytes(g, ls[0])) for key, ls in members.items()}
    total = sum(host.values())
    groups = []
    for key, layers in members.items():
        banks = bank_bytes(g, layers[0])
        budget = int(size * host[key] / total) if size else 0
        slots = _slots(banks, budget, len(layers) * g.n_experts)
        groups.append(CacheGroup(tuple(layers), banks, budget,
                                 slots if slots >= g.top_k else 0))
    return CacheLayout(L, n_cpu, int(cache_mib), tuple(groups))


def _slots(banks: Sequence[int], budget: int, most: int) -> int:
    """The largest n <= most with alloc_size(banks, n) <= budget (upstream counts up from 0)."""
    slot = sum(banks)
    n = min(max(budget // slot - 1, 0), most)
    while n > 0 and alloc_size(banks, n) > budget:
        n -= 1
    while n < most and alloc_size(banks, n + 1) <= budget:
        n += 1
    return n if alloc_size(banks, n) <= budget else 0


def cache_mib_for_bytes(g: ModelGeometry, n_cpu: int, free_bytes: float) -> int:
    """The largest ``--moe-cache-mib`` whose banks fit in ``free_bytes`` (0 when none)."""
    mib = int(max(free_bytes, 0) // MIB)
    while mib > 0 and cache_layout(g, n_cpu, mib).alloc_bytes > free_bytes:
        mib -= 1
    return mib


@dataclass(frozen=True)
class CacheConfig:
    """One point of llama.cpp's space: ``--n-cpu-moe`` (as MoE layers on the CPU),
    ``--moe-cache-mib``, ``--moe-cache-cpu-share`` and the eviction rule of the build."""

    n_cpu: int
    cache_mib: int
    cpu_share: float
    version: CacheVersion

    def __post_init__(self) -> None:
        if not 0.0 <= self.cpu_share < 1.0:
            raise CopeInputError(f"expected a share in [0, 1), got {self.cpu_share!r}",
                                 field="moe_cache_cpu_share")
        if self.cpu_share and self.version.share_build is None:
            with_share = " or ".join(f"{v.label} cache ({v.share_build})"
                                     for v in CacheVersion if v.share_build)
            raise CopeInputError(f"--moe-cache-cpu-share exists only with the {with_share}",
                                 field="moe_cache_cpu_share")


@dataclass(frozen=True, eq=False)
class CacheCounts:
    """Replay counts of llama.cpp cache configurations.

    ``cnt[i, p, h, c]``: lookups (token x cached layer) of configuration ``i`` in prompt ``p``
    with ``h`` hits and ``c`` misses computed on the CPU; the other ``top_k - h - c`` were
    uploaded."""

    configs: tuple[CacheConfig, ...]
    layouts: tuple[CacheLayout, ...]
    cnt: np.ndarray

    def totals(self) -> dict[str, np.ndarray]:
        """Hits, uploads and CPU misses of each prompt (summed over tokens and cached layers),
        shape (configs, P)."""
        k = self.cnt.shape[-1] - 1
        h = np.arange(k + 1)[:, None]
        c = np.arange(k + 1)[None, :]
        return {"hits": (self.cnt * h).sum(axis=(2, 3)),
                "cpu_misses": (self.cnt * c).sum(axis=(2, 3)),
                "uploads": (self.cnt * np.maximum(k - h - c, 0)).sum(axis=(2, 3))}

    def per_token(self, tokens: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`totals` per token of each prompt, shape (configs, P)."""
        t = np.asarray(tokens, np.float64)
        return {name: n / t for name, n in self.totals().items()}


def replay_cache(trace: Trace, configs: Sequence[CacheConfig], *,
                 persist: bool = True, reading: Reading | Sequence[Reading] = OURS
                 ) -> CacheCounts:
    """Replay each configuration over ``trace`` (configurations run in parallel).

    A configuration whose every cache group has a slot for each expert its layers route to in
    the trace never evicts: under either rule and every reading a lookup hits exactly the
    experts its layer routed to before (since the server started, or since the prompt did),
    and no miss goes to the CPU (the share applies only to a full group, which then has no
    miss). Its counts are summed from one pass over the trace (:func:`_first_use_counts`), the
    same integers the kernels count; the others are replayed.

    Parameters
    ----------
    trace : Trace
        Decode routing; the trace's model prices MiB -> slots (bytes as stored).
    configs : sequence of CacheConfig
    persist : bool
        True (upstream: the cache belongs to the server's context and is never cleared): the
        cache starts empty and carries over from prompt to prompt in trace order. False: every
        prompt starts from an empty cache (a server started per prompt).
    reading : Reading or sequence of Reading
        The class-LRU's inferred rules (:data:`READINGS`), one for all configurations or one
        each; the LRU has none.
    """
    g = trace.model
    if not configs:
        raise CopeInputError("no llama.cpp cache configuration given", field="configs")
    each = [reading] * len(configs) if isinstance(reading, Reading) else list(reading)
    if len(each) != len(configs) or any(r not in READINGS for r in each):
        raise CopeInputError(f"expected one of {[r.label for r in READINGS]} (or one per "
                             f"configuration), got {reading!r}", field="reading")
    layouts = tuple(cache_layout(g, c.n_cpu, c.cache_mib) for c in configs)
    n = len(configs)
    L, k, E = g.n_layers, g.top_k, g.n_experts
    cnt = np.zeros((n, trace.n_prompts, k + 1, k + 1), np.int64)
    distinct = distinct_per_layer(trace.routed, E)
    never = [all(gr.n_slots >= sum(distinct[x] for x in gr.layers)
                 for gr in lay.groups if gr.n_slots) for lay in layouts]
    summed = [i for i in range(n) if never[i] and layouts[i].cached_layers]
    if summed:
        first = first_use_counts(trace.routed, trace.prompt_start, E, persist)
        for i in summed:
            cnt[i, :, :, 0] = first[list(layouts[i].cached_layers)].sum(axis=0)
    run = [i for i in range(n) if not never[i]]
    if not run:
        return CacheCounts(tuple(configs), layouts, cnt)
    layers = np.zeros((n, max(L, 1)), np.int64)
    group = np.zeros((n, max(L, 1)), np.int64)
    n_cached = np.zeros(n, np.int64)
    offs, off_of = [], [0]
    for i, lay in enumerate(layouts):
        live = [gr for gr in lay.groups if gr.n_slots]
        cached = lay.cached_layers
        n_cached[i] = len(cached)
        layers[i, :len(cached)] = cached
        which = {x: j for j, gr in enumerate(live) for x in gr.layers}
        group[i, :len(cached)] = [which[x] for x in cached]
        offs.extend(np.concatenate([[0], np.cumsum([gr.n_slots for gr in live])]).tolist())
        off_of.append(len(offs))
    version = np.array([c.version.kernel for c in configs], np.int64)
    share = np.array([c.cpu_share for c in configs], np.float64)
    import numba  # with the first replay, not with the package (see _CLOCKS)

    from . import _cache_kernels as K
    bucket_start, run_order = buckets(run, n_cached * np.where(version, CLASS_LRU_WEIGHT, 1.0),
                                      numba.get_num_threads())
    K._cache_buckets(
        trace.routed, trace.prompt_start.astype(np.int64), layers, n_cached, group,
        np.asarray(offs, np.int64), np.asarray(off_of, np.int64), version, share,
        bool(persist), E, np.array([getattr(K, _CLOCKS[r.clock]) for r in each], np.int64),
        np.array([getattr(K, _ORDERS[r.cpu_order]) for r in each], np.int64), bucket_start,
        run_order, cnt)
    return CacheCounts(tuple(configs), layouts, cnt)

