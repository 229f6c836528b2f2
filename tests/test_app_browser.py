"""The explorer in a real browser: ``streamlit run app.py`` on a free port, driven by Debian's
chromium through Playwright. Visits every page, moves the VRAM slider on Landscape and checks
that the charts changed, and saves the screenshots used in docs/app.md.

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; .ci/run installs it) and the
``playwright`` package (no ``playwright install``: the system browser is used). Either missing
fails the tests with the reason, unless ``COPE_ALLOW_MISSING_RUNTIMES=1`` (then they skip).
"""
from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from browser_tools import CHROMIUM, CHROMIUM_ARGS, require_browser, settle, start_server

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "screenshots"
#: (URL path and query, screenshot name, heading). The default page lives at the root.
PAGES = [("", "overview", "COPE Explorer"), ("matrix", "matrix", "Policy Matrix"),
         ("landscape", "landscape", "Landscape"),
         ("measured", "measured", "Predicted vs measured"), ("traces", "traces", "Traces"),
         ("profiles?compare=analytic%3Ah100", "profiles", "Profiles"),
         ("export", "export", "Export a policy"),
         ("compare?plat=this%2Ch100%2Bpcie5%2Bxeon-gold-6430%2Crtx5090%2Bpcie5%2Bxeon-gold-6430",
          "compare", "Compare platforms")]


pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _browser_installed():
    require_browser()


@contextlib.contextmanager
def _serve():
    """A fresh ``streamlit run app.py`` on a free port (benchmarks/_server.py's start-up, its log
    kept under .pytest_cache); yields its base URL."""
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(tempfile.NamedTemporaryFile(
            "w", dir=ROOT / ".pytest_cache", prefix="streamlit-browser-test-", suffix=".log",
            delete=False)) if (ROOT / ".pytest_cache").is_dir() else subprocess.DEVNULL
        try:
            base, _ = stack.enter_context(start_server(
                {}, out=log, flags=("--server.fileWatcherType", "none"), start_s=90))
        except RuntimeError as e:
            pytest.fail(str(e))
        yield base


