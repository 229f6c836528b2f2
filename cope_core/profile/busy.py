"""Whether other work on the machine inflated the profile's shared rows
(docs/design.md#a-busy-machine), and the refusal when it did.

While the shared rows are sampled, :class:`WaitMeter` adds up, around every sample, the wall time,
the **run-queue wait** of this process's threads (the second field of Linux's
``/proc/self/task/*/schedstat``: nanoseconds a thread was ready to run but had no CPU) and the
CPU time **other processes** used (the machine's busy time in ``/proc/stat`` less this
process's CPU time). A shared row times one thread at a time (the host waits while the
accelerator works), so on a quiet machine its threads hardly wait; on a busy one the wait is the
inflation itself. :func:`judge` calls the profile busy when both hold:

* its threads waited for a CPU more than ``WAIT_LIMIT`` of the shared rows' time (the inflation:
  5 %, half the 10 % within which a cut's shared work must agree with the full model's, since
  either profile may be inflated), and
* other processes used more than ``OTHERS_LIMIT`` of the machine's CPU time meanwhile (the
  cause: without it the wait is this process's own wake-ups, which a quiet machine has too).

Where the scheduler statistics are missing (not Linux), the shared rows' spread decides instead:
their median noise floor (:func:`cope_core.measurements.noise_floor_pct`, the executor's rule)
above ``NOISE_LIMIT_PCT``. The spread is recorded either way.
"""
from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import CopeInputError
from ..measurements import noise_floor_pct

#: Largest share of the shared rows' time the profiler's threads may wait for a CPU.
WAIT_LIMIT = 0.05
#: Largest share of the machine's CPU time other processes may use while shared rows are timed.
OTHERS_LIMIT = 0.05
#: Without scheduler statistics: the largest median noise floor of the shared rows, percent.
NOISE_LIMIT_PCT = 10.0


class BusyMachineError(CopeInputError):
    """A profile refused because other work on the machine inflated its timings."""


