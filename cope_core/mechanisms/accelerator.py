"""The accelerator: CUDA when present, otherwise an emulated one in the same process.

Both offer the same small surface the mechanisms are written against: a ``compute`` and a
``copy`` stream (work submitted to a stream runs asynchronously, in submission order), events
(``stream.record()``; ``event.synchronize()`` blocks the host; ``stream.wait(event)`` orders a
stream after an event), device memory (:meth:`Accelerator.alloc`) and host staging memory
(:meth:`Accelerator.host_alloc`, pinned on CUDA so copies can run without the host).

The emulated accelerator gives each stream a dedicated worker thread: the compute worker has its
own torch thread budget (``threads``), the copy worker a budget of one (it plays the copy
engine), and "device" memory is ordinary preallocated, pre-touched host memory that only those
workers touch. Host-side CPU-expert work therefore really overlaps, and really contends, with
accelerator work. Why threads and not a process: see :mod:`cope_core.mechanisms.threads`.
"""
from __future__ import annotations

import math
import os
import platform as _platform
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import CopeInputError
from .threads import pin_thread_budget, short_switch_interval

DEVICES = ("cpu", "cuda")
#: Bytes per paced chunk: small enough that the pacing is smooth, large enough that a chunk's
#: copy is not all overhead.
_CHUNK_BYTES = 1 << 20


# --- emulated ----------------------------------------------------------------------------------
class EmulatedEvent:
    """Set by a stream's worker when it reaches the point where the event was recorded."""

    def __init__(self, stream: EmulatedStream):
        self._flag = threading.Event()
        self._stream = stream

    def _set(self) -> None:
        self._flag.set()

    def query(self) -> bool:
        return self._flag.is_set()

    def synchronize(self) -> None:
        self._flag.wait()
        self._stream.raise_error()


class EmulatedStream:
    """A FIFO of callables run by one worker thread with its own torch thread budget."""

    def __init__(self, name: str, threads: int):
        self.name = name
        self.threads = threads
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=f"cope-{name}",
                                        daemon=True)
        self._thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        pin_thread_budget(self.threads)
        ready.set()
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, args = item
            if self._error is not None and fn.__name__ not in ("_set", "synchronize"):
                continue  # after a failure only events still fire, so nobody waits forever
            try:
                fn(*args)
            except BaseException as exc:  # surfaced on the host at the next synchronize
                self._error = exc

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._q.put((fn, args))

    def record(self) -> EmulatedEvent:
        ev = EmulatedEvent(self)
        self._q.put((ev._set, ()))
        return ev

    def wait(self, event: Any) -> None:
        """Later work on this stream starts only after ``event``."""
        if event is not None and not event.query():
            self._q.put((event.synchronize, ()))

    def synchronize(self) -> None:
        self.record().synchronize()

    def raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"emulated accelerator stream {self.name!r} failed: "
                               f"{self._error!r}") from self._error

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()


# --- CUDA ----------------------------------------------------------------------------------------
class CudaEvent:
    def __init__(self, stream: torch.cuda.Stream):
        self.event = torch.cuda.Event()
        self.event.record(stream)

    def query(self) -> bool:
        return bool(self.event.query())

    def synchronize(self) -> None:
        self.event.synchronize()


class CudaStream:
    """A CUDA stream; submitted callables issue their kernels and copies on it, asynchronously.

    Callables must not synchronise (no ``.item()``, no pageable copies) and must write results
    into preallocated tensors when another stream or the host reads them, so the caching
    allocator never recycles memory another stream still uses."""

    def __init__(self, device: torch.device, name: str):
        self.name = name
        self.stream = torch.cuda.Stream(device=device)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with torch.cuda.stream(self.stream):
            fn(*args)

    def record(self) -> CudaEvent:
        return CudaEvent(self.stream)

    def wait(self, event: Any) -> None:
        if event is not None:
            self.stream.wait_event(event.event)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def raise_error(self) -> None:
        pass

    def close(self) -> None:
        self.stream.synchronize()


