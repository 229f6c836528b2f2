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


def shares(text: str) -> list[float]:
    """``"20,50,100"`` -> GPU shares in percent, each in (0, 100]."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected GPU shares in percent separated by commas, got {text!r}") from None
    if not values or any(not 0 < v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"expected GPU shares in (0, 100] %, got {text!r}")
    return values


def share(text: str) -> float:
    """One GPU share in percent, in (0, 100]."""
    values = shares(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one GPU share, got {text!r}")
    return values[0]


def k_arg(text: str) -> str:
    """A cache size, a comma list of them, or ``all`` (checked here, parsed by the command)."""
    if text != "all":
        ints(text)
    return text


def check_output(path: str, force: bool, *, folder: bool = False) -> None:
    """Refuse before any work starts: an existing output without ``--force``, or a folder where
    a file is to be written (``folder``: the output is itself a folder)."""
    check_writable(path, overwrite=force, folder_ok=folder)
