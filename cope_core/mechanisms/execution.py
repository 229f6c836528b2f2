"""The four execution strategies and the layer-partition layers
(docs/design.md#the-policy-matrix), written once.

The reference executor runs them on every token and layer; the profiler times the very same
functions for its ``schedule``, ``layer`` and ``prefetch`` rows. A strategy gets the layer's
hits as ``(position, slot)`` pairs and its misses as ``(position, expert)`` pairs, where
``position`` indexes the layer's ``top_k`` routed experts (and their routing weights). It issues
accelerator work on the compute stream, weight staging on the copy stream, computes its CPU share
on the calling (host) thread, and returns once the layer's result has joined: every layer ends
synchronised, as the paper's per-layer schedules do.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..geometry import ModelGeometry
from ..matrix import Execution
from .experts import accumulate
from .weights import ExpertStore, SlotPool

Hit = tuple[int, int]     # (routed position, slot)
Miss = tuple[int, int]    # (routed position, expert id)


@dataclass(frozen=True, eq=False)
class LayerIO:
    """Buffers of one MoE layer, reused by every layer (each layer ends synchronised).

    ``x`` (model dtype) and ``w`` (float32 routing weights of the routed positions) are written
    by the shared block before the layer; ``out`` (float32) receives the routed experts' sum.
    Host twins are pinned on CUDA so activation copies run asynchronously."""

    x: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor
    y_dev: torch.Tensor
    x_host: torch.Tensor
    w_host: torch.Tensor
    y_host: torch.Tensor

    @classmethod
    def allocate(cls, acc, g: ModelGeometry, dtype: torch.dtype) -> LayerIO:
        H, k = g.hidden, g.top_k
        return cls(x=acc.alloc((1, H), dtype), w=acc.alloc((k,), torch.float32),
                   out=acc.alloc((1, H), torch.float32), y_dev=acc.alloc((1, H), torch.float32),
                   x_host=acc.host_alloc((1, H), dtype), w_host=acc.host_alloc((k,), torch.float32),
                   y_host=acc.host_alloc((1, H), torch.float32))


class ExpertRunner:
    """The primitives every strategy is made of: resident and staged accelerator experts, CPU
    experts, activation copies, merge, and the hook where side work (a prefetch) is issued."""

    def __init__(self, acc, g: ModelGeometry, dtype: torch.dtype, store: ExpertStore,
                 pool: SlotPool, staging: SlotPool, io: LayerIO):
        self.acc, self.g, self.dtype = acc, g, dtype
        self.store, self.pool, self.staging, self.io = store, pool, staging, io
        self.H, self.I = g.hidden, g.expert_intermediate
        #: event of a prefetch copy that the next accelerator expert compute must wait for
        self.pending = None
        #: called once per layer after its accelerator work is issued, before host work
        self.side_work: Callable[[], object] | None = None   # its result is not used

    # --- primitives ----------------------------------------------------------------------------
    def begin(self) -> None:
        self.acc.compute.submit(self.io.out.zero_)

    def to_host(self):
        """Queue the activation and routing weights to the host; returns their event."""
        io = self.io
        self.acc.compute.submit(_copy2, io.x_host, io.x, io.w_host, io.w)
        return self.acc.compute.record()

    def resident(self, hits: Sequence[Hit]) -> None:
        """Queue the resident experts on the accelerator (after any pending prefetch)."""
        if self.pending is not None:
            self.acc.compute.wait(self.pending)
            self.pending = None
        if hits:
            io = self.io
            self.acc.compute.submit(accumulate, io.out, io.x, io.w, [p for p, _ in hits],
                                    [self.pool.slot(s) for _, s in hits], self.H, self.I)

    def stage(self, layer: int, staged: Sequence[Miss]) -> list:
        """Queue the copies of missed experts into staging slots; one event per expert."""
        events = []
        for i, (_, e) in enumerate(staged):
            self.staging.stage(i, self.store, layer, e)
            events.append(self.acc.copy.record())
        return events

    def staged(self, staged: Sequence[Miss], events: Sequence, each: bool) -> None:
        """Queue compute of staged experts, each as soon as its copy lands (``each``) or all
        after the last copy."""
        io = self.io
        if not staged:
            return
        if not each:
            self.acc.compute.wait(events[-1])
            self.acc.compute.submit(accumulate, io.out, io.x, io.w, [p for p, _ in staged],
                                    [self.staging.slot(i) for i in range(len(staged))],
                                    self.H, self.I)
            return
        for i, (p, _) in enumerate(staged):
            self.acc.compute.wait(events[i])
            self.acc.compute.submit(accumulate, io.out, io.x, io.w, [p],
                                    [self.staging.slot(i)], self.H, self.I)

    def side(self) -> None:
        if self.side_work is not None:
            work, self.side_work = self.side_work, None
            work()

    def host(self, layer: int, cpu: Sequence[Miss], ready) -> None:
        """Compute CPU experts on this thread once the activation is on the host, then queue the
        result's copy to the accelerator and the merge."""
        io = self.io
        ready.synchronize()
        y = torch.zeros((1, self.H), dtype=torch.float32)
        self.acc.host_compute(accumulate, y, io.x_host, io.w_host, [p for p, _ in cpu],
                              [self.store.expert(layer, e) for _, e in cpu], self.H, self.I)
        io.y_host.copy_(y)
        self.acc.compute.submit(merge_outputs, io.out, io.y_dev, io.y_host)

    def finish(self) -> None:
        """The join: wait until the layer's result is complete."""
        self.acc.compute.record().synchronize()


