""""Your machine" in a real browser (issue 40): a machine chosen in the sidebar reaches every
page reached by the sidebar, stays in the URL, and a catalog model without a shipped example
answers on every page. Needs chromium and playwright as tests/test_app_browser.py does."""
from __future__ import annotations

import time

import pytest
from browser_tools import browser_page, errors, query, require_browser, serve, settle, walk_to
from browser_tools import slider_value as slider

pytestmark = pytest.mark.slow
MINE = {"gpu": "rtx3090", "cpu": "ryzen-7-5700x", "memory": "ddr4-3200x2", "pcie": "pcie4x16"}
WALK = ("Policy Matrix", "Landscape", "Export", "Compare platforms", "Overview")


@pytest.fixture(scope="module")
def server():
    require_browser()
    with serve() as base:
        yield base


def _note(pg) -> str:
    return " ".join(pg.locator('[data-testid="stAlertContentInfo"]').all_inner_texts())


def test_a_machine_from_a_link_holds_on_every_page(server):
    with browser_page() as pg:
        pg.goto(server + "/?" + "&".join(f"{k}={v}" for k, v in MINE.items()))
        settle(pg)
        assert "ANALYTIC what-if" in _note(pg)
        speed = pg.locator('[data-testid="stMetric"]', has_text="Speed").first.inner_text()
        assert "tokens/s" in speed
        for title in WALK:
            walk_to(pg, title)
            q = query(pg)
            assert {k: q.get(k) for k in MINE} == MINE, (title, q)
            assert errors(pg) == 0, title
            assert "rtx3090+pcie4x16+ryzen-7-5700x+ddr4-3200x2" in _note(pg), title
            if title in ("Policy Matrix", "Landscape", "Export", "Compare platforms"):
                assert slider(pg) == 24.0, title      # the budget starts at all of the card
            if title == "Compare platforms":
                assert "your machine (ANALYTIC" in pg.inner_text("body")


def test_choosing_a_gpu_in_the_sidebar_and_a_catalog_model(server):
    with browser_page() as pg:
        pg.goto(server + "/landscape?example=gpt-oss-120b&quant=MXFP4_MOE")
        settle(pg)
        assert errors(pg) == 0 and "ANALYTIC what-if" not in _note(pg)
        box = pg.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]',
                         has_text="GPU").first
        box.click()
        pg.keyboard.type("RTX 5080")
        pg.keyboard.press("Enter")
        deadline = time.time() + 60
        while query(pg).get("gpu") != "rtx5080" and time.time() < deadline:
            time.sleep(0.3)
        settle(pg)
        assert query(pg).get("gpu") == "rtx5080"
        assert "rtx5080+" in _note(pg) and errors(pg) == 0
        # the example's budget (24 GiB, from its RTX 4090) gives way to all of the new card
        assert slider(pg) == 16.0 and query(pg).get("vram") == "16"
        for title in WALK:
            walk_to(pg, title)
            assert errors(pg) == 0, title
            q = query(pg)
            assert (q.get("example"), q.get("gpu")) == ("gpt-oss-120b", "rtx5080"), title
