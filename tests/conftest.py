"""Fixtures of the test suite; the data they wrap is built by the plain functions of
``tests/tiny.py``."""
from __future__ import annotations

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
