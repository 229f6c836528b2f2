"""Fixtures of the test suite; the data they wrap is built by the plain functions of
``tests/tiny.py``."""
from __future__ import annotations

import importlib
import threading
import time

import pytest
from tiny import tiny_geometry, tiny_measurements, tiny_profile, tiny_trace

from cope_core.geometry import ModelGeometry
from cope_core.profile.data import Profile
from cope_core.trace.data import Trace


@pytest.fixture
def geometry() -> ModelGeometry:
    return tiny_geometry()


@pytest.fixture
def trace() -> Trace:
    return tiny_trace()


@pytest.fixture
def profile() -> Profile:
    return tiny_profile()


@pytest.fixture
def measurements():
    return tiny_measurements()


@pytest.fixture
def files(tmp_path):
    """A valid tiny trace, profile and measurements file, written in ``tmp_path``."""
    from cope_core import parquet_io
    t, p, m = tmp_path / "trace.parquet", tmp_path / "profile.parquet", tmp_path / "meas.parquet"
    parquet_io.write_trace(tiny_trace(), t)
    parquet_io.write_profile(tiny_profile(), p)
    parquet_io.write_measurements(tiny_measurements(), m)
    return {"trace": t, "profile": p, "measurements": m, "dir": tmp_path}


class SleeplessClock:
    """Stands in for the ``time`` module of library modules: a sleep returns at once but still
    counts as elapsed time, and is recorded with its thread. With ``real`` the clock is the real
    one plus every sleep; without, it moves only by sleeps and :meth:`advance`, so what a module
    does with time is exact and takes none."""

    def __init__(self, real: bool = False):
        self.real, self.offset = real, 0.0
        self.slept: list[tuple[int, float]] = []
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        return (time.perf_counter() if self.real else 0.0) + self.offset

    def perf_counter_ns(self) -> int:
        return round(self.perf_counter() * 1e9)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.offset += seconds

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        with self._lock:
            self.slept.append((threading.get_ident(), seconds))
            self.offset += seconds

    def sleeps(self) -> list[float]:
        return [s for _, s in self.slept]


@pytest.fixture
def sleepless_clock(monkeypatch):
    """``sleepless_clock("cope_core.mechanisms.timing", ..., real=False)``: one
    :class:`SleeplessClock` put in place of ``time`` in each named module for the test."""
    def install(*modules: str, real: bool = False) -> SleeplessClock:
        clock = SleeplessClock(real)
        for name in modules:
            monkeypatch.setattr(importlib.import_module(name), "time", clock)
        return clock
    return install
