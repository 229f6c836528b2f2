"""The profiler's samplers: :class:`Bench` times one execution of a mechanism per call, on a rig
built by :func:`profiler_rig`, with untimed setup before it and inputs rotating through different
experts, so no sample finds its weights in the CPU caches (as none does in a real decode). The
driver that turns samples into profile rows is :mod:`cope_core.profile.measure`.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import Execution, Residency
from ..mechanisms.execution import (
    merge_outputs,
    run_cpu_layer,
    run_execution,
    run_gpu_layer,
    run_parallel,
)
from ..mechanisms.experts import accumulate
from ..mechanisms.residency import make_state, prefetch_step
from ..mechanisms.rig import Rig
from ..mechanisms.timing import (
    timed,
)

Sampler = Callable[[], float]


class Bench:
    """Samplers of the mechanisms on a rig: each call of a sampler times one execution, in
    microseconds, with untimed setup before it; inputs rotate through different experts."""

    def __init__(self, rig: Rig):
        self.rig = rig
        self.g = rig.g
        self._turn = itertools.count()

    # --- rotating inputs ---------------------------------------------------------------------
    def _hits(self, h: int) -> list[tuple[int, int]]:
        n = max(self.rig.pool.n_slots, 1)
        start = next(self._turn) * self.g.top_k
        return [(j, (start + j) % n) for j in range(h)]

    def _misses(self, positions: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
        st = self.rig.store
        turn = next(self._turn)
        layer, start = turn % st.layers, turn * self.g.top_k
        return layer, [(p, (start + j) % st.experts) for j, p in enumerate(positions)]

    # --- rows ----------------------------------------------------------------------------------
    def schedule(self, execution: Execution, h: int, c: int, u: int) -> Sampler:
        """One MoE layer of ``execution`` with ``h`` hits, ``c`` CPU and ``u`` staged misses."""
        runner = self.rig.runner

        def sample() -> float:
            hits = self._hits(h)
            layer, misses = self._misses(range(h, h + c + u))
            return timed(lambda: run_execution(runner, execution, layer, hits, misses, c))
        return sample

    def cpu_layer(self) -> Sampler:
        k, runner = self.g.top_k, self.rig.runner

        def sample() -> float:
            layer, misses = self._misses(range(k))
            return timed(lambda: run_cpu_layer(runner, layer, [e for _, e in misses]))
        return sample

    def gpu_layer(self) -> Sampler:
        runner = self.rig.runner

        def sample() -> float:
            slots = [s for _, s in self._hits(self.g.top_k)]
            return timed(lambda: run_gpu_layer(runner, slots))
        return sample

    def shared(self, context: int) -> Sampler:
        """One whole token's shared work (every block and the LM head) at ``context``: what the
        parts below compose into, kept to check that they do."""
        rig, sh, L = self.rig, self.rig.shared, self.g.n_layers
        routed = list(range(self.g.top_k))

        def token() -> None:
            sh.begin_token(next(self._turn), context)
            for layer in range(L):
                sh.moe_block(layer, context, routed)
                sh.end_block()
            sh.end_token()

        def sample() -> float:
            rig.acc.compute.submit(rig.io.out.zero_)   # no routed output joins the residual
            rig.acc.compute.synchronize()
            return timed(token)
        return sample

    def moe_block(self, context: int, *, tail: bool = False) -> Sampler:
        """One MoE block's shared work at ``context``: the mean over the rig's MoE blocks, each
        run as in a token (attention, router, routing weights read by the host, shared experts,
        the routed output added back). Each block waits once, for its routing, as in a token;
        the wait for the last block's queued addition is not timed: it is one more wait per
        sample, which divided by the rig's block count would price a cut's blocks dearer than
        the full model's (a median 0.11 ms at load average 10 on 2 cores: +1.3 % on a 2-block
        rig's 4.2 ms blocks, +0.4 % on a 6-block rig's; docs/design.md#a-busy-machine). ``tail``
        times it all the same, as before (benchmarks/bench_busy_profile.py compares the two)."""
        rig, sh, L = self.rig, self.rig.shared, self.g.n_layers
        routed = list(range(self.g.top_k))

        def blocks() -> None:
            for layer in range(L):
                sh.moe_block(layer, context, routed)
                sh.end_block()
            if tail:
                sh.wait()

        def sample() -> float:
            rig.acc.compute.submit(rig.io.out.zero_)
            rig.acc.compute.synchronize()
            us = timed(blocks) / L
            sh.wait()
            return us
        return sample

    def dense_block(self, context: int) -> Sampler:
        """One leading dense block at ``context``: the mean over the rig's dense blocks."""
        sh, D = self.rig.shared, self.g.dense_layers

        def blocks() -> None:
            for b in range(D):
                sh.dense_block(b, context)
            sh.wait()
        return lambda: timed(blocks) / D

    def head(self) -> Sampler:
        """The head of a token: the embedding read, final norm and LM head."""
        sh = self.rig.shared

        def run() -> None:
            sh.embed_token(next(self._turn))
            sh.end_token()
        return lambda: timed(run)

    def prefetch(self, residency: Residency, q: int, context: int,
                 cpu_misses: int = 0) -> Sampler:
        """Extra cost of the residency's per-layer step with ``q`` inserted experts, measured
        alongside expert execution: a ``parallel`` layer (fully resident, or with
        ``cpu_misses`` of its routed experts computed on the CPU: the rows with ``cpu = c``),
        the next block's shared work, and the next layer's wait for the copy, with the step
        minus without it (paired samples). The step runs on a real cache state (2 layers,
        ``2 * top_k`` slots each), so the victim and the copy are the ones the residency would
        choose."""
        rig, runner, k = self.rig, self.rig.runner, self.g.top_k
        if not 0 <= cpu_misses <= k:
            raise CopeInputError(f"expected 0..{k} CPU misses beside a prefetch, got "
                                 f"{cpu_misses}", field="cpu_misses")
        P = rig.store.experts
        state = make_state(residency, np.tile(np.arange(P), (2, 1)), P - k)
        nxt = min(1, self.g.n_layers - 1)
        routed = list(range(k))

        def window(step: bool) -> float:
            resident0 = np.flatnonzero(state.slot_of[0] >= 0)
            absent0 = np.flatnonzero(state.slot_of[0] < 0)
            turn = next(self._turn)
            ids = np.concatenate([resident0[(turn + np.arange(k - cpu_misses)) % len(resident0)],
                                  absent0[(turn + np.arange(cpu_misses)) % max(len(absent0), 1)]])
            hits, misses = state.lookup(0, ids)
            if step:
                layer1 = state.slot_of[1]
                pool = np.flatnonzero(layer1 < 0) if q else np.flatnonzero(layer1 >= 0)
                pred = [int(pool[next(self._turn) % len(pool)])]
                runner.side_work = lambda: prefetch_step(runner, rig.shared, state, 0, pred)

            def run() -> None:
                run_parallel(runner, 0, hits, misses)
                rig.shared.moe_block(nxt, context, routed)
                runner.resident([])     # the next layer's compute waits for the prefetch
                runner.finish()
            return timed(run)

        return lambda: window(True) - window(False)

    def atomic(self, name: str, n: int) -> Sampler:
        """Isolated operations (the atomic-op baseline's inputs)."""
        rig, runner, acc, io = self.rig, self.rig.runner, self.rig.acc, self.rig.io
        H, I = self.g.hidden, self.g.expert_intermediate

        def done() -> None:
            acc.compute.record().synchronize()

        def sync() -> None:
            acc.compute.submit(_noop)
            done()

        if name == "gpu_expert":
            def gpu() -> float:
                hits = self._hits(n)

                def run() -> None:
                    runner.begin()
                    runner.resident(hits)
                    runner.finish()
                return timed(run)
            return gpu
        if name == "cpu_expert":
            def cpu() -> float:
                layer, misses = self._misses(range(n))
                experts = [rig.store.expert(layer, e) for _, e in misses]
                y = torch.zeros((1, H), dtype=torch.float32)
                return timed(lambda: acc.host_compute(accumulate, y, io.x_host, io.w_host,
                                                      list(range(n)), experts, H, I))
            return cpu
        if name == "stage":
            def stage() -> float:
                layer, misses = self._misses(range(n))
                return timed(lambda: (runner.stage(layer, misses),
                                      acc.copy.record().synchronize()))
            return stage
        if name == "staged_gpu_expert":
            def staged() -> float:
                layer, misses = self._misses(range(n))
                events = runner.stage(layer, misses)
                acc.synchronize()

                def run() -> None:
                    runner.begin()
                    runner.staged(misses, events, each=False)
                    runner.finish()
                return timed(run)
            return staged
        if name == "act_copy":
            def act() -> None:
                runner.to_host().synchronize()
                acc.compute.submit(io.y_dev.copy_, io.y_host, True)
                done()
            return lambda: timed(act)
        if name == "sync":
            return lambda: timed(sync)
        if name == "merge":
            def merge() -> None:
                acc.compute.submit(merge_outputs, io.out, io.y_dev, io.y_host)
                done()
            return lambda: timed(merge) - timed(sync)
        if name == "prefetch":
            def pf() -> float:
                layer, misses = self._misses([0])
                slot = self._hits(1)[0][1]

                def run() -> None:
                    rig.shared.predict_next(0)
                    rig.pool.stage(slot, rig.store, layer, misses[0][1])
                    acc.copy.record().synchronize()
                    done()
                return timed(run)
            return pf
        raise ValueError(f"unknown atomic op {name!r}")


def _noop() -> None:
    pass


def profiler_rig(acc, g: ModelGeometry, dtype: torch.dtype, max_context: int, seed: int) -> Rig:
    """A rig with 3*top_k host experts in each of 2 layers and 4*top_k slots: enough distinct
    memory to rotate through, without the whole model."""
    if g.n_experts < 2:
        raise CopeInputError("profiling needs at least 2 experts per layer",
                             field="model.n_experts")
    k = g.top_k
    return Rig.build(acc, g, dtype, pool_slots=4 * k, max_context=max_context, store_layers=2,
                     store_experts=3 * k, seed=seed)
