"""Timing until stable: warm-up, synchronised samples, stop when the median settles or a cap is
reached; raw samples are kept, median and interquartile range reported."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm


@dataclass(frozen=True)
class Timing:
    """Raw samples of one measured quantity, in microseconds."""

    samples_us: tuple[float, ...]

    @property
    def median_us(self) -> float:
        return float(np.median(self.samples_us))

    @property
    def p25_us(self) -> float:
        return float(np.percentile(self.samples_us, 25))

    @property
    def p75_us(self) -> float:
        return float(np.percentile(self.samples_us, 75))

    def clamped(self) -> Timing:
        """The same samples with negatives (noise in a difference of two timings) set to 0."""
        return Timing(tuple(max(0.0, s) for s in self.samples_us))


@dataclass(frozen=True)
class StopRule:
    """When to stop sampling one quantity.

    After ``min_samples``, every ``batch`` further samples the median of all samples is compared
    with the median before that batch; sampling stops once they differ by at most ``rel_tol``
    of the median (or ``abs_tol_us``), or at ``max_samples`` or ``max_seconds``.
    """

    warmup: int = 2
    min_samples: int = 7
    max_samples: int = 40
    batch: int = 4
    rel_tol: float = 0.02
    abs_tol_us: float = 2.0
    max_seconds: float = 4.0


def timed(fn: Callable[[], object]) -> float:
    """Microseconds that ``fn`` takes (``fn`` must end synchronised)."""
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def _settled(out: Sequence[float], rule: StopRule) -> bool:
    """Whether ``out`` (one quantity's samples so far) may stop under ``rule`` (time aside)."""
    n = len(out)
    if n >= rule.max_samples:
        return True
    first = max(rule.min_samples, rule.batch + 1)   # a median before the last batch exists
    if n < first or (n - first) % rule.batch:
        return False
    now, before = np.median(out), np.median(out[:-rule.batch])
    return bool(abs(now - before) <= max(rule.rel_tol * abs(now), rule.abs_tol_us))


def until_stable(sample: Callable[[], float], rule: StopRule = StopRule()) -> Timing:
    """Call ``sample`` (which returns one timing in microseconds) until ``rule`` says stop."""
    for _ in range(rule.warmup):
        sample()
    out: list[float] = []
    start = time.perf_counter()
    while True:
        out.append(float(sample()))
        if _settled(out, rule) or time.perf_counter() - start > rule.max_seconds:
            break
    return Timing(tuple(out))


def round_robin(samplers: Sequence[Callable[[], float]], rules: Sequence[StopRule], *,
                budget_seconds: float, min_seconds: float = 0.0,
                done: Callable[[int], None] | None = None) -> list[Timing]:
    """Sample several quantities in turns, one sample of each per round.

    On a machine whose speed drifts (other jobs, other tenants of the host), timing one quantity
    after another gives each a different slice of the drift and makes them disagree; in turns,
    every quantity's samples span the same stretch of time. Each quantity stops by its own
    ``rule`` (a settled median counts only after ``min_seconds``, so slow drift averages out;
    ``max_samples`` always ends it); after ``budget_seconds`` every quantity stops once it has
    ``min(3, min_samples)`` samples. ``done(i)`` is called when quantity ``i`` stops.
    """
    for sample, rule in zip(samplers, rules):
        for _ in range(rule.warmup):
            sample()
    out: list[list[float]] = [[] for _ in samplers]
    finished = [False] * len(samplers)
    start = time.perf_counter()
    while not all(finished):
        elapsed = time.perf_counter() - start
        over, long_enough = elapsed > budget_seconds, elapsed >= min_seconds
        for i, (sample, rule) in enumerate(zip(samplers, rules)):
            if finished[i]:
                continue
            out[i].append(float(sample()))
            n = len(out[i])
            if (n >= rule.max_samples or (long_enough and _settled(out[i], rule))
                    or (over and n >= min(3, rule.min_samples))):
                finished[i] = True
                if done is not None:
                    done(i)
    return [Timing(tuple(o)) for o in out]


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none), kept with measured files because
    other jobs on the machine inflate timings."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def progress_bar(total: int, progress: bool, desc: str, unit: str):
    """A tqdm bar on stderr, or a silent one when ``progress`` is off."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not progress)
