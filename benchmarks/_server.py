"""The benchmarks' Streamlit server: ``streamlit run app.py`` on a free port, waited for until
its health check answers. Beside the browser benchmarks (bench_load.py, bench_walk.py), on
``sys.path`` when they run; tests/browser_tools.py starts the browser tests' servers with it."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
#: Debian's chromium (driven by Playwright) and the flags the benchmarks launch it with
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--headless",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(env: dict[str, str], out: IO | int = subprocess.DEVNULL, flags: tuple[str, ...] = (),
          poll_s: float = 0.5, start_s: float = 120) -> Iterator[tuple[str, int]]:
    """A fresh ``streamlit run app.py`` on a free port; yields (base URL, server pid).

    Parameters
    ----------
    env
        Variables set for the server on top of this process's environment.
    out
        Where the server's stdout and stderr go (a file opened for writing, or DEVNULL).
    flags
        Further ``streamlit run`` options (the project's .streamlit/config.toml holds the rest).
    poll_s, start_s
        Seconds between health checks while it starts, and how long it may take to start
        (then ``RuntimeError``).
    """
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", *flags],
        cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **env))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_s
        while True:
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"streamlit did not start (exit {proc.poll()})")
            time.sleep(poll_s)
        yield base, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
