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
