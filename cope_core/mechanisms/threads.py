"""Per-thread torch CPU thread budgets.

``torch.set_num_threads`` looks process-global, but with the OpenMP backend (the CPU builds of
torch on Linux) it sets the *calling* thread's OpenMP ``nthreads`` ICV and MKL's thread-local
count; it also stores the value in a global that a thread copies **the first time it uses
torch's thread pool** (``at::internal::lazy_init_num_threads``). A thread that calls
``set_num_threads`` before that first use is later overwritten by whatever another thread set
globally. :func:`pin_thread_budget` therefore triggers the lazy initialisation first and then
sets the budget, after which the thread keeps its own count whatever other threads do. This is
what lets the emulated accelerator's worker and the host's CPU-expert work run side by side in
one process with separate budgets (see ``docs/mechanisms.md``).
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

from ..errors import CopeInputError


def per_thread_budgets() -> bool:
    """True when thread budgets are per thread (OpenMP backend)."""
    return "OpenMP" in torch.__config__.parallel_info()


def pin_thread_budget(threads: int) -> None:
    """Give the calling thread its own torch intra-op budget of ``threads``."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise CopeInputError(f"expected a whole number of threads >= 1, got {threads!r}",
                             field="threads")
    torch.get_num_threads()  # lazy per-thread initialisation first, or it would undo the next line
    torch.set_num_threads(threads)


@contextlib.contextmanager
def host_threads(threads: int) -> Iterator[None]:
    """Run a block with the calling (host) thread pinned to ``threads``; restore afterwards."""
    before = torch.get_num_threads()
    pin_thread_budget(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def short_switch_interval(seconds: float = 2e-4) -> Iterator[None]:
    """Shorten the GIL switch interval while an in-process emulated accelerator runs.

    A worker that wants the GIL while another thread runs pure Python waits up to the switch
    interval (5 ms by default), a latency no real accelerator has; torch kernels release the GIL,
    so this only bounds the wait behind host-side Python bookkeeping.
    """
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(before)
