"""The target profiler: every ``cope.profile/2`` row (docs/design.md#profiles-and-operating-points)
measured on this machine with the same mechanism code the reference executor runs.

Each row is a stable timing: warm-up, synchronised samples until the median settles, median and
interquartile range kept. The rows of an operating point are sampled in turns
(:func:`cope_core.mechanisms.timing.round_robin`), so a machine whose speed drifts while it is
profiled affects every row alike. Only states
the replay can reach are timed: the schedule rows ``required_keys`` lists (no other splits), hits
on resident slots, misses from host memory, and prefetches chosen by the real residency
mechanisms. Consecutive samples rotate through different experts so no sample finds its weights
in the CPU caches, as none does in a real decode.
"""
from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import torch

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import Execution, Residency
from ..mechanisms.accelerator import Accelerator, cpu_cores
from ..mechanisms.execution import (
    merge_outputs,
    run_cpu_layer,
    run_execution,
    run_gpu_layer,
    run_parallel,
)
from ..mechanisms.experts import accumulate
from ..mechanisms.probe import probe_platform
from ..mechanisms.residency import make_state, prefetch_step
from ..mechanisms.rig import Rig
from ..mechanisms.threads import host_threads
from ..mechanisms.timing import (
    StopRule,
    Timing,
    load_average,
    progress_bar,
    round_robin,
    timed,
    until_stable,
)
from ..mechanisms.weights import model_dtype
from .data import COLUMNS, Profile, ProfileKey, beside_keys, required_keys, same_schedule
from .raw_samples import raw_key

DEFAULT_CONTEXTS = (128, 1024, 4096)


@dataclass(frozen=True)
class ProfilerSettings:
    """How to profile. ``cpu_threads`` default: every core of this machine (one operating
    point); ``rule`` stops each row's sampling, ``shared_rule`` the (long) per-token rows;
    rows sample for at least ``min_seconds`` per operating point (unless they reach their
    ``max_samples``) and, after ``budget_seconds``, stop at 3 samples."""

    device: str = "cpu"
    accel_threads: int = 1
    link_gbps: float | None = None      # the emulated platform's paced link (Accelerator)
    cpu_slowdown: float = 1.0           # and its host speed
    cpu_threads: tuple[int, ...] | None = None
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    dtype: str | None = None
    seed: int = 0
    rule: StopRule = StopRule()
    shared_rule: StopRule = field(default_factory=lambda: StopRule(
        warmup=1, min_samples=5, max_samples=40, batch=2, rel_tol=0.02))
    budget_seconds: float = 120.0
    min_seconds: float = 0.0


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

    def moe_block(self, context: int) -> Sampler:
        """One MoE block's shared work at ``context``: the mean over the rig's MoE blocks, each
        run as in a token (attention, router, routing weights read by the host, shared experts,
        the routed output added back)."""
        rig, sh, L = self.rig, self.rig.shared, self.g.n_layers
        routed = list(range(self.g.top_k))

        def blocks() -> None:
            for layer in range(L):
                sh.moe_block(layer, context, routed)
                sh.end_block()
            sh.wait()

        def sample() -> float:
            rig.acc.compute.submit(rig.io.out.zero_)
            rig.acc.compute.synchronize()
            return timed(blocks) / L
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
                return timed(lambda: (runner.begin(), runner.resident(hits), runner.finish()))
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
                return timed(lambda: (runner.begin(), runner.staged(misses, events, each=False),
                                      runner.finish()))
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
            return lambda: timed(lambda: (acc.compute.submit(merge_outputs, io.out, io.y_dev,
                                                             io.y_host), done())) - timed(sync)
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


