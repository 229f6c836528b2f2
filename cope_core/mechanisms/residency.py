"""The three residency mechanisms (docs/design.md#the-policy-matrix, #replay-semantics) as cache
states the executor and the profiler drive, plus the prefetch path that moves weights when a mutable
residency inserts an expert.

They follow the replay's rules exactly (initial fill from calibration popularity, stamps, LRU
victims, the first predicted non-resident id): the numba kernels in :mod:`cope_core.replay`
count what happens, these make it happen, and a test checks that both see the same hits and
prefetches. Slots: layer ``l``'s initial rank-``r`` expert sits in slot ``l*K + r`` for every
residency, so switching candidates between runs moves no weights.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..matrix import Residency

_FREE = np.inf   # stamp of a non-resident expert: never the LRU victim


class ResidencyState:
    """Which expert sits in which slot, per layer; the base class is ``fixed`` residency.

    Parameters
    ----------
    order : ndarray (L, E)
        ``order[l, r]``: the layer's expert of popularity rank ``r`` (``replay.fill_order``).
    K : int
        Expert slots per layer (the pool holds ``K * L``).
    """

    residency = Residency.FIXED

    def __init__(self, order: np.ndarray, K: int):
        self.order = np.asarray(order, dtype=np.int64)
        self.L, self.E = self.order.shape
        if not 0 <= K <= self.E:
            raise ValueError(f"K={K} outside [0, {self.E}]")
        self.K = int(K)
        self.slot_of = np.full((self.L, self.E), -1, np.int64)
        self.stamp = np.full((self.L, self.E), _FREE)
        self.clock = 0
        self.reset()

    @property
    def n_slots(self) -> int:
        return self.K * self.L

    def reset(self) -> None:
        """The initial fill: rank ``r`` of layer ``l`` in slot ``l*K + r`` with stamp ``-(r+1)``."""
        self.slot_of[:] = -1
        self.stamp[:] = _FREE
        rows = np.repeat(np.arange(self.L), self.K)
        ranks = np.tile(np.arange(self.K), self.L)
        experts = self.order[rows, ranks]
        self.slot_of[rows, experts] = rows * self.K + ranks
        self.stamp[rows, experts] = -(ranks + 1.0)
        self.clock = 0

    def assignment(self) -> dict[int, tuple[int, int]]:
        """Slot -> (layer, expert) of every resident expert."""
        layers, experts = np.nonzero(self.slot_of >= 0)
        return {int(self.slot_of[l, e]): (int(l), int(e)) for l, e in zip(layers, experts)}

    def lookup(self, layer: int, routed: Sequence[int] | np.ndarray
               ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Hits ``(position, slot)`` and misses ``(position, expert)`` of one layer, counted
        against residency at the start of the layer; hits are stamped in routed order."""
        hits, misses = [], []
        slots = self.slot_of[layer]
        for pos, e in enumerate(routed):
            s = slots[e]
            if s >= 0:
                hits.append((pos, int(s)))
                self._touch(layer, int(e))
            else:
                misses.append((pos, int(e)))
        return hits, misses

    def _touch(self, layer: int, e: int) -> None:
        pass  # fixed residency keeps no recency

    def prefetch(self, layer: int, predicted: Sequence[int]) -> tuple[int, int] | None:
        """Insert the first predicted id not resident in ``layer + 1``; return ``(slot,
        expert)`` whose weights must move there, or None. Fixed residency never changes."""
        return None


class PerLayerState(ResidencyState):
    """``mutable_per_layer``: a prefetch into layer ``l+1`` evicts that layer's LRU expert."""

    residency = Residency.MUTABLE_PER_LAYER

    def _touch(self, layer: int, e: int) -> None:
        self.stamp[layer, e] = self.clock
        self.clock += 1

    def _candidate(self, layer: int, predicted: Sequence[int]) -> int | None:
        if not 0 < self.K < self.E or layer >= self.L - 1:
            return None
        nxt = self.slot_of[layer + 1]
        for e in predicted:
            if e < 0:
                break
            if nxt[e] < 0:
                return int(e)
        return None

    def _victim(self, layer: int) -> tuple[int, int] | None:
        v = int(np.argmin(self.stamp[layer + 1]))
        return (layer + 1, v) if self.stamp[layer + 1, v] != _FREE else None

    def prefetch(self, layer: int, predicted: Sequence[int]) -> tuple[int, int] | None:
        q = self._candidate(layer, predicted)
        if q is None:
            return None
        victim = self._victim(layer)
        if victim is None:
            return None
        vl, ve = victim
        slot = int(self.slot_of[vl, ve])
        self.slot_of[vl, ve] = -1
        self.stamp[vl, ve] = _FREE
        self.slot_of[layer + 1, q] = slot
        self.stamp[layer + 1, q] = self.clock
        self.clock += 1
        return slot, q


class CrossLayerState(PerLayerState):
    """``mutable_cross_layer``: one pool of ``K*L`` slots; the victim is the LRU expert of any
    layer but the executing one (ties: lower layer, then lower id: row-major argmin order)."""

    residency = Residency.MUTABLE_CROSS_LAYER

    def _victim(self, layer: int) -> tuple[int, int] | None:
        saved = self.stamp[layer].copy()
        self.stamp[layer] = _FREE
        try:
            flat = int(np.argmin(self.stamp))
            vl, ve = divmod(flat, self.E)
            return (vl, ve) if self.stamp[vl, ve] != _FREE else None
        finally:
            self.stamp[layer] = saved


STATES = {Residency.FIXED: ResidencyState, Residency.MUTABLE_PER_LAYER: PerLayerState,
          Residency.MUTABLE_CROSS_LAYER: CrossLayerState}


def make_state(residency: Residency | str, order: np.ndarray, K: int) -> ResidencyState:
    return STATES[Residency(residency)](order, K)


def prefetch_step(runner, shared, state: ResidencyState, layer: int,
                  predicted: Sequence[int]) -> bool:
    """The residency mechanism's per-layer work for a mutable residency, issued while layer
    ``layer`` runs: the next-layer prediction on the accelerator, the choice and eviction, and
    (when an expert is inserted) its weight copy on the copy stream. The next accelerator
    expert compute waits for that copy (``runner.pending``). Returns whether one was inserted."""
    shared.predict_next(layer)
    choice = state.prefetch(layer, predicted)
    if choice is None:
        return False
    slot, expert = choice
    runner.pool.stage(slot, runner.store, layer + 1, expert)
    runner.pending = runner.acc.copy.record()
    return True
