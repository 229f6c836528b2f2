"""Writing files: atomically, never over a user's file without asking, JSON strictly valid.

Every writer of the project (Parquet files, export artifacts, predictors, hidden-state folders,
raw samples, app uploads) goes through this module, so that all of them behave alike:

* a path that names a folder, or an existing file without ``overwrite``, is a one-line
  :class:`~cope_core.errors.CopeInputError` before anything is written;
* the bytes go to a temporary file with a unique name *in the target folder* and are renamed
  into place, so readers see the old file or the new one, never half of one, a failed write
  leaves the old file intact, and no file of the user's (say ``X.tmp``) is ever touched;
* JSON has no ``NaN`` or ``Infinity`` (which are not JSON): undefined numbers become ``null``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CopeInputError

OVERWRITE_HINT = "use --force (overwrite=True) to replace it"


def short_error(exc: BaseException, limit: int = 200) -> str:
    """An exception's text on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def check_writable(path: str | os.PathLike, *, overwrite: bool = False,
                   folder_ok: bool = False) -> None:
    """Refuse a folder (unless ``folder_ok``), or anything existing without ``overwrite``."""
    dest = Path(path)
    if dest.is_dir() and not folder_ok:
        raise CopeInputError("is a directory, expected a file path to write", source=str(dest))
    if dest.exists() and not overwrite:
        raise CopeInputError(f"already exists; refusing to overwrite it, {OVERWRITE_HINT}",
                             source=str(dest))


def temp_sibling(dest: str | os.PathLike, tag: str = "tmp") -> Path:
    """A name next to ``dest`` that no other file has: hidden, with the process id and a random
    part, so that two writers never share one and a user's own files are never used."""
    dest = Path(dest)
    return dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.{tag}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, overwrite: bool = False,
                errors: tuple[type[BaseException], ...] = ()) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new content to; rename it into place on exit.

    Parameters
    ----------
    path : str or PathLike
        The file to write; missing parent folders are created.
    overwrite : bool
        Replace an existing file.
    errors : tuple of exception types
        Besides ``OSError``, the exceptions of the writing library (e.g. Arrow's) that mean the
        write failed; they become a one-line CopeInputError ``cannot write (...)``.
    """
    dest = Path(path)
    check_writable(dest, overwrite=overwrite)
    tmp = temp_sibling(dest)
    failures: tuple[type[BaseException], ...] = (OSError, *errors)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, dest)
    except failures as exc:
        raise CopeInputError(f"cannot write ({short_error(exc)})", source=str(dest)) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def write_atomic(path: str | os.PathLike, data: bytes | str, *, overwrite: bool = False) -> None:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically (see :func:`atomic_path`)."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_bytes(raw)


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a new temporary folder next to ``path``; on success it replaces ``path``.

    A failure inside the block removes the temporary folder and leaves ``path`` as it was."""
    dest = Path(path)
    check_writable(dest, overwrite=overwrite, folder_ok=True)
    tmp = temp_sibling(dest, "partial")
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if dest.is_dir():
            shutil.rmtree(dest)
        elif dest.exists():
            dest.unlink()
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def plain(obj: Any) -> Any:
    """``obj`` with numpy values made Python ones and non-finite floats made ``None``."""
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, str) else k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_text(obj: Any, indent: int | None = 2) -> str:
    """Strictly valid JSON of ``obj`` (see :func:`plain`): never ``NaN`` or ``Infinity``."""
    return json.dumps(plain(obj), indent=indent, allow_nan=False)


def print_json(obj: Any) -> None:
    """Print :func:`json_text` of ``obj`` to standard output."""
    sys.stdout.write(json_text(obj) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_input(obj) -> dict | None:
    """Path and SHA-256 of the file an input record was read from (its ``path``; None for no
    input, a null digest for an in-memory one): the provenance of policies and verify runs."""
    if obj is None:
        return None
    path = getattr(obj, "path", None)
    if path is None or not Path(path).is_file():
        return {"path": path, "sha256": None}
    return {"path": str(path), "sha256": sha256_file(path)}
