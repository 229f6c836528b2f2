"""The Streamlit layer of the explorer, as the pages see it: :func:`page` opens every page, and the
names of :mod:`.url_state` (settings in the URL), :mod:`.sources` (examples, uploads, the
dataset) and :mod:`.controls` (shared widgets) are re-exported here, so a page imports only this
module. Cached computations are in :mod:`.results`; the rest of :mod:`cope_core.app` is free of
Streamlit.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager

from ..errors import CopeInputError
from . import rerun_log, your_machine
from .controls import (
    current_estimator,
    current_op,
    current_vram,
    estimator_widget,
    op_widget,
    settings_row,
    vram_caption,
    vram_widget,
)
from .dataset import Dataset, file_names
from .sources import (
    MAX_DECODED_MIB,
    MAX_UPLOAD_MB,
    banner,
    dataset,
    examples,
    examples_with_measurements,
    forget_uploads,
    read,
    read_upload,
    require_predictable,
    sidebar,
    switch_example,
    upload_slot,
    verify_record,
    verify_upload,
)
from .url_state import bound, bound_numbers, rebind, remember, resolve, settings, sync_url


# --- fragments ------------------------------------------------------------------------------------
def fragment(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``st.fragment`` for a part of a page whose own widgets change only that part: they rerun
    it alone, not the page. Its lone reruns are timed like whole runs (:mod:`.rerun_log`)."""
    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> None:
            with rerun_log.measured(name):
                fn(*args, **kwargs)
        return st.fragment(timed)
    return wrap


# --- errors ---------------------------------------------------------------------------------------
@contextmanager
def user_errors() -> Iterator[None]:
    """Show a CopeInputError as one ``st.error`` line and end this run of the page."""
    try:
        yield
    except CopeInputError as exc:
        st.error(file_names(str(exc)))      # never a path of the machine serving the app
        st.stop()


def page(title: str, intro: str | None = None, *, before: Callable[[], None] | None = None,
         predictable: bool = False) -> Dataset:
    """Open a page: run it inside ``app.py`` (:func:`run_through_app`), its title and intro,
    what must come before the data (``before``: e.g. an upload slot), then the dataset with its
    banner; with ``predictable`` the page stops, saying why, when the data cannot be predicted.

    Returns
    -------
    Dataset
        The data the sidebar and the uploads chose.
    """
    run_through_app()
    st.title(title)
    if intro:
        st.write(intro)
    if before is not None:
        before()
    with user_errors():
        ds = dataset()
    banner(ds)
    your_machine.no_gpu_page(title, ds)     # no GPU chosen: the CPU-only answer
    if predictable:
        require_predictable(ds)
    return ds


def run_through_app() -> None:
    """First call of every ``pages/*.py``: make sure the page runs inside ``app.py``.

    Streamlit (1.67, ``runtime/pages_manager.py``) keeps a process-wide flag,
    ``PagesManager.uses_pages_directory``, set when a ``pages/`` folder sits beside the entry
    script and cleared only by the first ``st.navigation`` call; while it is set the script
    runner executes the requested ``pages/`` file alone (``script_runner.py``, ``_mpa_v1``), so a
    fresh server whose first request is a sub-page URL never runs ``app.py``: no titled
    navigation, no example chooser, no settings from the URL. Clear it and rerun: ``st.rerun``
    keeps the query string and the page (hashed from its ``url_path``, which equals the file's
    stem), so ``app.py`` runs and ``st.navigation`` opens this same page."""
    if getattr(PagesManager, "uses_pages_directory", False):
        PagesManager.uses_pages_directory = False
        st.rerun()


__all__ = ["MAX_DECODED_MIB", "MAX_UPLOAD_MB", "banner", "bound", "bound_numbers",
           "current_estimator", "current_op", "current_vram", "dataset", "estimator_widget",
           "examples", "examples_with_measurements", "forget_uploads", "fragment", "op_widget",
           "page", "read", "read_upload", "rebind", "remember", "require_predictable", "resolve",
           "run_through_app", "settings", "settings_row", "sidebar", "switch_example",
           "sync_url", "upload_slot", "user_errors", "verify_record", "verify_upload",
           "vram_caption", "vram_widget"]
