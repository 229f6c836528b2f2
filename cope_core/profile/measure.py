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

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import Execution, Residency
from ..mechanisms.accelerator import Accelerator, cpu_cores
from ..mechanisms.probe import probe_platform
from ..mechanisms.rig import Rig
from ..mechanisms.threads import host_threads
from ..mechanisms.timing import (
    StopRule,
    Timing,
    load_average,
    progress_bar,
    round_robin,
    until_stable,
)
from ..mechanisms.weights import model_dtype
from .bench import Bench, Sampler, profiler_rig
from .busy import BusyMachineError, SharedQuality, WaitMeter, judge, prefer
from .data import COLUMNS, Profile, ProfileKey, beside_keys, required_keys, same_schedule
from .raw_samples import raw_key

DEFAULT_CONTEXTS = (128, 1024, 4096)


@dataclass(frozen=True)
class ProfilerSettings:
    """How to profile. ``cpu_threads`` default: every core of this machine (one operating
    point); ``rule`` stops each row's sampling, ``shared_rule`` the (long) per-token rows;
    rows sample for at least ``min_seconds`` per operating point (unless they reach their
    ``max_samples``) and, after ``budget_seconds``, stop at 3 samples. An operating point whose
    shared rows other work inflated (:mod:`cope_core.profile.busy`) is measured again, up to
    ``attempts`` times in all, keeping the least busy attempt; if that one is still busy,
    ``refuse_busy`` raises :class:`~cope_core.profile.busy.BusyMachineError`, otherwise the
    profile is kept with its quality recorded (``platform["shared_quality"]``)."""

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
    attempts: int = 1
    refuse_busy: bool = False


def operating_point_rows(bench: Bench, contexts: Sequence[int], settings: ProfilerSettings,
                         done: Callable[[int], None] | None = None,
                         meter: WaitMeter | None = None) -> list[tuple[ProfileKey, Timing]]:
    """Every row of one operating point as ``(key, Timing)``, sampled in turns
    (:func:`~cope_core.mechanisms.timing.round_robin`); the caller has set this thread's
    budget to the operating point's CPU threads. ``meter`` adds up the shared rows' wall time,
    run-queue wait and other processes' CPU time."""
    mid = sorted(contexts)[len(contexts) // 2]
    rule = settings.rule
    # differences of two long windows: more samples, settled to 25 us or 5 %
    diff_rule = replace(rule, min_samples=min(15, rule.max_samples), rel_tol=0.05,
                        abs_tol_us=25.0)
    keys, samplers, rules = [], [], []
    for key, sampler in shared_samplers(bench, contexts):
        keys.append(key)
        samplers.append(sampler if meter is None else meter.wrap(sampler))
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
                             field="--threads")
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
        qualities = []
        for threads in threads_list:
            with host_threads(threads):
                point, quality = _quiet_point(bench, contexts, settings, bar, rows_per_point)
            if quality.busy and settings.refuse_busy:
                raise BusyMachineError(quality.reason())
            qualities.append({"cpu_threads": threads, **quality.to_dict()})
            for key, t in point:
                rows.append((*key, threads, 100.0, t.median_us, t.p25_us, t.p75_us,
                             len(t.samples_us)))
                raw[raw_key(key, threads, 100.0)] = list(t.samples_us)
        platform = acc.describe()
    bar.close()
    platform["spec"] = spec.to_dict()
    platform["dtype"] = str(dtype).replace("torch.", "")
    platform["load_average"] = [load_before, load_average()]
    platform["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "default")
    platform["shared_quality"] = qualities
    table = pd.DataFrame(rows, columns=list(COLUMNS)).astype(
        {c: t for c, t in COLUMNS.items() if t != "string"})
    seconds = time.perf_counter() - start
    notes = (f"MEASURED on {platform['accelerator']} accelerator {platform['gpu']!r} with "
             f"{cpu_cores()} host CPUs in {seconds:.0f} s; median of stable samples")
    busy = [q for q in qualities if q["busy"]]
    if busy:
        notes += (f"; BUSY machine at CPU threads {[q['cpu_threads'] for q in busy]}: other "
                  "work inflated the shared rows (platform.shared_quality)")
    prof = Profile(table=table, model=g, platform=platform,
                   created=datetime.now(UTC).isoformat(timespec="seconds"),
                   notes=notes, analytic=False)
    return prof, raw, seconds


def _quiet_point(bench: Bench, contexts: Sequence[int], settings: ProfilerSettings, bar,
                 rows_per_point: int) -> tuple[list[tuple[ProfileKey, Timing]], SharedQuality]:
    """One operating point's rows, measured up to ``settings.attempts`` times while other work
    inflates its shared rows; the least busy attempt and its quality."""
    best: tuple[list[tuple[ProfileKey, Timing]], SharedQuality] | None = None
    for attempt in range(1, max(settings.attempts, 1) + 1):
        if attempt > 1:
            bar.total += rows_per_point
            bar.refresh()
        meter, load = WaitMeter(), load_average()
        point = operating_point_rows(bench, contexts, settings, lambda i: bar.update(1), meter)
        quality = judge(meter.wall_ns, meter.wait_ns, meter.others_ns, os.cpu_count() or 1,
                        {str(k): t.samples_us for k, t in point if k[0] == "shared"},
                        (load, load_average()), attempt)
        if prefer(quality, None if best is None else best[1]):
            best = point, quality
        if not quality.busy:
            break
    assert best is not None
    return best[0], replace(best[1], attempts=attempt)


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
