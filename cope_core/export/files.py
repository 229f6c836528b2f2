"""Atomic writing of export artifacts (text, JSON, tensor files)."""
from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

from ..errors import CopeInputError


def check_writable(path: str | os.PathLike, *, overwrite: bool) -> None:
    """Refuse a directory, or an existing file without ``overwrite``, before writing anything."""
    dest = Path(path)
    if dest.is_dir():
        raise CopeInputError("is a directory, expected a file path to write", source=str(dest))
    if dest.exists() and not overwrite:
        raise CopeInputError("already exists; refusing to overwrite it, use --force "
                             "(overwrite=True) to replace it", source=str(dest))


def write_atomic(path: str | os.PathLike, data: bytes, *, overwrite: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    Readers see the old file or the new one, never half of one; parent directories are created.
    """
    dest = Path(path)
    check_writable(dest, overwrite=overwrite)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    except OSError as exc:
        raise CopeInputError(f"cannot write ({exc.strerror or exc})", source=str(dest)) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
