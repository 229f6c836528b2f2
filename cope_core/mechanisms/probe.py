"""Measured peak numbers of this machine for the roofline baseline (HRM): accelerator FLOP/s and
memory bandwidth, host-to-accelerator link bandwidth, CPU FLOP/s per thread and CPU memory
bandwidth. The result is a :class:`~cope_core.platforms.PlatformSpec` (``source="measured"``)."""
from __future__ import annotations

import torch

from ..platforms import PlatformSpec
from .accelerator import cpu_cores, cpu_name
from .threads import host_threads
from .timing import StopRule, round_robin, timed

#: Every quantity gets at least 5 samples, spread over at least two seconds by sampling in turns.
_RULE = StopRule(warmup=1, min_samples=5, max_samples=15, batch=2, rel_tol=0.05, max_seconds=4.0)
_MIN_SECONDS, _BUDGET_SECONDS = 2.0, 4.0


def _on_stream(stream, fn):
    def run() -> float:
        def go() -> None:
            stream.submit(fn)
            stream.record().synchronize()
        return timed(go)
    return run


def _on_host(fn, threads: int):
    def run() -> float:
        with host_threads(threads):
            return timed(fn)
    return run


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
    """Measure the peak numbers of ``acc`` and the host (about two seconds on a small CPU).

    FLOP/s are those of a batch-1 product at the model's width ``hidden`` in ``dtype`` on
    cache-resident weights — what decode's experts and blocks can reach when memory is not the
    limit; bandwidths come from streaming copies. (A large square matrix product, the probe of
    round 1, measures a peak decode never sees: 0.94 GF/s in bfloat16 on one 2-core VM, 82 GF/s
    on another, both far from the 5-10 GF/s a decode GEMV reaches there.) Each quantity is its
    fastest of at least five samples, taken in turns over at least two seconds: one burst of other
    work on a busy machine cannot spoil one number alone (round 2's single-pass median let a CI
    run's FLOP/s come out 33 % low)."""
    cuda = acc.kind == "cuda"
    size = (1 << 30) if cuda else (1 << 27)         # bytes per buffer
    gemv, flops = _gemv(acc.alloc, hidden, dtype)
    src, dst = acc.alloc((size // 4,), torch.float32), acc.alloc((size // 4,), torch.float32)
    host = acc.host_alloc((size // 4,), torch.float32)
    host_gemv, _ = _gemv(lambda shape, dt: torch.empty(shape, dtype=dt), hidden, dtype)
    acc.synchronize()   # setup ran on the default stream; the streams below must see it
    cores = cpu_cores()
    # (work per sample, sampler): the copy through the copy worker's own path, so a paced link
    # measures at its pace; host FLOP/s through host_compute, so a slower host measures slower
    work = [(flops, _on_stream(acc.compute, gemv)),
            (2 * size, _on_stream(acc.compute, lambda: dst.copy_(src))),
            (size, _on_stream(acc.copy, lambda: acc.link_copy(dst, host))),
            (flops, _on_host(lambda: acc.host_compute(host_gemv), 1)),
            (size, _on_host(host.sum, 1)),
            (size, _on_host(host.sum, cores))]
    timings = round_robin([w[1] for w in work], [_RULE] * len(work),
                          budget_seconds=_BUDGET_SECONDS, min_seconds=_MIN_SECONDS)
    # a peak is what an unhindered run reaches, and interference only slows a run down: each
    # quantity is its fastest sample, the samples taken in turns so that a burst of other work
    # on the machine cannot cover every sample of one quantity
    gpu_flops, gpu_bw, link_bw, cpu_flops_1, bw_1, bw_all = (
        amount / (min(t.samples_us) / 1e6) for (amount, _), t in zip(work, timings))
    src = dst = host = gemv = host_gemv = None
    gpu = acc.name
    return PlatformSpec(
        name=f"{gpu}+measured", gpu_name=gpu, gpu_flops=float(gpu_flops),
        gpu_bandwidth=float(gpu_bw),
        link_name="pcie (measured)" if cuda else "host memcpy (emulated)",
        link_bandwidth=float(link_bw), cpu_name=cpu_name(), cpu_cores=cores,
        cpu_flops_per_thread=float(cpu_flops_1), cpu_bandwidth=float(max(bw_all, bw_1)),
        cpu_bandwidth_per_thread=float(bw_1), source="measured")

