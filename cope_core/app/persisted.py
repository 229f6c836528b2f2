"""What the explorer keeps across server starts: the shipped examples' files as read and the
first page's priced sweep, in Streamlit's own disk cache (``st.cache_data(persist="disk")``:
pickled under ``~/.streamlit/cache``), so that a restarted server answers its first page without
reading Parquet through numba or replaying and pricing every K again (docs/app.md#speed).

Only results of shipped files and catalog choices are kept (:func:`shipped`): nothing computed
from an upload, a part file or a machine chosen in the sidebar. A value is found again only
under the same arguments and the same :func:`fingerprint` of the library's code, the data files
it reads and the versions of the packages that compute and pickle it: changed code or data is
computed afresh, never answered from disk.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import streamlit as st

from ..estimate.model_error import MODEL_ERROR_FILE
from ..trace.synth_defaults import PARAMETERS_FILE
from .dataset import Dataset
from .machine_choice import is_your_machine

#: The library's own files (sources and the parts catalog's tables) and the data files it reads
LIBRARY = Path(__file__).resolve().parents[1]
DATA_FILES = (MODEL_ERROR_FILE, PARAMETERS_FILE)
_PACKAGES = ("numba", "numpy", "pandas", "streamlit")
T = TypeVar("T")


@functools.cache
def fingerprint() -> str:
    """A hash of every file of the library (``cope_core``, by path and contents), of the data
    files it reads (:data:`DATA_FILES`), and of the Python and package versions (computed once
    a process: a server's code does not change under it without a restart)."""
    h = hashlib.sha256()
    files = sorted(p for p in LIBRARY.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in [*files, *DATA_FILES]:
        h.update(os.path.relpath(path, LIBRARY.parent).encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"missing")
    versions = [sys.version, np.__version__, pd.__version__]
    versions += [metadata.version(p) for p in _PACKAGES]
    h.update("\0".join(versions).encode())
    return h.hexdigest()


def shipped(ds: Dataset) -> bool:
    """Whether every input of ``ds`` is a shipped file or a catalog choice: no upload, and the
    example's own profile (not one made for a machine chosen in the sidebar, whose parts may
    come from the user's part file). Only such results are kept on disk."""
    return (not any(o.startswith("upload") for o in ds.origin.values())
            and not is_your_machine(ds.profile))


@st.cache_data(show_spinner=False, max_entries=32, persist="disk")
def _read_disk(kind: str, path: str, stamp: str, code: str, _reader: Callable[[str], Any]) -> Any:
    return _reader(path)


def read_shipped(kind: str, path: str, stamp: str, reader: Callable[[str], Any]) -> Any:
    """``reader(path)`` of a shipped file, kept on disk under its kind, path, modification
    stamp and the library's :func:`fingerprint` (``reader`` is the kind's reader)."""
    return _read_disk(kind, path, stamp, fingerprint(), reader)


@st.cache_data(show_spinner=False, max_entries=64, persist="disk")
def _kept_disk(name: str, code: str, key: str, args: tuple, _compute: Callable[[], Any]) -> Any:
    return _compute()


def kept(name: str, ds: Dataset, args: tuple, compute: Callable[[], T]) -> T:
    """``compute()`` of ``ds``, kept on disk when ``ds`` is :func:`shipped`: under ``name``,
    the dataset's key (its files' paths and modification stamps), ``args`` (everything else the
    result depends on, hashable by Streamlit) and the library's :func:`fingerprint`. Of any
    other dataset it is computed by every process and never written."""
    if not shipped(ds):
        return compute()
    return _kept_disk(name, fingerprint(), ds.key, args, compute)
