"""The size cliff of llama.cpp's MoE cache: the fewest slots, and the smallest
``--moe-cache-mib``, with which a group of cached layers can hit at all
(docs/design.md#llamacpp-moe-cache).

A group's layers share one pool of slots and are looked up once each per decoded token, in layer
order, every lookup holding ``top_k`` distinct keys (layer, expert). Between the lookup of layer
``l`` at token ``t`` and its lookup at ``t + 1`` the group's ``n - 1`` other layers each touch
``top_k`` keys of their own, all distinct, so the key layer ``l`` touched last at ``t`` has at
least ``(n - 1) * top_k`` keys used after it:

* under the **LRU** a key stays cached while fewer keys than the slots were used after it, so
  with ``(n - 1) * top_k`` slots or fewer every key is evicted before its layer comes back: 0
  hits on any trace; with one slot more the last key of each lookup survives, and hits when its
  layer routes it again. The cliff is ``max(top_k, (n - 1) * top_k + 1)`` slots.
* under the **class-LRU** the victim is chosen by age and frequency class, so a frequently used
  expert can outlive the keys around it: without a CPU share the lookup before layer ``l``'s
  fills ``top_k`` slots with its own keys, so ``top_k + 1`` slots are the fewest that can keep
  one of layer ``l``'s; with a CPU share some misses are never uploaded, and ``top_k`` slots
  (the fewest llama.cpp caches a group with) can hit.

A group of one layer can hit with ``top_k`` slots under either rule. These bounds hold for every
reading of the class-LRU's inferred rules (they only need a victim rule that can spare a key).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...geometry import MIB, ModelGeometry
from .moe_cache import CacheLayout, CacheVersion, alloc_size, cache_layout


def cliff_slots(version: CacheVersion, n_layers: int, top_k: int, cpu_share: float = 0.0) -> int:
    """The fewest slots with which a group of ``n_layers`` cached layers can hit.

    Parameters
    ----------
    version : CacheVersion
        The eviction rule.
    n_layers : int
        Layers in the group (>= 1).
    top_k : int
        Experts routed per token and layer.
    cpu_share : float
        ``--moe-cache-cpu-share`` (class-LRU only).
    """
    if n_layers <= 1:
        return top_k
    if version is CacheVersion.LRU:
        return (n_layers - 1) * top_k + 1
    return top_k if cpu_share > 0 else top_k + 1


@dataclass(frozen=True)
class GroupCliff:
    """One group's cliff: its layers (0-based MoE layers), the fewest slots that can hit, and the
    smallest ``--moe-cache-mib`` that gives the group those slots (None when no size does)."""

    layers: tuple[int, ...]
    slots: int
    mib: int | None


def group_cliffs(g: ModelGeometry, n_cpu: int, version: CacheVersion,
                 cpu_share: float = 0.0) -> tuple[GroupCliff, ...]:
    """Every group's cliff when the first ``n_cpu`` MoE layers keep their experts in host memory
    (groups as :func:`cache_layout` forms them; the budget is split among them by host bytes)."""
    layout = cache_layout(g, n_cpu, 0)
    out = []
    for j, grp in enumerate(layout.groups):
        need = cliff_slots(version, len(grp.layers), g.top_k, cpu_share)
        out.append(GroupCliff(grp.layers, need, _smallest_mib(g, n_cpu, j, need)))
    return tuple(out)


def cliff_mib(g: ModelGeometry, n_cpu: int, version: CacheVersion,
              cpu_share: float = 0.0) -> int | None:
    """The smallest ``--moe-cache-mib`` with which the cache can hit at all: the smallest of the
    groups' cliffs (None without host layers)."""
    mibs = [c.mib for c in group_cliffs(g, n_cpu, version, cpu_share) if c.mib is not None]
    return min(mibs) if mibs else None


def below_cliff(g: ModelGeometry, layout: CacheLayout, version: CacheVersion,
                cpu_share: float = 0.0) -> bool:
    """Whether a cache cannot hit in some of its layers: no group is cached, or a cached group
    (one with at least ``top_k`` slots) has fewer slots than its cliff, so its layers upload
    every expert they use (under the LRU: on every trace) where uncached they would compute it
    on the CPU. Such a size is never recommended."""
    cached = [grp for grp in layout.groups if grp.n_slots]
    return not cached or any(
        grp.n_slots < cliff_slots(version, len(grp.layers), g.top_k, cpu_share)
        for grp in cached)


def _smallest_mib(g: ModelGeometry, n_cpu: int, j: int, need: int) -> int | None:
    """The smallest MiB at which group ``j`` gets ``need`` slots: its share of the size is
    ``size * host_j / host`` bytes (:func:`cache_layout`), so the size whose share holds
    ``need`` slots' banks, then checked against the layout itself (the share is rounded down)."""
    groups = cache_layout(g, n_cpu, 0).groups
    host = [len(grp.layers) * g.n_experts * grp.slot_bytes for grp in groups]
    if need > len(groups[j].layers) * g.n_experts:
        return None

    def enough(mib: int) -> bool:
        return mib > 0 and cache_layout(g, n_cpu, mib).groups[j].n_slots >= need

    mib = max(-(-alloc_size(groups[j].bank_bytes, need) * sum(host) // (host[j] * MIB)), 1)
    while enough(mib - 1):
        mib -= 1
    while not enough(mib):
        mib += 1
    return mib
