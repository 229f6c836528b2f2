"""Helpers of the browser tests: a fresh ``streamlit run app.py`` on a free port (started as the
browser benchmarks start it, benchmarks/_server.py), Debian's chromium through Playwright, and
waiting for a script run to end. (tests/test_app_browser.py has its own copies, from before
this module; it may move to these.)"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from llama_tools import missing_runtime

ROOT = Path(__file__).resolve().parents[1]
# the server and browser settings the browser benchmarks use (benchmarks/_server.py)
sys.path.insert(0, str(ROOT / "benchmarks"))
from _server import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from _server import serve as start_server  # noqa: E402

#: sidebar title -> the page's heading
HEADINGS = {"Overview": "COPE Explorer", "Policy Matrix": "Policy Matrix",
            "Landscape": "Landscape", "Predicted vs measured": "Predicted vs measured",
            "Traces": "Traces", "Profiles": "Profiles", "Compare platforms": "Compare platforms",
            "Export": "Export a policy"}


def require_browser() -> None:
    """Fail (or skip, with COPE_ALLOW_MISSING_RUNTIMES=1) when chromium or playwright is
    missing, naming what to install."""
    if not Path(CHROMIUM).exists():
        missing_runtime(f"{CHROMIUM} is missing", "apt-get install -y chromium")
    if importlib.util.find_spec("playwright") is None:
        missing_runtime("the playwright package is missing", "bash scripts/install.sh")


@contextlib.contextmanager
def serve() -> Iterator[str]:
    """A fresh ``streamlit run app.py`` on a free port; yields its base URL. The benchmarks'
    start-up (benchmarks/_server.py); a server that does not start within 90 s fails the test."""
    with contextlib.ExitStack() as stack:
        try:
            base, _ = stack.enter_context(
                start_server({}, flags=("--server.fileWatcherType", "none"), start_s=90))
        except RuntimeError as e:
            pytest.fail(str(e))
        yield base


@contextlib.contextmanager
def browser_page(height: int = 1900, width: int = 1400) -> Iterator:
    """One chromium page (its own Streamlit session per URL load)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": width, "height": height})
        pg.set_default_timeout(90_000)
        try:
            yield pg
        finally:
            browser.close()


def settle(pg) -> None:
    """Wait until the script run is over and the page stays still (checked twice over a
    second: a fresh server's first request runs twice, see ``session.run_through_app``)."""
    state = ("() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
             " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }")
    pg.wait_for_selector('[data-testid="stApp"]')
    time.sleep(0.3)
    deadline = time.time() + 120
    while True:
        pg.wait_for_function(state)
        time.sleep(0.5)
        if pg.evaluate(state):
            time.sleep(0.5)
            if pg.evaluate(state) or time.time() > deadline:
                return


def walk_to(pg, title: str) -> None:
    """Follow the sidebar's link to ``title`` (in the session) and wait for its run to end."""
    pg.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    pg.get_by_role("heading", name=HEADINGS[title]).first.wait_for()
    settle(pg)


def query(pg) -> dict[str, str]:
    """The query string as the browser has it (Streamlit writes it by history.replaceState,
    which ``page.url`` misses)."""
    href = pg.evaluate("() => window.location.href")
    return {k: v[-1] for k, v in parse_qs(urlsplit(href).query).items()}


def slider_value(pg) -> float | None:
    s = pg.locator('[data-testid="stSlider"] input[type="range"]')
    return float(s.first.get_attribute("value")) if s.count() else None


def errors(pg) -> int:
    """Exceptions and error boxes on the page."""
    return (pg.locator('[data-testid="stException"]').count()
            + pg.locator('[data-testid="stAlertContentError"]').count())
