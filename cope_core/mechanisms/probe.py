"""Measured peak numbers of this machine for the roofline baseline (HRM): accelerator FLOP/s and
memory bandwidth, host-to-accelerator link bandwidth, CPU FLOP/s per thread and CPU memory
bandwidth. The result is a :class:`~cope_core.platforms.PlatformSpec` (``source="measured"``)."""
from __future__ import annotations

import torch

from ..platforms import PlatformSpec
from .accelerator import cpu_cores, cpu_name
from .threads import host_threads
from .timing import StopRule, timed, until_stable

_RULE = StopRule(warmup=1, min_samples=3, max_samples=8, batch=2, rel_tol=0.05, max_seconds=2.0)


def _on_stream(stream, fn) -> float:
    def run() -> None:
        stream.submit(fn)
        stream.record().synchronize()
    return until_stable(lambda: timed(run), _RULE).median_us / 1e6


def _host(fn) -> float:
    return until_stable(lambda: timed(fn), _RULE).median_us / 1e6


#: Weight bytes of the FLOP/s probe's matrix: small enough to stay in the caches, so the
#: product is limited by arithmetic, not by memory (bandwidth is probed on its own).
_GEMV_BYTES = 4 << 20
_REPEATS = 16


def _gemv(alloc, hidden: int, dtype: torch.dtype):
    """A batch-1 product ``x @ W`` at the model's width on cache-resident weights, and its FLOPs:
    the arithmetic peak at decode's shape and dtype."""
    n = max(64, _GEMV_BYTES // (hidden * torch.empty((), dtype=dtype).element_size()))
    w, x = alloc((hidden, n), dtype), alloc((1, hidden), dtype)
    w.normal_(0.0, 0.02), x.normal_()

    def run() -> None:
        for _ in range(_REPEATS):     # a sample long enough that a stream round trip is noise
            torch.mm(x, w)
    return run, 2.0 * hidden * n * _REPEATS


def probe_platform(acc, dtype: torch.dtype, hidden: int = 4096) -> PlatformSpec:
    """Measure the peak numbers of ``acc`` and the host (a second or two on a small CPU).

    FLOP/s are those of a batch-1 product at the model's width ``hidden`` in ``dtype`` on
    cache-resident weights — what decode's experts and blocks can reach when memory is not the
    limit; bandwidths come from streaming copies. (A large square matrix product, the probe of
    round 1, measures a peak decode never sees: 0.94 GF/s in bfloat16 on one 2-core VM, 82 GF/s
    on another, both far from the 5-10 GF/s a decode GEMV reaches there.)"""
    cuda = acc.kind == "cuda"
    run, flops = _gemv(acc.alloc, hidden, dtype)
    acc.synchronize()   # setup ran on the default stream; the streams below must see it
    gpu_flops = flops / _on_stream(acc.compute, run)
    run = None
    size = (1 << 30) if cuda else (1 << 27)         # bytes per buffer
    src, dst = acc.alloc((size // 4,), torch.float32), acc.alloc((size // 4,), torch.float32)
    acc.synchronize()
    gpu_bw = 2 * size / _on_stream(acc.compute, lambda: dst.copy_(src))
    src = None
    host = acc.host_alloc((size // 4,), torch.float32)
    acc.synchronize()
    # through the copy worker's own path, so a paced link measures at its pace
    link_bw = size / _on_stream(acc.copy, lambda: acc.link_copy(dst, host))
    dst = None

    run, flops = _gemv(lambda shape, dt: torch.empty(shape, dtype=dt), hidden, dtype)
    with host_threads(1):
        cpu_flops_1 = flops / _host(lambda: acc.host_compute(run))
        bw_1 = size / _host(lambda: host.sum())
    cores = cpu_cores()
    with host_threads(cores):
        bw_all = size / _host(lambda: host.sum())
    host = None
    gpu = acc.name
    return PlatformSpec(
        name=f"{gpu}+measured", gpu_name=gpu, gpu_flops=float(gpu_flops),
        gpu_bandwidth=float(gpu_bw),
        link_name="pcie (measured)" if cuda else "host memcpy (emulated)",
        link_bandwidth=float(link_bw), cpu_name=cpu_name(), cpu_cores=cores,
        cpu_flops_per_thread=float(cpu_flops_1), cpu_bandwidth=float(max(bw_all, bw_1)),
        cpu_bandwidth_per_thread=float(bw_1), source="measured")

