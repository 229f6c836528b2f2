"""Measured peak numbers of this machine for the roofline baseline (HRM): accelerator FLOP/s and
memory bandwidth, host-to-accelerator link bandwidth, CPU FLOP/s per thread and CPU memory
bandwidth. The result is a :class:`~cope_core.platforms.PlatformSpec` (``source="measured"``).
:func:`probe_host_memory` measures the host's memory alone, in about a second, and
:func:`probe_host_kernel` the rate a dot-product kernel streams weights at, in about half a
second, for ``this`` machine's parts (:mod:`cope_core.mechanisms.this_machine`)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

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



@dataclass(frozen=True)
class HostBandwidth:
    """What :func:`probe_host_memory` measured: bytes/s read by all ``threads`` and by one."""

    all_threads: float
    one_thread: float
    threads: int
    buffer_bytes: int
    samples: int
    seconds: float


def probe_host_memory(seconds: float = 1.0, buffer_bytes: int = 512 << 20,
                      threads: int | None = None) -> HostBandwidth:
    """Host memory read bandwidth, with every thread this process may use and with one: a sum
    over a buffer larger than any CPU's last-level cache (so memory, not cache, is read), the
    fastest of a few samples taken in turns over about ``seconds`` (interference only slows a
    run down). Decode streams its CPU experts' weights the same way: read once, in order."""
    threads = threads or cpu_cores()
    host = torch.ones(buffer_bytes // 4, dtype=torch.float32)   # touched, so pages exist
    rule = StopRule(warmup=1, min_samples=3, max_samples=10, batch=2, rel_tol=0.05,
                    max_seconds=seconds)
    t0 = time.perf_counter()
    timings = round_robin([_on_host(host.sum, threads), _on_host(host.sum, 1)], [rule, rule],
                          budget_seconds=seconds, min_seconds=seconds / 2)
    wall = time.perf_counter() - t0
    all_bw, one_bw = (host.numel() * 4 / (min(t.samples_us) / 1e6) for t in timings)
    return HostBandwidth(all_threads=float(max(all_bw, one_bw)), one_thread=float(one_bw),
                         threads=threads, buffer_bytes=host.numel() * 4,
                         samples=sum(len(t.samples_us) for t in timings), seconds=wall)


@dataclass(frozen=True)
class KernelRate:
    """What :func:`probe_host_kernel` measured: bytes/s of 8-bit weights a batch-1 dot-product
    kernel streams from memory with one thread and with ``threads`` threads, and with one thread
    on weights resident in the core's cache."""

    one_thread: float
    all_threads: float
    cached: float
    threads: int
    buffer_bytes: int
    samples: int
    seconds: float


#: the probed kernel's width: an expert's hidden size in the models priced (2048-7168)
_KERNEL_K = 2048
#: the weights streamed from memory (all threads together read it once a sample), and the
#: cache-resident matrix: within a last-level cache, and large enough that one operator call's
#: fixed cost (a few µs) is small beside its 100-200 µs
_KERNEL_BYTES, _CACHED_BYTES = 128 << 20, 2 << 20


def probe_host_kernel(seconds: float = 0.5, buffer_bytes: int | None = None,
                      threads: int | None = None) -> KernelRate:
    """The rate a decode kernel turns 8-bit weights into dot products on this host: torch's
    weight-only int8 matrix-vector product (``aten._weight_int8pack_mm``, one bfloat16
    activation row, one scale per output row) over a ``buffer_bytes`` weight matrix (by default
    128 MiB or 8 MiB per thread, up to 1 GiB: more than a last-level cache, even a server's, so
    it streams from memory) by one thread, by ``threads`` threads
    each on its own share of the rows (as ggml's threads split a product's rows; each runs one
    intra-op thread, since torch's own split of a one-row product does not scale), and by one
    thread on a 2 MiB matrix that stays in the cache. The fastest of a few samples
    taken in turns over about ``seconds``. A sum or a copy streams faster than a dot product
    does, and decode's weights go through the kernel, so this, not a copy's bandwidth, is the
    rate a thread reaches (docs/design.md, "Validation against llama.cpp's CPU kernels")."""
    threads = threads or cpu_cores()
    if buffer_bytes is None:
        buffer_bytes = min(max(_KERNEL_BYTES, threads << 23), 1 << 30)
    rows = max(threads, buffer_bytes // _KERNEL_K // threads * threads)
    w = torch.ones((rows, _KERNEL_K), dtype=torch.int8)     # touched, so pages exist
    scales = torch.ones(rows, dtype=torch.bfloat16)
    x = torch.ones((1, _KERNEL_K), dtype=torch.bfloat16)
    share = rows // threads
    parts = [(w[i * share:(i + 1) * share], scales[i * share:(i + 1) * share])
             for i in range(threads)]
    small = (w[:max(1, _CACHED_BYTES // _KERNEL_K)], scales[:max(1, _CACHED_BYTES // _KERNEL_K)])
    repeats = max(1, w.numel() // small[0].numel() // 8)

    def gemv(m: tuple[torch.Tensor, torch.Tensor]) -> None:
        torch.ops.aten._weight_int8pack_mm(x, m[0], m[1])

    def cached() -> None:
        for _ in range(repeats):
            gemv(small)

    pool = ThreadPoolExecutor(threads)

    def together() -> None:        # torch releases the GIL inside an aten operator
        list(pool.map(gemv, parts))
    rule = StopRule(warmup=1, min_samples=3, max_samples=10, batch=2, rel_tol=0.05,
                    max_seconds=seconds)
    t0 = time.perf_counter()
    try:
        with host_threads(1):
            timings = round_robin([lambda: timed(lambda: gemv((w, scales))),
                                   lambda: timed(together), lambda: timed(cached)], [rule] * 3,
                                  budget_seconds=seconds, min_seconds=seconds / 2)
    finally:
        pool.shutdown()
    wall = time.perf_counter() - t0
    one, every, hot = (amount / (min(t.samples_us) / 1e6) for amount, t in
                       zip((w.numel(), share * threads * _KERNEL_K,
                            small[0].numel() * repeats), timings))
    return KernelRate(one_thread=float(one), all_threads=float(max(every, one)),
                      cached=float(max(hot, one)), threads=threads, buffer_bytes=w.numel(),
                      samples=sum(len(t.samples_us) for t in timings), seconds=wall)
