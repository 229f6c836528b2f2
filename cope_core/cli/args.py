"""Argument types and checks shared by the sub-commands."""
from __future__ import annotations

import argparse

from ..errors import CopeInputError
from ..files import check_writable
from ..matrix import get_candidate


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


def layers(text: str) -> int:
    """``--layers N``: a whole number of MoE layers, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of layers, got {text!r}") \
            from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 layer, got {n}")
    return n


def candidate_list(text: str) -> list[str]:
    """``--candidates``: a comma list of candidate ids, each one of the 13."""
    ids = [c.strip() for c in text.split(",") if c.strip()]
    if not ids:
        raise argparse.ArgumentTypeError(f"expected candidate ids separated by commas, got "
                                         f"{text!r}")
    for c in ids:
        try:
            get_candidate(c)
        except CopeInputError as exc:
            raise argparse.ArgumentTypeError(exc.detail) from None
    return ids


def k_arg(text: str) -> str:
    """A cache size, a comma list of them, or ``all`` (checked here, parsed by the command)."""
    if text != "all":
        ints(text)
    return text


def check_output(path: str, force: bool, *, folder: bool = False) -> None:
    """Refuse before any work starts: an existing output without ``--force``, or a folder where
    a file is to be written (``folder``: the output is itself a folder)."""
    check_writable(path, overwrite=force, folder_ok=folder)


def add_model_options(s: argparse.ArgumentParser, *, required: bool = False,
                      what: str = "the model") -> None:
    """``--model`` (a catalog name, GGUF file, model folder or config.json) and ``--quant``."""
    s.add_argument("--model", required=required,
                   help=f"{what}: a catalog name (cope models), a GGUF file (its header is "
                        "read, never the weights), or a Hugging Face model folder / config.json")
    s.add_argument("--quant", metavar="PRESET",
                   help="price a catalog model or HF config as llama-quantize's preset "
                        "(Q4_K_M, Q5_K_M, Q6_K, Q8_0, MXFP4_MOE, BF16, ...); a GGUF has its own")


def priced_as_model(args: argparse.Namespace, trace, cal):
    """``trace`` and ``cal`` re-labelled with ``--model``'s geometry (the same routing priced as
    the model the user runs), or as they are without ``--model``."""
    g = model_from_args(args)
    if g is None:
        return trace, cal
    return trace.with_model(g), cal.with_model(g) if cal is not None else None


def model_from_args(args: argparse.Namespace):
    """The geometry ``--model``/``--quant`` name (None without --model)."""
    from ..models import resolve_model
    if getattr(args, "model", None) is None:
        if getattr(args, "quant", None):
            raise CopeInputError("needs --model", field="--quant")
        return None
    return resolve_model(args.model, args.quant)
