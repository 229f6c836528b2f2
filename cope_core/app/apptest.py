"""Open the explorer in Streamlit's ``AppTest`` (used by the page tests and the rerun benchmark).

The pages live in ``pages/`` beside ``app.py`` and are chosen by ``st.navigation``. The real
server runs ``app.py`` on every rerun, but ``AppTest`` re-detects a ``pages/`` folder before each
run and would then execute a page file alone (Streamlit's pre-``st.navigation`` layout), skipping
``app.py`` and its shared sidebar. The runner below tells it that the app uses navigation.
"""
from __future__ import annotations

from pathlib import Path

from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1 import app_test as _app_test_module


class _NavigationPagesManager(PagesManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        PagesManager.uses_pages_directory = False


def open_app_test(app_path: str | Path, **kwargs) -> AppTest:
    """``AppTest.from_file(app_path)`` for an app whose ``pages/`` are run by ``st.navigation``."""
    _app_test_module.PagesManager = _NavigationPagesManager  # type: ignore[misc]  # the patch
    return AppTest.from_file(str(app_path), **kwargs)


def open_page(app_path: str | Path, page: str | None = None, **query: str) -> AppTest:
    """The app opened with ``query`` in its URL and run (300 s allowed a run), then
    ``pages/PAGE.py`` (None or ``overview``: the default page) switched to and run."""
    at = open_app_test(app_path, default_timeout=300)
    at.query_params.update(query)
    at.run()
    if page and page != "overview":
        at.switch_page(f"pages/{page}.py").run()
    return at


def url_settings(at: AppTest) -> dict[str, str]:
    """The settings in the app's URL now, the last value of each."""
    return {k: (v[-1] if isinstance(v, list) else v) for k, v in at.query_params.items()}


def open_unbroken(app_path: str | Path, page: str | None = None, **query: str) -> AppTest:
    """:func:`open_page`, asserting that the page raised no exception (an ``st.error`` it shows
    may be what a test expects)."""
    at = open_page(app_path, page, **query)
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_clean(app_path: str | Path, page: str | None = None, **query: str) -> AppTest:
    """:func:`open_unbroken`, asserting that the page shows no error either."""
    at = open_unbroken(app_path, page, **query)
    assert not at.error, [e.value for e in at.error]
    return at
