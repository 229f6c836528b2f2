"""A trace-driven decode of the model under one candidate
(docs/design.md#measurement-and-evaluation).

Per token: the shared work of every block, and in each MoE layer the candidate's residency
decides hits and misses and its execution strategy runs them; mutable residencies issue their
prefetch while the layer runs. Routing comes from the trace, so the cache states are the
replay's: the residency mechanisms follow the replay semantics (docs/design.md#replay-semantics)
and each prompt starts from the initial fill.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..matrix import Candidate
from ..mechanisms.execution import run_cpu_layer, run_execution, run_gpu_layer
from ..mechanisms.residency import ResidencyState, make_state, prefetch_step
from ..mechanisms.rig import Rig
from ..placement import layer_plan
from ..trace.data import Trace


@dataclass
class LayerRecord:
    """One MoE layer as it ran (for the exactness test): its input, routing and output."""

    prompt: int
    token: int
    layer: int
    routed: tuple[int, ...]
    x: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor


@dataclass
class PromptRun:
    """What one prompt did under one candidate.

    ``token_us`` are wall-clock token times; ``hist[l, h]`` counts tokens with ``h`` hits at
    layer ``l`` and ``ins[l, h]`` those of them at which layer ``l`` inserted a prefetch (the
    replay's histograms, for checking that both agree)."""

    token_us: np.ndarray
    hist: np.ndarray
    ins: np.ndarray
    records: list[LayerRecord] = field(default_factory=list)

    @property
    def tpot_us(self) -> float:
        return float(self.token_us.mean())


class CandidateDecoder:
    """Runs prompts of a trace under one candidate at one cache size.

    Parameters
    ----------
    rig : Rig
        Built with every expert in its store and at least ``K * L`` pool slots.
    candidate : Candidate
    K : int
        Experts per layer.
    order : ndarray (L, E)
        Initial-fill order (``replay.fill_order`` of the calibration trace).
    split : ndarray, optional
        cost_selected's CPU share per hit count (``cost_selected_split`` of the profile).
    """

    def __init__(self, rig: Rig, candidate: Candidate, K: int, order: np.ndarray,
                 split: np.ndarray | None = None):
        g = rig.g
        self.rig, self.candidate, self.K = rig, candidate, int(K)
        if rig.pool.n_slots < self.K * g.n_layers:
            raise ValueError(f"pool has {rig.pool.n_slots} slots, K*L = {self.K * g.n_layers}")
        if candidate.is_layer_partition:
            self.n_gpu = layer_plan(g, self.K).n_gpu   # docs/design.md#layer-placement
            self.n_cpu = g.n_layers - self.n_gpu
            self.state: ResidencyState | None = None
        else:
            assert candidate.residency is not None and candidate.execution is not None
            self.state = make_state(candidate.residency, order, self.K)
            if candidate.execution.value == "cost_selected" and split is None:
                raise ValueError("cost_selected needs the CPU split per hit count")
        self.split = None if split is None else np.asarray(split, dtype=np.int64)

    def _assignment(self) -> dict[int, tuple[int, int]]:
        if self.state is not None:
            return self.state.assignment()
        E = self.rig.g.n_experts
        return {(l - self.n_cpu) * E + e: (l, e)
                for l in range(self.n_cpu, self.rig.g.n_layers) for e in range(E)}

    def run_prompt(self, trace: Trace, prompt_index: int, *, tokens: int | None = None,
                   record: bool = False) -> PromptRun:
        """Decode one prompt (index into ``trace.prompt_ids``) from a fresh cache state.

        ``tokens`` limits the run to the prompt's first tokens (warm-up); ``record`` keeps every
        layer's input and output."""
        rig, g = self.rig, self.rig.g
        L, k = g.n_layers, g.top_k
        if self.state is not None:
            self.state.reset()
        rig.pool.load(rig.store, self._assignment())   # untimed: restore the initial fill
        rig.runner.pending = None
        lo, hi = int(trace.prompt_start[prompt_index]), int(trace.prompt_start[prompt_index + 1])
        if tokens is not None:
            hi = min(hi, lo + tokens)
        hist = np.zeros((L, k + 1), np.int64)
        ins = np.zeros((L, k + 1), np.int64)
        times = np.empty(hi - lo)
        records: list[LayerRecord] = []
        for i, t in enumerate(range(lo, hi)):
            t0 = time.perf_counter_ns()
            self._token(trace, t, t - lo, hist, ins, records if record else None, prompt_index)
            times[i] = (time.perf_counter_ns() - t0) / 1e3
        return PromptRun(times, hist, ins, records)

    def _token(self, trace: Trace, t: int, step: int, hist, ins, records, prompt_index) -> None:
        rig, g, state, runner = self.rig, self.rig.g, self.state, self.rig.runner
        ctx = int(trace.context[t])
        shared = rig.shared
        shared.begin_token(step, ctx)
        mutable = state is not None and state.residency.mutable
        for l in range(g.n_layers):
            routed = trace.routed[t, l]
            shared.moe_block(l, ctx, routed)
            if state is None:
                if l < self.n_cpu:
                    run_cpu_layer(runner, l, [int(e) for e in routed])
                else:
                    run_gpu_layer(runner, [(l - self.n_cpu) * g.n_experts + int(e)
                                           for e in routed])
            else:
                hits, misses = state.lookup(l, routed)
                h = len(hits)
                inserted: list[bool] = []
                if mutable and l < g.n_layers - 1:
                    pred = trace.predicted[t, l]

                    def side(inserted=inserted, l=l, pred=pred) -> None:
                        inserted.append(prefetch_step(runner, shared, state, l, pred))
                    runner.side_work = side
                cpu = None if self.split is None else int(self.split[h])
                assert self.candidate.execution is not None
                run_execution(runner, self.candidate.execution, l, hits, misses, cpu)
                hist[l, h] += 1
                if inserted and inserted[0]:
                    ins[l, h] += 1
            if records is not None:
                records.append(LayerRecord(prompt_index, t, l, tuple(int(e) for e in routed),
                                           rig.io.x.cpu().clone(), rig.io.w.cpu().clone(),
                                           rig.io.out.cpu().clone()))
            shared.end_block()
        shared.end_token()
