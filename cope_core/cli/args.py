"""Argument types and checks shared by the sub-commands."""
from __future__ import annotations

import argparse

from ..files import check_writable


def ints(text: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``; at least one whole number."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one whole number, got {text!r}")
    return values


def k_arg(text: str) -> str:
    """A cache size, a comma list of them, or ``all`` (checked here, parsed by the command)."""
    if text != "all":
        ints(text)
    return text


def check_output(path: str, force: bool, *, folder: bool = False) -> None:
    """Refuse before any work starts: an existing output without ``--force``, or a folder where
    a file is to be written (``folder``: the output is itself a folder)."""
    check_writable(path, overwrite=force, folder_ok=folder)
