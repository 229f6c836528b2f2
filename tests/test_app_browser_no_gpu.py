""""No GPU" in a real browser (issue 40): chosen in the sidebar, it reaches every page reached by
the sidebar, stays in the URL, and each page says what no GPU means there beside the CPU-only
answer. Needs chromium and playwright as tests/test_app_browser.py does."""
from __future__ import annotations

import time

import pytest
from browser_tools import browser_page, errors, query, require_browser, serve, settle, walk_to

from cope_core.app.no_gpu import page_note

pytestmark = pytest.mark.slow
WALK = {"Policy Matrix": "Policy Matrix", "Landscape": "Landscape: what-if VRAM budgets",
        "Traces": "Traces", "Export": "Export a policy", "Overview": "COPE Explorer"}


@pytest.fixture(scope="module")
def server():
    require_browser()
    with serve() as base:
        yield base


def _info(pg) -> str:
    return " ".join(pg.locator('[data-testid="stAlertContentInfo"]').all_inner_texts())


def test_no_gpu_chosen_in_the_sidebar_holds_on_every_page(server):
    with browser_page() as pg:
        # a link shared before the machine's one spelling (mem=, not memory=) opens the same view
        pg.goto(server + "/?cpu=ryzen-7-5700x&mem=ddr4-3200x2")
        settle(pg)
        box = pg.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]',
                         has_text="GPU").first
        box.click()
        pg.keyboard.type("no GPU")
        pg.keyboard.press("Enter")
        deadline = time.time() + 60
        while query(pg).get("gpu") != "none" and time.time() < deadline:
            time.sleep(0.3)
        settle(pg)
        assert query(pg).get("gpu") == "none" and errors(pg) == 0
        for title, page_title in WALK.items():
            walk_to(pg, title)
            q = query(pg)
            assert (q.get("gpu"), q.get("cpu"), q.get("memory"), q.get("mem")) == \
                ("none", "ryzen-7-5700x", "ddr4-3200x2", None), (title, q)
            assert errors(pg) == 0, title
            # the note's words (Markdown's bold markers are not in the page's text)
            assert page_note(page_title)[0].replace("**", "") in _info(pg), title
            body = pg.inner_text("body")
            assert "tokens/s" in body and "On the CPU alone" in body, title
            # the runtimes' commands (a canvas grid: its cells are checked through AppTest)
            assert pg.locator('[data-testid="stDataFrame"]').count() >= 1, title
