"""A classroom on one server: N real browser sessions on one ``streamlit run app.py``.

Workload (issue: the explorer under concurrent sessions): one server on this machine, N headless
Chromium sessions (Debian's ``/usr/bin/chromium`` driven by Playwright; one browser, one context
per session, so each is its own Streamlit session) on the same machine. Session i opens the
Landscape page on shipped example i mod 5, waits for its charts, then makes ``--moves`` moves of
the VRAM slider, one every ``--pace`` seconds (a move: ``--steps`` presses of the arrow key, 0.25
GiB each, towards the larger budget). A move's latency is the time from the first key press
until the budget chart's marker (a plotly shape at the chosen budget) has moved and the script
run is over, as the browser sees it.

Reported per N: p50/p95/max latency, errors (Streamlit exceptions and ``st.error`` boxes on the
page, moves that time out), the server's CPU per script run (each run's own thread CPU, logged
by the app under ``COPE_RERUN_LOG``: :mod:`cope_core.app.rerun_log`), the server process's CPU
over the moves and its peak resident memory (``/proc``). The clients share the machine's cores
with the server, so latency includes their rendering; the server's CPU per run does not.

Run: ``python benchmarks/bench_load.py [--sessions 1,8,16] [--moves 6] [--pace 3] [--json OUT]``
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _server import CHROMIUM, CHROMIUM_ARGS, serve  # beside this script, on sys.path when it runs

EXAMPLES = ("qwen3-30b-a3b", "deepseek-v2-lite", "qwen3.5-35b-a3b", "mixtral-8x7b",
            "olmoe-1b-7b")
NOT_RUNNING = ("() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
               " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }")
#: the budget chart's shapes (its marker) once the script run is over; null while running
MARKER = ("() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
          " if (!a || a.getAttribute('data-test-script-state') !== 'notRunning') return null;"
          " const g = document.querySelectorAll('.js-plotly-plot');"
          " if (g.length < 2 || !g[1].layout) return null;"
          " return JSON.stringify(g[1].layout.shapes || []); }")


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    """Peak resident memory of the server, sampled every 0.25 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, _proc_rss(self.pid))
            self.stop.wait(0.25)


async def _errors(page) -> int:
    return await page.evaluate(
        "() => document.querySelectorAll('[data-testid=\"stException\"],"
        " [data-testid=\"stAlertContentError\"]').length")


async def session(browser, base: str, i: int, moves: int, pace: float, steps: int,
                  ready: asyncio.Barrier, out: dict) -> None:
    ctx = await browser.new_context(viewport={"width": 1400, "height": 1100})
    page = await ctx.new_page()
    page.set_default_timeout(180_000)
    await page.goto(f"{base}/landscape?example={EXAMPLES[i % len(EXAMPLES)]}")
    await page.wait_for_function(MARKER, polling=200)
    await ready.wait()                      # every session loaded: the moves start together
    await asyncio.sleep(pace * i / max(out["n"], 1))       # spread over one pace
    thumb = page.locator('[data-testid="stSlider"] input[type="range"]').first
    lat, timeouts = [], 0
    for _ in range(moves):
        t_next = time.perf_counter() + pace
        old = await page.evaluate(MARKER)
        await thumb.focus()
        t0 = time.perf_counter()
        for _ in range(steps):
            await page.keyboard.press("ArrowRight")
        try:
            await page.wait_for_function(
                "old => { const a = document.querySelector('[data-testid=\"stApp\"]');"
                " if (a.getAttribute('data-test-script-state') !== 'notRunning') return false;"
                " const g = document.querySelectorAll('.js-plotly-plot');"
                " return g.length > 1 && g[1].layout &&"
                " JSON.stringify(g[1].layout.shapes || []) !== old; }",
                arg=old, polling=50, timeout=120_000)
            lat.append(time.perf_counter() - t0)
        except Exception:       # a move whose chart never changed: counted, not raised
            timeouts += 1
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
    out["latency_s"] += lat
    out["timeouts"] += timeouts
    out["page_errors"] += await _errors(page)
    await ctx.close()


async def run_n(base: str, pid: int, n: int, moves: int, pace: float, steps: int,
                log: Path) -> dict:
    from playwright.async_api import async_playwright
    out: dict = {"n": n, "latency_s": [], "timeouts": 0, "page_errors": 0}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ready = asyncio.Barrier(n + 1)
        tasks = [asyncio.create_task(session(browser, base, i, moves, pace, steps, ready, out))
                 for i in range(n)]
        await ready.wait()
        start_lines = len(log.read_text().splitlines()) if log.exists() else 0
        cpu0, t0 = _proc_cpu_s(pid), time.perf_counter()
        await asyncio.gather(*tasks)
        out["server_cpu_s"] = _proc_cpu_s(pid) - cpu0
        out["wall_s"] = time.perf_counter() - t0
        await browser.close()
    runs = [json.loads(x) for x in log.read_text().splitlines()[start_lines:]]
    out["runs"] = len(runs)
    out["run_cpu_ms"] = [r["cpu_ms"] for r in runs]
    return out


def summary(r: dict, rss: int) -> dict:
    lat = np.asarray(r["latency_s"]) if r["latency_s"] else np.array([np.nan])
    cpu = np.asarray(r["run_cpu_ms"]) if r["run_cpu_ms"] else np.array([np.nan])
    return {"sessions": r["n"], "moves": len(r["latency_s"]) + r["timeouts"],
            "p50_s": float(np.percentile(lat, 50)), "p95_s": float(np.percentile(lat, 95)),
            "max_s": float(np.max(lat)), "timeouts": r["timeouts"],
            "page_errors": r["page_errors"], "runs": r["runs"],
            "run_cpu_ms_median": float(np.median(cpu)),
            "run_cpu_ms_p95": float(np.percentile(cpu, 95)),
            "server_cpu_s": r["server_cpu_s"],
            "server_cpu_ms_per_run": 1e3 * r["server_cpu_s"] / max(r["runs"], 1),
            "peak_rss_gb": rss / 1e9, "wall_s": r["wall_s"],
            "latency_samples_s": r["latency_s"], "run_cpu_samples_ms": r["run_cpu_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="1,8,16")
    ap.add_argument("--moves", type=int, default=6)
    ap.add_argument("--pace", type=float, default=3.0, help="seconds between a session's moves")
    ap.add_argument("--steps", type=int, default=1,
                    help="arrow presses per move (0.25 GiB each; one press: one change)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    results = []
    for n in (int(x) for x in args.sessions.split(",")):
        with tempfile.TemporaryDirectory() as tmp:       # a fresh server (empty caches) per N
            log = Path(tmp) / "reruns.jsonl"
            with serve({"COPE_RERUN_LOG": str(log)},
                       flags=("--server.fileWatcherType", "none")) as (base, pid):
                sampler = Sampler(pid)
                sampler.start()
                r = asyncio.run(run_n(base, pid, n, args.moves, args.pace, args.steps, log))
                sampler.stop.set()
                sampler.join()
                s = summary(r, sampler.peak)
        results.append(s)
        print(f"{n:3d} sessions: p50 {s['p50_s']:.2f} s, p95 {s['p95_s']:.2f} s, max "
              f"{s['max_s']:.2f} s, {s['timeouts']} timeouts, {s['page_errors']} page errors; "
              f"{s['runs']} runs, CPU per run median {s['run_cpu_ms_median']:.0f} ms (p95 "
              f"{s['run_cpu_ms_p95']:.0f}), process {s['server_cpu_ms_per_run']:.0f} ms/run; "
              f"peak RSS {s['peak_rss_gb']:.2f} GB", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "settings": vars(args), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