def operating_point_rows(bench: Bench, contexts: Sequence[int], settings: ProfilerSettings,
                         done: Callable[[int], None] | None = None
                         ) -> list[tuple[ProfileKey, Timing]]:
    """Every row of one operating point as ``(key, Timing)``, sampled in turns
    (:func:`~cope_core.mechanisms.timing.round_robin`); the caller has set this thread's
    budget to the operating point's CPU threads."""
    mid = sorted(contexts)[len(contexts) // 2]
    rule = settings.rule
    # differences of two long windows: more samples, settled to 25 us or 5 %
    diff_rule = replace(rule, min_samples=min(15, rule.max_samples), rel_tol=0.05,
                        abs_tol_us=25.0)
    keys, samplers, rules = [], [], []
    for key, sampler in shared_samplers(bench, contexts):
        keys.append(key)
        samplers.append(sampler)
        rules.append(settings.shared_rule)
    n_shared = len(keys)
    rows = required_keys(bench.g.top_k) + beside_keys(bench.g.top_k)
    for row in dict.fromkeys(same_schedule(r, bench.g.top_k) for r in rows):
        kind, name, h, c, u, n, _ = row
        keys.append(row)
        if kind == "schedule":
            samplers.append(bench.schedule(Execution(name), h, c, u))
        elif kind == "prefetch":
            samplers.append(bench.prefetch(Residency(name), n, mid, cpu_misses=max(c, 0)))
        elif kind == "layer":
            samplers.append(bench.cpu_layer() if name == "cpu_layer" else bench.gpu_layer())
        else:
            samplers.append(bench.atomic(name, n))
        rules.append(diff_rule if kind == "prefetch" or name == "merge" else rule)
    timings = round_robin(samplers, rules, budget_seconds=settings.budget_seconds,
                          min_seconds=settings.min_seconds, done=done)
    # prefetch and merge are differences of two timings: noise may make a sample negative
    by_key = {k: (t.clamped() if k[0] == "prefetch" or k[1] == "merge" else t)
              for k, t in zip(keys, timings)}
    return [(k, by_key[k]) for k in keys[:n_shared]] + \
        [(r, by_key[same_schedule(r, bench.g.top_k)]) for r in rows]


def shared_samplers(bench: Bench, contexts: Sequence[int]) -> list[tuple[ProfileKey, Sampler]]:
    """The ``shared`` rows of ``cope.profile/2``: one MoE block (and one dense block, when the
    model has dense blocks) at each context, and the head; they compose into a token of any
    layer count (docs/design.md#shared-work-per-part)."""
    out = []
    for ctx in contexts:
        out.append((ProfileKey("shared", "moe_block", context=int(ctx)),
                    bench.moe_block(int(ctx))))
        if bench.g.dense_layers:
            out.append((ProfileKey("shared", "dense_block", context=int(ctx)),
                        bench.dense_block(int(ctx))))
    out.append((ProfileKey("shared", "head"), bench.head()))
    return out


def measure_profile(g: ModelGeometry, settings: ProfilerSettings = ProfilerSettings(),
                    progress: bool = True) -> tuple[Profile, dict[str, list[float]], float]:
    """Profile this machine for geometry ``g``.

    Returns
    -------
    (Profile, raw samples by row key, seconds taken)
        The profile's platform metadata names the accelerator (``emulated`` or the CUDA
        device), torch version and host, and carries the measured roofline ``spec``.
    """
    start = time.perf_counter()
    contexts = sorted({int(c) for c in settings.contexts})
    if not contexts or contexts[0] < 0:
        raise CopeInputError(f"expected context lengths >= 0, got {settings.contexts}",
                             field="--contexts")
    threads_list = list(dict.fromkeys(settings.cpu_threads or (cpu_cores(),)))
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in threads_list):
        raise CopeInputError(f"expected whole numbers >= 1, got {threads_list}",
                             field="--cpu-threads")
    dtype = model_dtype(g, settings.dtype)
    n_shared = len(contexts) * (2 if g.dense_layers else 1) + 1
    rows_per_point = n_shared + len({same_schedule(k, g.top_k)
                                     for k in required_keys(g.top_k) + beside_keys(g.top_k)})
    n_rows = len(threads_list) * rows_per_point
    bar = progress_bar(n_rows, progress, "cope profile", "row")
    rows, raw = [], {}
    load_before = load_average()
    with Accelerator(settings.device, settings.accel_threads, link_gbps=settings.link_gbps,
                     cpu_slowdown=settings.cpu_slowdown) as acc:
        rig = profiler_rig(acc, g, dtype, max(contexts), settings.seed)
        spec = probe_platform(acc, dtype, g.hidden)   # FLOP/s at this model's width
        bench = Bench(rig)
        for threads in threads_list:
            with host_threads(threads):
                for key, t in operating_point_rows(bench, contexts, settings,
                                                   lambda i: bar.update(1)):
                    rows.append((*key, threads, 100.0, t.median_us, t.p25_us, t.p75_us,
                                 len(t.samples_us)))
                    raw[raw_key(key, threads, 100.0)] = list(t.samples_us)
        platform = acc.describe()
    bar.close()
    platform["spec"] = spec.to_dict()
    platform["dtype"] = str(dtype).replace("torch.", "")
    platform["load_average"] = [load_before, load_average()]
    platform["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "default")
    table = pd.DataFrame(rows, columns=list(COLUMNS)).astype(
        {c: t for c, t in COLUMNS.items() if t != "string"})
    seconds = time.perf_counter() - start
    notes = (f"MEASURED on {platform['accelerator']} accelerator {platform['gpu']!r} with "
             f"{cpu_cores()} host CPUs in {seconds:.0f} s; median of stable samples")
    prof = Profile(table=table, model=g, platform=platform,
                   created=datetime.now(UTC).isoformat(timespec="seconds"),
                   notes=notes, analytic=False)
    return prof, raw, seconds


def measure_cost_selected_split(rig: Rig, threads: int) -> np.ndarray:
    """cost_selected's CPU share per hit count, measured on ``rig`` with the profiler's
    schedule timing (ties to the larger share, as ``estimate.costs.cost_selected_split``)."""
    bench = Bench(rig)
    rule = StopRule(warmup=1, min_samples=5, max_samples=15)
    k = rig.g.top_k
    split = np.zeros(k + 1, np.int64)
    for h in range(k + 1):
        m = k - h
        cost = [until_stable(bench.schedule(Execution.COST_SELECTED, h, c, m - c), rule).median_us
                for c in range(m + 1)]
        split[h] = int(np.flatnonzero(np.asarray(cost) == min(cost)).max())
    return split


__all__ = ["Bench", "DEFAULT_CONTEXTS", "ProfilerSettings", "measure_cost_selected_split",
           "measure_profile"]
