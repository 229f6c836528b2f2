"""The fastest layer ranges across several GPUs that every device holds
(docs/design.md#several-gpus).

Given each device's memory and what one block costs on it (its routed experts on the device, in
host memory, or a block without routed experts), :func:`search_devices` chooses each device's
contiguous range of blocks and, within it, which blocks keep their experts in host memory: the
cheapest per token, by dynamic programming over (device, first block left), every device counted
as :func:`~.devices.device_memories` counts it. Within a device's range the experts of its first
blocks stay on it and the last ones go to host memory, as ``--fit`` orders them; a device given
no block is left out (``-dev`` lists the others), and each boundary between devices in use costs
one hand-off.

What the command writes (``DevicesAnswer.flags``): ``-ts`` of whole layer counts, which llama.cpp
places exactly (:func:`~.devices.split_counts`), and one ``-ot`` of the host blocks' experts,
applied after the split (so the overrides do not move the boundaries, as they do with
``--n-cpu-moe`` and a proportional ``-ts``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .command import ALL_EXPERTS
from .devices import Buffers, DeviceLayout, block_bytes
from .vram import LlamaModel, Placement


@dataclass(frozen=True)
class BlockCosts:
    """Microseconds per token of one block on a device: a MoE block with its routed experts on
    the device (``full``) or in host memory (``host``), and a block without routed experts
    (``dense``)."""

    full: float
    host: float
    dense: float


@dataclass(frozen=True)
class DevicePlan:
    """A placement across devices and its predicted cost per token (microseconds)."""

    layout: DeviceLayout
    tpot_us: float

    @property
    def used(self) -> tuple[int, ...]:
        return self.layout.used


def plan_cost(m: LlamaModel, layout: DeviceLayout, costs: Sequence[BlockCosts],
              handoff_us: float) -> float:
    """Microseconds per token of ``layout`` (:func:`blocks_tpot` of its blocks); blocks wholly
    in host memory are not priced (inf)."""
    if layout.start > 0:
        return float("inf")
    moe = frozenset(int(b) for b in np.flatnonzero(block_bytes(m, 1).moe))
    return blocks_tpot(costs, *layout.blocks(m.n_layer, moe), handoff_us)


def blocks_tpot(costs: Sequence[BlockCosts], attention: Sequence[int],
                experts: Sequence[int | None], hand_us: float) -> float:
    """Microseconds per token of any placement, block by block: block ``b``'s shared work on
    card ``attention[b]``, its routed experts on card ``experts[b]`` (-1: in host memory, priced
    with the attention card's link; None: a block without routed experts), and one hand-off
    each time the token moves from one card to another (a CPU split in between is in the host
    layer's own price). Covers what ``-ot ...=CUDA1`` writes: experts on another card than the
    layer's attention, each such block crossing twice."""
    total, hops, at = 0.0, 0, None
    for a, e in zip(attention, experts):
        c = costs[a]
        total += c.dense
        visits = [a]
        if e is not None:
            total += (c.host - c.dense) if e < 0 else (costs[e].full - costs[e].dense)
            if e >= 0 and e != a:
                visits += [e, a]            # out to the experts' card and back
        for v in visits:
            hops += at is not None and v != at
            at = v
    return total + hops * hand_us


def search_devices(m: LlamaModel, caps: Sequence[int], costs: Sequence[BlockCosts],
                   handoff_us: float, buffers: Buffers) -> DevicePlan | None:
    """The cheapest placement (module docstring) that keeps every device within ``caps`` bytes;
    None when none does (not even every routed expert in host memory fits)."""
    nd, n = len(caps), m.n_layer
    bb = block_bytes(m, buffers.n_ctx, buffers.type_k, buffers.type_v)
    zero = np.zeros(1, np.int64)
    dense_c = np.concatenate([zero, np.cumsum(bb.dense + bb.kv)])
    exp_c = np.concatenate([zero, np.cumsum(bb.experts)])
    moe_c = np.concatenate([zero, np.cumsum(bb.moe.astype(np.int64))])
    every_host = Placement(-1, (ALL_EXPERTS,))
    # compute buffers: the first device in use holds the copies of host weights; the last the
    # output's logits
    comp = {(first, last, copies): buffers.compute(m, every_host if first and copies
                                                   else Placement(), last)
            for first in (False, True) for last in (False, True) for copies in (False, True)}

    def device(i: int, a: int, b: int, first: bool, copies: bool
               ) -> tuple[float, int] | None:
        """Device ``i`` holding blocks ``a .. b-1``: its cost and the end of its full blocks."""
        last = b == n
        room = caps[i] - (dense_c[b] - dense_c[a]) - comp[first, last, copies] \
            - (bb.output if last else 0)
        if room < 0:
            return None
        e = int(np.searchsorted(exp_c, exp_c[a] + room, side="right")) - 1
        e = min(max(e, a), b)
        full = int(moe_c[e] - moe_c[a])
        moe = int(moe_c[b] - moe_c[a])
        if not copies and full < moe:
            return None
        c = costs[i]
        return full * c.full + (moe - full) * c.host + (b - a - moe) * c.dense, e

    best: DevicePlan | None = None
    for copies in (False, True):
        plan = _solve(nd, n, device, handoff_us, copies, bb.moe)
        if plan is not None and (best is None or plan.tpot_us < best.tpot_us):
            best = plan
    return best


def _solve(nd: int, n: int, device, handoff_us: float, copies: bool, moe: np.ndarray
           ) -> DevicePlan | None:
    """The dynamic programme of :func:`search_devices` for one choice of copies."""
    inf = float("inf")
    # cost[i][j][s]: devices i.. hold blocks j.. ; s: a device before i is in use
    cost = [[[inf, inf] for _ in range(n + 1)] for _ in range(nd + 1)]
    pick: dict[tuple[int, int, int], tuple[int, int]] = {}
    cost[nd][n] = [0.0, 0.0]
    for i in range(nd - 1, -1, -1):
        for j in range(n + 1):
            for s in (0, 1):
                here, choice = float("inf"), (j, j)
                for k in range(j + 1, n + 1):
                    rest = cost[i + 1][k][1]
                    if rest == inf:
                        continue
                    got = device(i, j, k, not s, copies)
                    if got is None:
                        break               # a longer range holds more: it fits no better
                    total = got[0] + rest + (handoff_us if s else 0.0)
                    if total < here:
                        here, choice = total, (k, got[1])
                if cost[i + 1][j][s] < here:          # device i left out (a tie keeps it)
                    here, choice = cost[i + 1][j][s], (j, j)
                cost[i][j][s] = here
                pick[i, j, s] = choice
    if cost[0][0][0] == inf:
        return None
    counts: list[int] = []
    host: set[int] = set()
    j, s = 0, 0
    for i in range(nd):
        k, e = pick[i, j, s]
        counts.append(k - j)
        host.update(b for b in range(e, k) if moe[b])
        if k > j:
            s = 1
        j = k
    last = max(i for i, c in enumerate(counts) if c)
    counts[last] += 1                                        # the output layer
    return DevicePlan(DeviceLayout(tuple(counts), frozenset(host)), cost[0][0][0])
