"""The request in a real browser (issue 64): the sidebar's prompt and answer lengths stay in the
URL on every page, the Overview shows llama.cpp's time to the first token beside the winner's
speed (no metric cut off at 1500 px), the Export page leads with the request's figures and the
Landscape draws request time. Needs chromium and playwright as tests/test_app_browser.py does."""
from __future__ import annotations

import time

import pytest
from browser_tools import browser_page, errors, query, require_browser, serve, settle, walk_to

pytestmark = pytest.mark.slow
MINE = {"example": "gpt-oss-120b", "quant": "MXFP4_MOE", "gpu": "rtx3090",
        "cpu": "ryzen-9-7950x"}
WALK = ("Policy Matrix", "Landscape", "Export", "Overview")
#: every metric's value fits its box (scrollWidth > clientWidth: the text is cut off)
CUT = ("() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"]')]"
       ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)")


@pytest.fixture(scope="module")
def server():
    require_browser()
    with serve() as base:
        yield base


def _metric(pg, label: str) -> str:
    return pg.locator('[data-testid="stMetric"]', has_text=label).first.inner_text()


def test_the_request_from_the_sidebar_holds_on_every_page(server):
    with browser_page(width=1500) as pg:
        pg.goto(server + "/?" + "&".join(f"{k}={v}" for k, v in MINE.items()))
        settle(pg)
        assert errors(pg) == 0
        assert pg.evaluate(CUT) == []
        first = _metric(pg, "First token (s), llama.cpp")
        assert float(first.splitlines()[-1]) > 0
        # a 16k prompt typed into the sidebar reaches the URL and the answer
        box = pg.locator('[data-testid="stSidebar"] [data-testid="stNumberInput"]',
                         has_text="Prompt (tokens)").locator("input")
        box.fill("16384")
        box.press("Enter")
        deadline = time.time() + 90
        while query(pg).get("ptok") != "16384" and time.time() < deadline:
            time.sleep(0.3)
        settle(pg)
        assert query(pg).get("ptok") == "16384" and errors(pg) == 0
        # a four times longer prompt: another answer (a larger -ub can make its first token
        # come sooner than the chat turn's at the default -ub), priced anew
        longer = float(_metric(pg, "First token (s), llama.cpp").splitlines()[-1])
        assert longer > 0 and longer != float(first.splitlines()[-1])
        assert pg.evaluate(CUT) == []
        for title in WALK:
            walk_to(pg, title)
            q = query(pg)
            assert q.get("ptok") == "16384" and q.get("gpu") == "rtx3090", (title, q)
            assert errors(pg) == 0, title
            if title == "Export":
                body = pg.inner_text("body")
                assert "Request (16,384-token prompt, 512-token answer): first token in" in body
            if title == "Landscape":
                pg.locator('[data-testid="stRadio"] label', has_text="request time").click()
                deadline = time.time() + 60
                while query(pg).get("yaxis") != "request" and time.time() < deadline:
                    time.sleep(0.3)
                settle(pg)
                assert "request time (s)" in pg.inner_text('[data-testid="stPlotlyChart"] >> '
                                                           "nth=1")
                assert errors(pg) == 0
        # a link with the request opens the same answer in a new session
        pg.goto(server + "/export?" + "&".join(f"{k}={v}" for k, v in MINE.items())
                + "&ptok=16384&gtok=512")
        settle(pg)
        assert "first token in" in pg.inner_text("body") and errors(pg) == 0