def _copy2(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> None:
    a.copy_(b, non_blocking=True)
    c.copy_(d, non_blocking=True)


def merge_outputs(out: torch.Tensor, y_dev: torch.Tensor, y_host: torch.Tensor) -> None:
    """Add the CPU experts' output to the accelerator's (the copy back is part of the merge the
    profiler times, so it runs on the accelerator's stream)."""
    y_dev.copy_(y_host, non_blocking=True)
    out.add_(y_dev)


# --- the four strategies -------------------------------------------------------------------------
def run_parallel(r: ExpertRunner, layer: int, hits: Sequence[Hit], misses: Sequence[Miss]) -> None:
    """Hits on the accelerator, every miss on the CPU, concurrently; results merged."""
    r.begin()
    ready = r.to_host() if misses else None
    r.resident(hits)
    r.side()
    if misses:
        r.host(layer, misses, ready)
    r.finish()


def run_wait_then_gpu(r: ExpertRunner, layer: int, hits: Sequence[Hit],
                      misses: Sequence[Miss]) -> None:
    """Copy every missed expert, then compute all routed experts on the accelerator."""
    r.begin()
    events = r.stage(layer, misses)
    if events:
        r.acc.compute.wait(events[-1])  # nothing computes before every copy has landed
    r.resident(hits)
    r.staged(misses, events, each=False)
    r.side()
    r.finish()


def run_ready_first(r: ExpertRunner, layer: int, hits: Sequence[Hit],
                    misses: Sequence[Miss]) -> None:
    """Resident experts start while misses are copied; each staged expert runs when it lands."""
    r.begin()
    events = r.stage(layer, misses)
    r.resident(hits)
    r.staged(misses, events, each=True)
    r.side()
    r.finish()


def run_cost_selected(r: ExpertRunner, layer: int, hits: Sequence[Hit], misses: Sequence[Miss],
                      cpu_count: int) -> None:
    """``cpu_count`` misses on the CPU, the others staged and run on the accelerator, with CPU
    work, resident work and copies overlapped. The first misses (in routed order) are staged
    so their copies start first."""
    cut = len(misses) - cpu_count
    staged, cpu = misses[:cut], misses[cut:]
    r.begin()
    ready = r.to_host() if cpu else None
    events = r.stage(layer, staged)
    r.resident(hits)
    r.staged(staged, events, each=True)
    r.side()
    if cpu:
        r.host(layer, cpu, ready)
    r.finish()


def run_execution(r: ExpertRunner, execution: Execution, layer: int, hits: Sequence[Hit],
                  misses: Sequence[Miss], cpu_count: int | None = None) -> None:
    """Run one MoE layer with ``execution``; ``cpu_count`` is cost_selected's CPU share."""
    if execution is Execution.PARALLEL:
        run_parallel(r, layer, hits, misses)
    elif execution is Execution.WAIT_THEN_GPU:
        run_wait_then_gpu(r, layer, hits, misses)
    elif execution is Execution.READY_FIRST:
        run_ready_first(r, layer, hits, misses)
    else:
        if cpu_count is None or not 0 <= cpu_count <= len(misses):
            raise ValueError(f"cost_selected needs a CPU share in [0, {len(misses)}], "
                             f"got {cpu_count}")
        run_cost_selected(r, layer, hits, misses, cpu_count)


# --- layer partition ---------------------------------------------------------------------------
def run_cpu_layer(r: ExpertRunner, layer: int, routed: Sequence[int]) -> None:
    """A whole MoE layer on the CPU: activation down, every routed expert on the host, result up."""
    r.begin()
    ready = r.to_host()
    r.side()
    r.host(layer, list(enumerate(routed)), ready)
    r.finish()


def run_gpu_layer(r: ExpertRunner, slots: Sequence[int]) -> None:
    """A whole MoE layer on the accelerator with every expert resident."""
    r.begin()
    r.resident(list(enumerate(slots)))
    r.side()
    r.finish()