# --- the accelerator ---------------------------------------------------------------------------
class Accelerator:
    """Streams, events and memory of one accelerator (see the module docstring).

    Parameters
    ----------
    device : {"cpu", "cuda"}
        ``cpu`` emulates the accelerator with worker threads; ``cuda`` uses the current GPU.
    threads : int
        Torch thread budget of the emulated compute worker (ignored on CUDA).
    link_gbps : float, optional
        Emulated only: the copy worker paces weight copies to this many GB/s (chunks, sleeping
        between them), so the link is busy for bytes / X while its core is mostly free, as a
        real copy engine's; None copies at host-memory speed (round 1's behaviour).
    cpu_slowdown : float
        Emulated only, >= 1: every CPU-side expert computation takes this many times its real
        duration (computed, then the thread sleeps (F - 1) times the compute), so the host can
        be made slower than the emulated accelerator, as real hosts are than GPUs.
    """

    def __init__(self, device: str = "cpu", threads: int = 1, *,
                 link_gbps: float | None = None, cpu_slowdown: float = 1.0):
        if device not in DEVICES:
            raise CopeInputError(f"expected one of {list(DEVICES)}, got {device!r}",
                                 field="--device")
        self.kind = "cuda" if device == "cuda" else "emulated"
        if device == "cuda" and (link_gbps is not None or cpu_slowdown != 1.0):
            raise CopeInputError("is for the emulated accelerator (--device cpu): a real GPU's "
                                 "link and host are what they are",
                                 field="--link-gbps" if link_gbps is not None
                                 else "--cpu-slowdown")
        if link_gbps is not None and not (isinstance(link_gbps, (int, float))
                                          and math.isfinite(link_gbps) and link_gbps > 0):
            raise CopeInputError(f"expected a bandwidth > 0 GB/s, got {link_gbps!r}",
                                 field="--link-gbps")
        if not (isinstance(cpu_slowdown, (int, float)) and math.isfinite(cpu_slowdown)
                and cpu_slowdown >= 1):
            raise CopeInputError(f"expected a factor >= 1, got {cpu_slowdown!r}",
                                 field="--cpu-slowdown")
        self.link_gbps = None if link_gbps is None else float(link_gbps)
        self.cpu_slowdown = float(cpu_slowdown)
        self._registered: list[int] = []
        self._switch = None
        if self.kind == "cuda":
            if not torch.cuda.is_available():
                raise CopeInputError("no CUDA device is available to this torch build "
                                     f"({torch.__version__}); use --device cpu for the emulated "
                                     "accelerator", field="--device")
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.name = torch.cuda.get_device_name(self.device)
            self.threads = None
            self.compute: Any = CudaStream(self.device, "compute")
            self.copy: Any = CudaStream(self.device, "copy")
        else:
            self.device = torch.device("cpu")
            self.name = "emulated"
            if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
                raise CopeInputError(f"expected a whole number >= 1, got {threads!r}",
                                     field="--accel-threads")
            self.threads = threads
            self._switch = short_switch_interval()
            self._switch.__enter__()
            self.compute = EmulatedStream("compute", self.threads)
            self.copy = EmulatedStream("copy", 1)

    # memory
    def alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Device memory, zero-filled (so its pages are touched before anything is timed)."""
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def host_alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Host memory that copies to and from the device read without the host's help.

        On CUDA, large buffers are pinned with ``cudaHostRegister`` at their exact size (the
        pinned caching allocator rounds every request up to a power of two); small ones and any
        that cannot be registered use ``pin_memory``."""
        if self.kind != "cuda":
            return torch.zeros(shape, dtype=dtype)
        t = torch.zeros(shape, dtype=dtype)
        nbytes = t.numel() * t.element_size()
        if nbytes >= 1 << 26:
            err = int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0))
            if err == 0 and t.is_pinned():
                self._registered.append(t.data_ptr())
                return t
        return t.pin_memory()

    def link_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """A host-to-device weight copy, run on the copy stream: paced to ``link_gbps`` on the
        emulated accelerator when set (chunk by chunk, sleeping until each chunk's time at that
        bandwidth is up), otherwise at full speed."""
        if self.link_gbps is None:
            dst.copy_(src, non_blocking=True)
            return
        rate = self.link_gbps * 1e9
        d, s = dst.reshape(-1), src.reshape(-1)
        step = max(1, _CHUNK_BYTES // max(d.element_size(), 1))
        start = time.perf_counter()
        done = 0
        for i in range(0, d.numel(), step):
            j = min(i + step, d.numel())
            d[i:j].copy_(s[i:j])
            done += (j - i) * d.element_size()
            wait = start + done / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)

    def host_compute(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run CPU-side expert work ``fn(*args)`` on this thread, stretched to ``cpu_slowdown``
        times its duration by sleeping afterwards (the core is free meanwhile)."""
        if self.cpu_slowdown == 1.0:
            return fn(*args)
        t0 = time.perf_counter()
        out = fn(*args)
        time.sleep((self.cpu_slowdown - 1.0) * (time.perf_counter() - t0))
        return out

    def synchronize(self) -> None:
        """Wait for all outstanding work (on CUDA also the default stream, where setup runs)."""
        self.copy.synchronize()
        self.compute.synchronize()
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Finish outstanding work, stop the emulated workers, unpin registered memory."""
        self.compute.close()
        self.copy.close()
        if self.kind == "cuda":
            for ptr in self._registered:
                torch.cuda.cudart().cudaHostUnregister(ptr)
            self._registered.clear()
        if self._switch is not None:
            self._switch.__exit__(None, None, None)
            self._switch = None

    def __enter__(self) -> Accelerator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        """Platform metadata: which machine and accelerator produced a result."""
        out: dict[str, Any] = {
            "accelerator": self.kind,
            "gpu": self.name,
            "cpu": cpu_name(),
            "cpu_cores": cpu_cores(),
            "torch": torch.__version__,
            "host": _platform.node(),
            "os": _platform.platform(),
        }
        if self.kind == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            out.update(link="PCIe/NVLink (measured)", cuda=torch.version.cuda,
                       gpu_memory_bytes=int(props.total_memory),
                       gpu_multiprocessors=int(props.multi_processor_count))
        else:
            out.update(link="host memcpy (emulated)" if self.link_gbps is None
                       else f"paced copy worker, {self.link_gbps:g} GB/s (emulated)",
                       accel_threads=self.threads,
                       emulation="compute worker thread with its own torch thread budget, "
                                 "copy worker thread, preallocated slot memory",
                       link_gbps=self.link_gbps, cpu_slowdown=self.cpu_slowdown)
        return out


def cpu_name() -> str:
    """The host CPU's model name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def cpu_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
