"""The emulated platform's knobs: a paced copy engine (``--link-gbps``) and a slower host
(``--cpu-slowdown``) — what they do, checked on a clock whose sleeps return at once (so the
checks are exact and take no time), that the probe honours them, their metadata, and that
measurements and a profile of different settings are refused. How close the real wall-clock
times come to the settings on this machine is a benchmark (benchmarks/bench_emulation_knobs.py),
not a test."""
from __future__ import annotations

import dataclasses
import math
import threading

import pytest
import torch
from tiny import tiny_measurements, tiny_profile, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.evaluate import evaluate
from cope_core.mechanisms import Accelerator

CHUNK = 1 << 20          # the copy worker paces a copy 1 MiB at a time
ACCELERATOR = "cope_core.mechanisms.accelerator"


@pytest.fixture
def clock(sleepless_clock):
    """The accelerator's clock, moved only by its sleeps and by the test (tests/conftest.py)."""
    return sleepless_clock(ACCELERATOR)


def _copy(acc, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randn(nbytes // 4)
    dst = acc.alloc((nbytes // 4,), torch.float32)
    acc.synchronize()
    acc.copy.submit(acc.link_copy, dst, src)
    acc.copy.synchronize()
    return dst, src


def test_a_paced_copy_sleeps_bytes_over_x_chunk_by_chunk(clock):
    """Each 1 MiB chunk is copied, then the copy worker sleeps until that chunk's time at X GB/s
    is up: the copy takes bytes / X in all, asleep (the core free), and copies every byte."""
    n = 8 * CHUNK + CHUNK // 2                          # eight whole chunks and a half one
    with Accelerator("cpu", link_gbps=0.5) as acc:
        dst, src = _copy(acc, n)
    assert torch.equal(dst, src)
    assert clock.sleeps() == pytest.approx([CHUNK / 0.5e9] * 8 + [CHUNK / 2 / 0.5e9], rel=1e-9)
    assert math.fsum(clock.sleeps()) == pytest.approx(n / 0.5e9, rel=1e-12)    # 17.8 ms
    worker = {t for t, _ in clock.slept}
    assert len(worker) == 1 and threading.get_ident() not in worker      # on the copy worker


def test_an_unpaced_copy_never_waits(clock):
    with Accelerator("cpu") as acc:
        dst, src = _copy(acc, 4 * CHUNK)
    assert torch.equal(dst, src) and clock.slept == []


@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_a_slowed_host_sleeps_f_minus_1_times_the_work(clock, factor):
    """CPU-side work that took 0.25 s is stretched to F times that by a sleep of (F - 1) x 0.25 s
    on the calling thread (the core free meanwhile); its result comes back unchanged."""
    def work(x):
        clock.advance(0.25)
        return 2 * x
    with Accelerator("cpu", cpu_slowdown=factor) as acc:
        assert acc.host_compute(work, 21) == 42
    assert clock.sleeps() == ([] if factor == 1.0 else [pytest.approx(0.5, rel=1e-12)])
    assert clock.perf_counter() == pytest.approx(0.25 * factor, rel=1e-12)


@pytest.mark.parametrize("kw, field", [({"link_gbps": 0.0}, "--link-gbps"),
                                       ({"link_gbps": float("nan")}, "--link-gbps"),
                                       ({"cpu_slowdown": 0.5}, "--cpu-slowdown")])
def test_bad_settings(kw, field):
    with pytest.raises(CopeInputError) as e:
        Accelerator("cpu", **kw)
    assert e.value.field == field


@pytest.mark.parametrize("kw, field", [({"link_gbps": 4.0}, "--link-gbps"),
                                       ({"cpu_slowdown": 2.0}, "--cpu-slowdown")])
def test_the_knobs_are_for_the_emulated_accelerator_only(kw, field):
    with pytest.raises(CopeInputError) as e:
        Accelerator("cuda", **kw)
    assert e.value.field == field and "emulated" in str(e.value)


def test_the_settings_are_in_the_platform_metadata():
    with Accelerator("cpu", link_gbps=4.0, cpu_slowdown=2.0) as acc:
        d = acc.describe()
    assert d["link_gbps"] == 4.0 and d["cpu_slowdown"] == 2.0
    assert "paced copy worker, 4 GB/s" in d["link"]
    with Accelerator("cpu") as acc:
        d = acc.describe()
    assert d["link_gbps"] is None and d["cpu_slowdown"] == 1.0


def test_measurements_of_another_setting_are_refused(tmp_path, capsys):
    tr, m = tiny_trace(), tiny_measurements()
    prof = tiny_profile()
    paced = dataclasses.replace(prof, platform=dict(prof.platform or {}) | {"link_gbps": 4.0})
    with pytest.raises(CopeInputError) as e:
        evaluate(tr, paced, m)
    assert e.value.field == "platform.link_gbps" and "link_gbps=None" in str(e.value)
    # the same setting on both sides is fine, and so are files without the keys
    same = dataclasses.replace(m, platform=dict(m.platform) | {"link_gbps": 4.0})
    assert evaluate(tr, paced, same, estimators=["cope"], draws=0)["cope"].accuracy.pairs > 0
    slow = dataclasses.replace(m, platform=dict(m.platform) | {"cpu_slowdown": 3.0})
    with pytest.raises(CopeInputError, match="cpu_slowdown=3.0"):
        evaluate(tr, prof, slow)
    files = {}
    for name, obj, write in (("t", tr, parquet_io.write_trace), ("p", paced,
                             parquet_io.write_profile), ("m", m, parquet_io.write_measurements)):
        files[name] = tmp_path / f"{name}.parquet"
        write(obj, files[name])
    code = main(["evaluate", "--trace", str(files["t"]), "--profile", str(files["p"]),
                 "--measurements", str(files["m"])])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "platform.link_gbps" in err


@pytest.mark.slow
def test_the_probe_measures_the_paced_link_and_the_slowed_host(sleepless_clock):
    """The probe's link samples go through the paced copy and its CPU FLOP/s samples through the
    slowed host: on the real clock plus sleeps that return at once, a link paced to 10 MB/s
    (13.4 s a sample, never waited for) measures 10 MB/s, and the CPU's FLOP/s are the product's
    FLOPs over F times its unslowed duration, which each host sleep gives as (F - 1) times it."""
    from cope_core.mechanisms.probe import probe_platform
    clock = sleepless_clock(ACCELERATOR, "cope_core.mechanisms.timing", real=True)
    hidden, F = 2048, 2.0
    with Accelerator("cpu", link_gbps=0.01, cpu_slowdown=F) as acc:
        spec = probe_platform(acc, torch.bfloat16, hidden)
    # the copy is paced to the end: a sample is never shorter than bytes / X, and only the
    # stream's round trip (real time, far below 1 % of 13.4 s) is added to it
    assert spec.link_bandwidth <= 0.01e9 * (1 + 1e-9)
    assert spec.link_bandwidth == pytest.approx(0.01e9, rel=0.01)
    # the host's sleeps, in sample order after the warm-up's: (F - 1) x each product's duration
    host = [s for t, s in clock.slept if t == threading.get_ident()][1:]
    assert len(host) >= 3
    # the probe's product: 16 times a 1 x 2048 row by its 4 MiB bf16 matrix, 2048 x 1024
    flops = 2.0 * hidden * 1024 * 16
    # (5 %: a sample adds the call's own real time, microseconds against a 10 ms product)
    assert spec.cpu_flops_per_thread == pytest.approx(flops / (F / (F - 1) * min(host)),
                                                      rel=0.05)
