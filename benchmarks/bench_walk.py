"""One person's walk through the explorer in a real browser: first page, operating point, pages.

Workload (issue 38, "Slow steps"): ``streamlit run app.py`` with an empty numba cache directory
(``NUMBA_CACHE_DIR``, a temp folder), an empty Streamlit disk cache (``HOME`` a temp folder:
``st.cache_data(persist="disk")`` keeps its files in ``~/.streamlit/cache``) and one headless
Chromium session (Debian's ``/usr/bin/chromium`` through Playwright). Timed, each from the
browser's request or click until the script run is over and the page stays still
(``data-test-script-state`` is ``notRunning`` and stays so for ``QUIET`` s; the time reported is
when it first became so):

- **cold first page**: the first server's first request (``/``, the Overview), numba compiling
  its kernels into the empty cache;
- **second start**: a second server on the same numba and Streamlit caches (the kernels, the
  examples' files as read and the first page's sweep load from disk), its first request;
- **operating point**: on the Landscape, the operating-point choice changed ``--repeats``
  times (between the profile's first two points);
- **page change**: every page by the sidebar, ``--repeats`` rounds (the first round meets
  each page's computations for the first time, later rounds their caches).

The server's log is scanned for tracebacks and "Inotify" lines. Run:
``python benchmarks/bench_walk.py [--repeats 3] [--example qwen3-30b-a3b] [--json OUT]``
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _server import CHROMIUM, CHROMIUM_ARGS, serve  # beside this script

PAGES = ["Policy Matrix", "Landscape", "Predicted vs measured", "Traces", "Profiles",
         "Compare platforms", "Export", "Overview"]
STATE = ("() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
         " return a ? a.getAttribute('data-test-script-state') : null; }")
QUIET = 0.8


def settled(pg, t0: float, started: bool = False, timeout: float = 180) -> float:
    """Seconds from ``t0`` until the script run is over for good (quiet for ``QUIET`` s).

    ``started``: the run is known to have begun (else wait until it has been seen running,
    or until a quiet ``QUIET`` s passed: a change whose run ended before the first poll)."""
    done_at = None
    seen = started
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        state = pg.evaluate(STATE)
        now = time.perf_counter()
        if state == "running":
            seen, done_at = True, None
        elif state == "notRunning":
            if done_at is None:
                done_at = now
            if now - done_at >= QUIET and (seen or now - t0 > 2 * QUIET):
                return done_at - t0
        time.sleep(0.03)
    raise TimeoutError("the page never settled")


def _open(browser, url: str):
    """A fresh browser context (its own Streamlit session) with ``url`` requested; returns the
    context, its page and when the request was made."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1100})
    pg = ctx.new_page()
    pg.set_default_timeout(180_000)
    t0 = time.perf_counter()
    pg.goto(url)
    pg.wait_for_selector('[data-testid="stApp"]')
    return ctx, pg, t0


def first_page(browser, base: str, example: str) -> float:
    ctx, pg, t0 = _open(browser, f"{base}/?example={example}")
    s = settled(pg, t0)
    ctx.close()
    return s


def walk(browser, base: str, example: str, repeats: int) -> dict:
    ctx, pg, t0 = _open(browser, f"{base}/landscape?example={example}")
    settled(pg, t0)
    ops: list[float] = []
    box = pg.locator('[data-testid="stSelectbox"]', has_text="Operating point").first
    for i in range(repeats * 2):
        box.click()
        options = pg.locator('[role="option"]')
        options.nth(i % 2 if options.count() > 1 else 0).click()
        ops.append(settled(pg, time.perf_counter() - 0.0))
    pages: dict[str, list[float]] = {p: [] for p in PAGES}
    for _ in range(repeats):
        for title in PAGES:
            link = pg.locator('[data-testid="stSidebarNav"] a', has_text=title).first
            t0 = time.perf_counter()
            link.click()
            pg.get_by_role("heading", name=title if title != "Overview" else "COPE Explorer"
                           ).first.wait_for()
            pages[title].append(settled(pg, t0))
    href = pg.evaluate("() => window.location.href")
    ctx.close()
    return {"op_change_s": ops, "page_change_s": pages, "last_url": href}


def _med(xs: list[float]) -> str:
    return f"{np.median(xs):.2f} s (max {max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--example", default="qwen3-30b-a3b")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        cache, home, log = Path(tmp) / "numba", Path(tmp) / "home", Path(tmp) / "server.log"
        cache.mkdir()
        home.mkdir()
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # the project's own config, no other flags; both caches start empty. Python writes its
        # bytecode as it does for a user (a VM's PYTHONDONTWRITEBYTECODE=1 made every server
        # compile cope_core from source); cope_core's own __pycache__ is not emptied
        env = {"NUMBA_CACHE_DIR": str(cache), "HOME": str(home), "PYTHONDONTWRITEBYTECODE": ""}
        with log.open("a") as fh, serve(env, fh, poll_s=0.2) as (base, _):
            out["cold_first_page_s"] = first_page(browser, base, args.example)
        with log.open("a") as fh, serve(env, fh, poll_s=0.2) as (base, _):
            out["second_start_first_page_s"] = first_page(browser, base, args.example)
            out.update(walk(browser, base, args.example, args.repeats))
        browser.close()
        text = log.read_text()
        out["log_tracebacks"] = text.count("Traceback")
        out["log_inotify_lines"] = text.count("Inotify")
        quiet = [ln for ln in text.splitlines() if "Inotify" not in ln]
        out["log_tail"] = "\n".join(quiet[-120:]) if out["log_tracebacks"] else ""
    print(f"cold first page        {out['cold_first_page_s']:.2f} s")
    print(f"second start, 1st page {out['second_start_first_page_s']:.2f} s")
    print(f"operating point change {_med(out['op_change_s'])}")
    for title, xs in out["page_change_s"].items():
        print(f"page change -> {title:22s} {_med(xs)}  first {xs[0]:.2f}")
    allp = [x for xs in out["page_change_s"].values() for x in xs[1:]] or \
        [x for xs in out["page_change_s"].values() for x in xs]
    print(f"page change, all pages after the first round: {_med(allp)}")
    print(f"server log: {out['log_tracebacks']} tracebacks, {out['log_inotify_lines']} Inotify")
    if out["log_tail"]:
        print(out["log_tail"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
