"""Everything one measurement needs on an accelerator, built the same way for the executor and
the profiler: host expert store, slot pool, staging slots, layer buffers, runner, shared work."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..geometry import ModelGeometry
from .accelerator import Accelerator
from .execution import ExpertRunner, LayerIO
from .shared import SharedWork
from .weights import ExpertStore, Filler, SlotPool, expert_numel


@dataclass(eq=False)
class Rig:
    """The pieces of the mechanisms, wired together (see :meth:`build`)."""

    acc: Accelerator
    g: ModelGeometry
    dtype: torch.dtype
    store: ExpertStore
    pool: SlotPool
    staging: SlotPool
    io: LayerIO
    runner: ExpertRunner
    shared: SharedWork

    @classmethod
    def build(cls, acc, g: ModelGeometry, dtype: torch.dtype, *, pool_slots: int,
              max_context: int, store_layers: int | None = None,
              store_experts: int | None = None, seed: int = 0) -> Rig:
        """Allocate and fill.

        Parameters
        ----------
        pool_slots : int
            Expert slots on the accelerator (``K * L`` for the executor).
        max_context : int
            Largest context of any token that will run.
        store_layers, store_experts : int, optional
            A smaller host store whose ids wrap around (the profiler's); default every expert.
        """
        filler = Filler(seed)
        store = ExpertStore(acc, g, dtype, layers=store_layers, experts=store_experts,
                            filler=filler)
        pool = SlotPool(acc, pool_slots, expert_numel(g), dtype)
        staging = SlotPool(acc, g.top_k, expert_numel(g), dtype)
        io = LayerIO.allocate(acc, g, dtype)
        runner = ExpertRunner(acc, g, dtype, store, pool, staging, io)
        shared = SharedWork(acc, g, dtype, io, max_context, Filler(seed + 1))
        acc.synchronize()
        return cls(acc, g, dtype, store, pool, staging, io, runner, shared)
