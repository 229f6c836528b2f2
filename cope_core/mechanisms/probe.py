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


def probe_platform(acc, dtype: torch.dtype) -> PlatformSpec:
    """Measure the peak numbers of ``acc`` and the host (a second or two on a small CPU)."""
    cuda = acc.kind == "cuda"
    n = 8192 if cuda else 1024
    a, b = acc.alloc((n, n), dtype), acc.alloc((n, n), dtype)
    a.normal_(), b.normal_()
    c = acc.alloc((n, n), dtype)
    acc.synchronize()   # setup ran on the default stream; the streams below must see it
    gpu_flops = 2 * n**3 / _on_stream(acc.compute, lambda: torch.mm(a, b, out=c))
    a = b = c = None    # free the buffers before the next ones
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

    m = 512
    x, y = torch.randn(m, m).to(dtype), torch.randn(m, m).to(dtype)
    with host_threads(1):
        cpu_flops_1 = 2 * m**3 / _host(lambda: acc.host_compute(torch.mm, x, y))
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

