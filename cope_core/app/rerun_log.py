"""The server's own cost of each script run, for the load benchmark (benchmarks/bench_load.py).

Streamlit runs each session's script, and each fragment rerun, in that session's script thread,
so the thread's CPU time over a run (``time.thread_time``) is what that run cost the server,
whatever other sessions do meanwhile. With ``COPE_RERUN_LOG=FILE`` in the server's
environment every run appends one JSON line to FILE: ``{"what": "app" or a fragment's name,
"page": ..., "cpu_ms": ..., "wall_ms": ..., "t": unix time}``: a whole run of ``app.py``, or a
fragment that reran alone (a fragment inside a whole run is part of that run). Without it
nothing is measured or written.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "COPE_RERUN_LOG"
_LOCK = threading.Lock()
_ACTIVE = threading.local()      # inside a measured block of this thread: do not count twice


@contextmanager
def measured(what: str) -> Iterator[dict]:
    """Time the run inside the block (CPU of this thread and wall clock) into the log; the block
    may name the page in the yielded dict (``rec["page"] = ...``).

    A run that ends early (``st.stop``, ``st.rerun``: exceptions Streamlit uses for control
    flow) is logged too, then the exception goes on."""
    rec = {"page": ""}
    path = os.environ.get(ENV)
    if not path or getattr(_ACTIVE, "on", False):     # a fragment inside a whole run
        yield rec
        return
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    _ACTIVE.on = True
    try:
        yield rec
    finally:
        _ACTIVE.on = False
        line = json.dumps({"what": what, "page": rec["page"],
                           "cpu_ms": round(1e3 * (time.thread_time() - cpu0), 3),
                           "wall_ms": round(1e3 * (time.perf_counter() - wall0), 3),
                           "t": time.time()})
        with _LOCK, open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
