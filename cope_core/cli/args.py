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


# --- naming a machine -------------------------------------------------------------------------
#: The one spelling of a machine on every command that takes one (docs/cli.md#naming-a-machine):
#: each part's flag and what it takes; a command adds its own note (a default, a "with X").
MACHINE_HELP: dict[str, str] = {
    "gpu": "catalog GPU (cope parts gpus), GPU part file, 'this' or 'none'",
    "cpu": "catalog CPU (cope parts cpus), CPU part file or 'this'",
    "memory": "TYPE-MTSxCHANNELS (ddr4-3200x2) or 'this' (measured); default the CPU's usual "
              "memory",
    "pcie": "the GPU's slot, pcieGENxLANES or GENxLANES (default: the card's own interface)",
    "threads": "CPU threads (default: the physical cores)",
}
MACHINE_PARTS = tuple(MACHINE_HELP)
#: Spellings earlier versions took for a part, each refused in one line that names the new one.
RENAMED: dict[str, tuple[str, ...]] = {"pcie": ("--link",), "threads": ("--cpu-threads",)}


class _Renamed(argparse.Action):
    """An old spelling: refused, naming the new one (its value, if given, is swallowed first so
    the error is about the flag, not a stray argument)."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?",
                         help=argparse.SUPPRESS)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        raise CopeInputError(f"is now spelled {self.new} (the same value: {self.new} "
                             f"{values if values is not None else '...'})",
                             field=option_string)


def renamed(s: argparse.ArgumentParser | argparse._ArgumentGroup, old: str, new: str) -> None:
    """Register ``old`` as a refused spelling of ``new`` (hidden from ``--help``)."""
    s.add_argument(old, action=_Renamed, new=new)


def add_machine_options(s: argparse.ArgumentParser | argparse._ArgumentGroup,
                        parts: tuple[str, ...] = MACHINE_PARTS, *,
                        required: tuple[str, ...] = (), defaults: dict | None = None,
                        helps: dict[str, str] | None = None, notes: dict[str, str] | None = None,
                        threads_type=int, prefix: str = "") -> None:
    """``--gpu``, ``--cpu``, ``--memory``, ``--pcie`` and ``--threads`` (the ``parts`` a command
    takes), with :data:`MACHINE_HELP`'s words unless ``helps`` replaces a part's, ``notes``
    appended and ``prefix`` before each; the old spellings of :data:`RENAMED` refused."""
    for part in parts:
        text = (helps or {}).get(part, MACHINE_HELP[part])
        kw: dict = {"help": prefix + text + (notes or {}).get(part, "")}
        if part in required:
            kw["required"] = True
        if defaults and part in defaults:
            kw["default"] = defaults[part]
        if part == "threads":
            kw["type"] = threads_type
        s.add_argument(f"--{part}", **kw)
        for old in RENAMED.get(part, ()):
            renamed(s, old, f"--{part}")