@pytest.fixture(scope="module")
def server():
    with _serve() as base:
        yield base


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # tall enough that a screenshot shows a whole page (Streamlit scrolls inside the app)
        pg = browser.new_page(viewport={"width": 1400, "height": 1900})
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def _charts(pg) -> list[dict]:
    """Data and layout of every plotly chart on the page, as plotly holds them."""
    return pg.evaluate(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => ({"
        " title: (g.layout && g.layout.title && g.layout.title.text) || '',"
        " shapes: JSON.stringify((g.layout && g.layout.shapes) || []),"
        " data: JSON.stringify((g.data || []).map(t => [t.x, t.y])) }))")


def _wait_charts(pg, n: int) -> list[dict]:
    """The page's charts once at least ``n`` of them hold data."""
    pg.wait_for_function(
        "n => Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".filter(g => g.data && g.data.length).length >= n", arg=n)
    return _charts(pg)


def _href(pg) -> str:
    # page.url misses history.replaceState, which is how Streamlit writes the query string
    return pg.evaluate("() => window.location.href")


def test_every_page_renders(server, page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    for path, shot, heading in PAGES:
        page.goto(f"{server}/{path}")
        settle(page)
        page.get_by_role("heading", name=heading).first.wait_for()
        assert page.locator('[data-testid="stException"]').count() == 0, path
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0, path
        assert "Page not found" not in page.content(), path
        if shot in ("matrix", "landscape", "traces", "profiles"):
            assert _wait_charts(page, 2), path
        if shot in ("overview", "compare"):
            assert _wait_charts(page, 1), path
        page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)


def test_bad_upload_shows_an_error_and_keeps_the_page(server, page, tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not a parquet file")
    page.goto(f"{server}/measured")
    settle(page)
    # by its label: the sidebar's part-file uploader (Your machine) comes first on every page
    page.locator('[data-testid="stFileUploader"]', has_text="Measurements").first.locator(
        'input[type="file"]').set_input_files(str(junk))
    page.wait_for_selector('[data-testid="stAlertContentError"]')
    settle(page)
    text = page.locator('[data-testid="stAlertContentError"]').first.inner_text()
    assert text.startswith("upload junk.parquet: not a readable Parquet file")
    assert page.locator('[data-testid="stException"]').count() == 0
    assert "No measurements loaded" in page.content()          # the page still works


def test_vram_slider_changes_the_landscape(server, page):
    page.goto(f"{server}/landscape")
    settle(page)
    before = _wait_charts(page, 2)      # plotly draws after the script run: wait for both
    assert "vram=" in _href(page)       # the settings went into the query string
    thumb = page.locator('[data-testid="stSlider"] input[type="range"]').first
    old_value = thumb.get_attribute("value")
    thumb.focus()
    for _ in range(12):                 # 12 steps of 0.25 GiB: several experts per layer more
        page.keyboard.press("ArrowRight")
    deadline = time.time() + 60
    while time.time() < deadline:
        settle(page)
        after = _wait_charts(page, 2)
        if after[0] != before[0] and after[1] != before[1]:
            break
        time.sleep(0.5)
    assert thumb.get_attribute("value") != old_value
    assert after[0]["title"] != before[0]["title"]       # "TPOT per candidate at K = ..."
    assert after[0]["data"] != before[0]["data"]         # the bars moved
    assert after[1]["shapes"] != before[1]["shapes"]     # the budget marker moved
    assert f"vram={float(thumb.get_attribute('value')):g}" in _href(page)
    page.screenshot(path=str(SHOTS / "landscape-moved.png"), full_page=True)


def test_clicking_a_matrix_cell_opens_its_timeline(server, page):
    page.goto(f"{server}/matrix")
    settle(page)
    _wait_charts(page, 2)
    # centre of the cell (mutable_per_layer, cost_selected): column 3, row 1 of the heatmap
    xy = page.evaluate(
        "() => { const g = document.querySelector('.js-plotly-plot');"
        " const xa = g._fullLayout.xaxis, ya = g._fullLayout.yaxis;"
        " const r = g.getBoundingClientRect();"
        " return [r.left + xa._offset + xa.l2p(3), r.top + ya._offset + ya.l2p(1)]; }")
    page.mouse.click(*xy)
    deadline = time.time() + 30
    while "cell=mutable_per_layer%2Fcost_selected" not in _href(page) and time.time() < deadline:
        time.sleep(0.5)
    settle(page)
    assert "cell=mutable_per_layer%2Fcost_selected" in _href(page)
    timeline = _wait_charts(page, 2)[1]
    assert "cost_selected" in timeline["data"]


def test_a_shared_link_opened_first_on_a_fresh_server(page):
    """A fresh server whose very first request is a sub-page with settings in its query string
    (a shared link): the page runs inside app.py — titled navigation, the example chooser, the
    settings applied — not alone as Streamlit's pages/-folder mode would run it. (The browser
    is the module's; the server is this test's own, since the flag at fault is per process.)"""
    with _serve() as base:
        browser = page.context.browser
        ctx = browser.new_context(viewport={"width": 1400, "height": 1200})
        pg = ctx.new_page()
        pg.set_default_timeout(60_000)
        pg.goto(f"{base}/landscape?example=deepseek-v2-lite&vram=9.5&est=atomic")
        settle(pg)
        pg.get_by_role("heading", name="Landscape").first.wait_for()
        # each link's text is its icon's name and its title: keep the title
        nav = [t.split("\n")[-1].strip()
               for t in pg.locator('[data-testid="stSidebarNav"] a').all_inner_texts()]
        assert "Landscape" in nav and "Policy Matrix" in nav, nav
        assert "landscape" not in nav and "app" not in nav, nav
        chooser = pg.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]')
        chooser.first.wait_for()                # fails after the page's 60 s if never drawn
        assert "Model (example data)" in chooser.first.inner_text()
        href = _href(pg)
        assert "/landscape?" in href and "example=deepseek-v2-lite" in href, href
        assert "vram=9.5" in href and "est=atomic" in href, href
        charts = _wait_charts(pg, 2)
        assert "atomic" in charts[0]["title"]                           # the URL's estimator
        assert pg.locator('[data-testid="stException"]').count() == 0
        ctx.close()


# --- many sessions on one server (docs/app.md#many-sessions-on-one-server) ----------------------
def _session(page, url: str):
    """A second person: a new browser context (its own Streamlit session) at ``url``."""
    ctx = page.context.browser.new_context(viewport={"width": 1400, "height": 1200})
    pg = ctx.new_page()
    pg.set_default_timeout(90_000)
    pg.goto(url)
    settle(pg)
    return ctx, pg


def _goto_page(pg, title: str) -> None:
    """Switch page inside the session (a new URL load would open a new session)."""
    pg.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    pg.get_by_role("heading", name=title).first.wait_for()
    settle(pg)


def test_two_sessions_uploading_at_once_each_see_only_their_own(server, page, tmp_path):
    examples = ROOT / "data" / "examples"
    mine = {"alpha": tmp_path / "alpha-trace.parquet", "beta": tmp_path / "beta-trace.parquet"}
    mine["alpha"].write_bytes((examples / "qwen3-30b-a3b-trace.parquet").read_bytes())
    mine["beta"].write_bytes((examples / "qwen3-30b-a3b-calibration.parquet").read_bytes())
    people = {who: _session(page, f"{server}/?example=qwen3-30b-a3b") for who in mine}
    inputs = {}
    for who, (_, pg) in people.items():
        pg.get_by_text("Upload your own files").first.click()
        inputs[who] = pg.locator('[data-testid="stFileUploader"]', has_text="Routing trace"
                                 ).first.locator('input[type="file"]')
        inputs[who].wait_for(state="attached")
    for who in mine:                    # both sent before either session has read its file
        inputs[who].set_input_files(str(mine[who]))
    for who, (ctx, pg) in people.items():
        other = next(x for x in mine if x != who)
        pg.wait_for_function("t => document.body.innerText.includes(t)",
                             arg=f"trace: upload {who}-trace.parquet")
        settle(pg)
        body = pg.inner_text("body")
        assert f"trace: upload {who}-trace.parquet" in body
        assert f"{other}-trace" not in body
        _goto_page(pg, "Landscape")             # the upload stays with its session
        body = pg.inner_text("body")
        assert f"trace: upload {who}-trace.parquet" in body and f"{other}-trace" not in body
        assert pg.locator('[data-testid="stException"]').count() == 0
        ctx.close()


def test_a_shared_link_shows_its_settings_not_another_sessions(server, page):
    ctx_a, a = _session(page, f"{server}/landscape?example=qwen3-30b-a3b")
    a.get_by_text("hrm", exact=True).first.click()          # A changes the estimator
    settle(a)
    assert "est=hrm" in _href(a)
    assert "hrm" in _wait_charts(a, 2)[0]["title"]
    # B opens a link with settings, then a bare link: the link's settings or the defaults,
    # never A's
    ctx_b, b = _session(page, f"{server}/landscape?example=deepseek-v2-lite&vram=9.5&est=atomic")
    assert "atomic" in _wait_charts(b, 2)[0]["title"]
    slider = b.locator('[data-testid="stSlider"] input[type="range"]').first
    assert float(slider.get_attribute("value")) == 9.5
    assert "deepseek-v2-lite" in b.inner_text("body")
    b.goto(f"{server}/landscape?example=deepseek-v2-lite")
    settle(b)
    assert " cope " in f" {_wait_charts(b, 2)[0]['title']} "
    assert "est=hrm" not in _href(b)
    # and A is as A left it
    a.reload()
    settle(a)
    assert "hrm" in _wait_charts(a, 2)[0]["title"] and "qwen3-30b-a3b" in a.inner_text("body")
    ctx_a.close()
    ctx_b.close()


def test_an_upload_over_the_size_limit_is_refused(server, page, tmp_path):
    from cope_core.app.sources import MAX_UPLOAD_MB
    big = tmp_path / "big-trace.parquet"
    with big.open("wb") as fh:                  # sparse: one byte past the limit
        fh.truncate(MAX_UPLOAD_MB * 2**20 + 1)
    ctx, pg = _session(page, f"{server}/?example=qwen3-30b-a3b")
    pg.get_by_text("Upload your own files").first.click()
    box = pg.locator('[data-testid="stFileUploader"]', has_text="Routing trace").first
    box.locator('input[type="file"]').set_input_files(str(big))
    box.get_by_text("or smaller").first.wait_for()       # the uploader's own refusal
    settle(pg)
    assert "in use: the example's file" in pg.inner_text("body")
    assert pg.locator('[data-testid="stException"]').count() == 0
    ctx.close()


# --- settings and uploads across pages (issue 38) ------------------------------------------------
#: sidebar title -> the page's heading
HEADINGS = {"Overview": "COPE Explorer", "Policy Matrix": "Policy Matrix",
            "Landscape": "Landscape", "Predicted vs measured": "Predicted vs measured",
            "Traces": "Traces", "Profiles": "Profiles", "Compare platforms": "Compare platforms",
            "Export": "Export a policy"}


def _walk_to(pg, title: str) -> None:
    """Follow the sidebar's link to ``title`` (in the session) and wait for its run to end."""
    pg.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    pg.get_by_role("heading", name=HEADINGS[title]).first.wait_for()
    settle(pg)


def _query(pg) -> dict[str, str]:
    from urllib.parse import parse_qs, urlsplit
    return {k: v[-1] for k, v in parse_qs(urlsplit(_href(pg)).query).items()}


def _slider_value(pg) -> float | None:
    s = pg.locator('[data-testid="stSlider"] input[type="range"]')
    return float(s.first.get_attribute("value")) if s.count() else None


def test_settings_survive_every_page_by_the_sidebar(server, page):
    """From a shared link with settings, every page reached by the sidebar keeps them (in the
    URL and in its controls); a slider moved on one page holds on the next ones. (Before,
    Streamlit's per-page widget ids reset them: vram=0 and op=1@20 after the first click.)"""
    ctx, pg = _session(page, f"{server}/landscape?example=qwen3-30b-a3b&vram=16&op=8%40100"
                              "&est=atomic")
    # the viewer's toolbar (.streamlit/config.toml): the menu, but no "Deploy"
    assert pg.locator('[data-testid="stMainMenu"]').count() == 1
    assert pg.get_by_role("button", name="Deploy").count() == 0
    for title in ("Policy Matrix", "Compare platforms", "Export", "Overview", "Traces",
                  "Profiles", "Predicted vs measured", "Landscape", "Export", "Compare platforms"):
        _walk_to(pg, title)
        q = _query(pg)
        assert (q.get("vram"), q.get("op"), q.get("example")) == \
            ("16", "8@100", "qwen3-30b-a3b"), (title, q)
        if title in ("Policy Matrix", "Landscape", "Compare platforms"):
            assert q.get("est") == "atomic", (title, q)
        if title in ("Policy Matrix", "Landscape", "Export", "Compare platforms"):
            assert _slider_value(pg) == 16.0, title
            box = pg.locator('[data-testid="stSelectbox"]', has_text="Operating point").first
            assert "8 CPU threads · GPU share 100%" in box.inner_html(), title
        assert pg.locator('[data-testid="stException"]').count() == 0, title
    # the slider moved on the Landscape holds on Compare and Export
    _walk_to(pg, "Landscape")
    thumb = pg.locator('[data-testid="stSlider"] input[type="range"]').first
    thumb.focus()
    for _ in range(4):                      # 4 steps of 0.25 GiB
        pg.keyboard.press("ArrowRight")
    deadline = time.time() + 60
    while _query(pg).get("vram") != "17" and time.time() < deadline:
        time.sleep(0.3)
    settle(pg)
    for title in ("Compare platforms", "Export", "Overview", "Policy Matrix"):
        _walk_to(pg, title)
        assert _query(pg).get("vram") == "17", (title, _query(pg))
        if title != "Overview":
            assert _slider_value(pg) == 17.0, title
    ctx.close()


def test_an_upload_then_another_example_leaves_every_page_working(server, page):
    """The GGUF header uploaded on one example names the Export's command; switching to the
    4-layer example sets the upload aside (said once) and every page still answers: no
    exception, no error box, no path of the server."""
    import tempfile
    gguf = ROOT / "data" / "models" / "qwen3-30b-a3b-Q4_K_M.header.gguf"
    ctx, pg = _session(page, f"{server}/?example=qwen3-30b-a3b")
    pg.get_by_text("Upload your own files").first.click()
    box = pg.locator('[data-testid="stFileUploader"]', has_text="Model file").first
    box.locator('input[type="file"]').set_input_files(str(gguf))
    pg.wait_for_function("t => document.body.innerText.includes(t)",
                         arg=f"model: upload {gguf.name}")
    settle(pg)
    _walk_to(pg, "Export")
    # the shown tab's first block; waited for, as a late rerun can still be replacing the
    # tabs' contents (CI once read another tab's folded file as the first block)
    lead_js = ("() => { const p = document.querySelector('[role=\"tabpanel\"]:not([hidden])');"
               " const c = p && p.querySelector('[data-testid=\"stCode\"]');"
               " return c ? c.innerText : ''; }")
    try:
        pg.wait_for_function(f"() => ({lead_js})().startsWith('llama-server -m ')",
                             timeout=60_000)
    except Exception:
        pass                                 # the assertion below says what was there
    lead = pg.evaluate(lead_js)
    tabs = pg.locator('[role="tab"]').all_inner_texts()
    assert lead.startswith("llama-server -m ") and gguf.name in lead, (tabs, lead)
    assert "MODEL.gguf" not in lead
    # another example: the upload was made for qwen3-30b-a3b
    pg.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    pg.get_by_role("option", name="deepseek-v2-lite · 4 MoE layers").click()
    pg.wait_for_function("() => document.body.innerText.includes('set them aside')")
    settle(pg)
    server_paths = (str(ROOT), tempfile.gettempdir() + "/cope-app-uploads")
    for title in HEADINGS:
        _walk_to(pg, title)
        body = pg.inner_text("body")
        assert pg.locator('[data-testid="stException"]').count() == 0, title
        assert pg.locator('[data-testid="stAlertContentError"]').count() == 0, (title, body)
        assert "deepseek-v2-lite" in body and gguf.name not in body, title
        assert not any(p in body for p in server_paths), title
    assert _query(pg).get("example") == "deepseek-v2-lite · 4 MoE layers"
    ctx.close()