def run_queue_wait_ns() -> int | None:
    """Nanoseconds this process's threads have waited for a CPU so far (None: not Linux)."""
    total, found = 0, False
    for path in glob.glob("/proc/self/task/*/schedstat"):
        try:
            with open(path) as fh:
                total += int(fh.read().split()[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue            # a thread that ended between the listing and the read
    return total if found else None


def machine_busy_ns() -> int | None:
    """CPU time every process of the machine has used so far, in ns (None: no ``/proc/stat``)."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)       # idle and iowait
    return (sum(fields[:8]) - idle) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


class WaitMeter:
    """Wall time, run-queue wait and other processes' CPU time around wrapped samplers."""

    def __init__(self) -> None:
        self.wall_ns = 0
        self.wait_ns: int | None = 0
        self.others_ns: int | None = 0

    def wrap(self, sampler: Callable[[], float]) -> Callable[[], float]:
        """``sampler``, with each call's totals added to this meter."""
        def sample() -> float:
            w0, b0, c0 = run_queue_wait_ns(), machine_busy_ns(), time.process_time_ns()
            t0 = time.perf_counter_ns()
            out = sampler()
            self.wall_ns += time.perf_counter_ns() - t0
            own = time.process_time_ns() - c0
            self.wait_ns = _add(self.wait_ns, w0, run_queue_wait_ns())
            others = _add(self.others_ns, b0, machine_busy_ns())
            self.others_ns = None if others is None else others - own
            return out
        return sample


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %"


def _add(total: int | None, before: int | None, after: int | None) -> int | None:
    """``total + after - before``; None once any is missing."""
    if total is None or before is None or after is None:
        return None
    return total + after - before


@dataclass(frozen=True)
class SharedQuality:
    """How the shared rows of one operating point were measured (see the module doc).

    ``wait_share``: run-queue wait over wall time of their samples (summed over the process's
    threads, so above 1 when several waited at once); ``others_share``: other
    processes' CPU time over the machine's (``cpus`` x wall); both None without the scheduler
    statistics. ``noise_pct``: the median over the rows of their noise floor; ``load``: the
    1-minute load average before and after; ``attempts``: how often the point was measured.
    """

    wait_share: float | None
    others_share: float | None
    noise_pct: float
    load: tuple[float | None, float | None]
    cpus: int
    attempts: int = 1

    @property
    def busy(self) -> bool:
        """Whether other work inflated the shared rows (the module's rule)."""
        if self.wait_share is None or self.others_share is None:
            return bool(self.noise_pct > NOISE_LIMIT_PCT)
        return self.wait_share > WAIT_LIMIT and self.others_share > OTHERS_LIMIT

    def measured(self) -> str:
        """The numbers behind the decision, as words."""
        if self.wait_share is None or self.others_share is None:
            what = (f"its shared rows' repeats scattered by {self.noise_pct:.1f} % (noise "
                    f"floor, limit {NOISE_LIMIT_PCT:g} %; no scheduler statistics here)")
        else:
            what = (f"its threads waited for a CPU {_pct(self.wait_share)} of the time they "
                    f"timed shared work (summed over threads; limit {_pct(WAIT_LIMIT)}) while "
                    f"other processes used "
                    f"{_pct(self.others_share)} of the {self.cpus} CPUs (limit "
                    f"{_pct(OTHERS_LIMIT)}); spread {self.noise_pct:.1f} %")
        a, b = self.load
        if a is not None and b is not None:
            what += f"; load average {a:g} -> {b:g}"
        return what

    def reason(self) -> str:
        """One line for the refusal."""
        return (f"the machine was busy while profiling ({self.measured()}, after "
                f"{self.attempts} attempt{'s' if self.attempts > 1 else ''}): close other work "
                "and profile again, or keep it with --busy-ok (its quality is recorded)")

    def to_dict(self) -> dict:
        return {**asdict(self), "load": list(self.load), "busy": self.busy}

    @classmethod
    def from_dict(cls, d: Mapping) -> SharedQuality:
        """Read back :meth:`to_dict` (other keys, such as the operating point's, are ignored)."""
        a, b = d["load"]
        return cls(d["wait_share"], d["others_share"], float(d["noise_pct"]), (a, b),
                   int(d["cpus"]), int(d["attempts"]))


def judge(wall_ns: int, wait_ns: int | None, others_ns: int | None, cpus: int,
          rows: Mapping[str, Sequence[float]], load: tuple[float | None, float | None],
          attempts: int = 1) -> SharedQuality:
    """The quality of one operating point's shared rows.

    Parameters
    ----------
    wall_ns, wait_ns, others_ns : int
        Totals over their samples (:class:`WaitMeter`); ``wait_ns``/``others_ns`` None where
        the scheduler statistics are missing.
    cpus : int
        CPUs of the machine.
    rows : mapping
        Each shared row's samples in microseconds.
    load : (float or None, float or None)
        Load average before and after.
    """
    floors = [noise_floor_pct(s) for s in rows.values()]
    floors = [f for f in floors if np.isfinite(f)]
    noise = float(np.median(floors)) if floors else 0.0
    wall = max(int(wall_ns), 1)
    wait = None if wait_ns is None else max(wait_ns, 0) / wall
    others = None if others_ns is None else max(others_ns, 0) / (wall * max(cpus, 1))
    return SharedQuality(wait, others, noise, load, int(cpus), int(attempts))


def prefer(new: SharedQuality, old: SharedQuality | None) -> bool:
    """Whether to keep a new attempt's rows over the old attempt's (None: none yet): a quiet
    attempt over a busy one, else the smaller run-queue wait, else the smaller spread."""
    if old is None:
        return True
    if new.busy != old.busy:
        return old.busy

    def key(q: SharedQuality) -> tuple[float, float]:
        return (q.wait_share if q.wait_share is not None else 0.0, q.noise_pct)
    return key(new) < key(old)


def busy_note(platform: Mapping) -> str | None:
    """One line naming the operating points of a measured profile that other work inflated
    (kept with ``--busy-ok``), or None: ``cope predict`` and ``cope evaluate`` print it."""
    rows = platform.get("shared_quality")
    busy = [q for q in rows if isinstance(q, Mapping) and q.get("busy")] \
        if isinstance(rows, list) else []
    if not busy:
        return None
    try:
        what = f" ({SharedQuality.from_dict(busy[0]).measured()})"
    except (KeyError, TypeError, ValueError):
        what = ""
    return (f"profiled on a busy machine at CPU threads {[q.get('cpu_threads') for q in busy]}"
            f"{what}: its timings are inflated; profile again on a quiet machine")
