"""Argument types and checks shared by the sub-commands."""
from __future__ import annotations

import argparse
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from ..errors import CopeInputError
from ..files import check_writable
from ..geometry import DEFAULT_CONTEXT
from ..llamacpp import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    FIT_MARGIN,
    LATEST_BUILD,
    Build,
    LlamaSettings,
    Request,
    llama_settings,
    parse_build,
    read_prompt_refit,
)
from ..machine import Machine, compose_machine
from ..matrix import get_candidate

T = TypeVar("T")


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


def settings_from_args(record: Callable[..., T], args: argparse.Namespace,
                       fields: Mapping[str, str], percent: tuple[str, ...] = ()) -> T:
    """``record`` (a settings dataclass) with each field that ``fields`` maps a flag's dest to
    set from that flag where it was given; a flag left out (None) keeps the record's default, so
    the default is written once, in the record. A dest in ``percent`` is in percent, its field a
    fraction."""
    kw = {}
    for dest, field in fields.items():
        value = getattr(args, dest, None)
        if value is not None:
            kw[field] = value / 100.0 if dest in percent else value
    return record(**kw)


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


def model_from_args(args: argparse.Namespace, quant: str | None = None):
    """The geometry ``--model``/``--quant`` name (None without --model); ``quant``, given,
    prices it as that preset in place of ``--quant`` (a command's own choice, e.g. cope advise's
    published preset, kept out of ``args``)."""
    from ..models import resolve_model
    if getattr(args, "model", None) is None:
        if getattr(args, "quant", None):
            raise CopeInputError("needs --model", field="--quant")
        return None
    return resolve_model(args.model, quant or args.quant)


# --- the input files --------------------------------------------------------------------------
#: What the recurring input files are; a command adds its own note or replaces a file's words.
INPUT_HELP: dict[str, str] = {
    "trace": "evaluated routing trace (cope.trace/1)",
    "profile": "profile of the target platform (cope.profile/2 or /1)",
    "calibration": "trace whose popularity fills the cache",
}


def add_input_options(s: argparse.ArgumentParser | argparse._ArgumentGroup,
                      inputs: tuple[str, ...] = tuple(INPUT_HELP), *,
                      required: tuple[str, ...] = (), helps: dict[str, str] | None = None,
                      notes: dict[str, str] | None = None) -> None:
    """``--trace``, ``--profile`` and ``--calibration`` (the ``inputs`` a command reads, in the
    order given), with :data:`INPUT_HELP`'s words unless ``helps`` replaces a file's, ``notes``
    appended."""
    for name in inputs:
        text = (helps or {}).get(name, INPUT_HELP[name]) + (notes or {}).get(name, "")
        s.add_argument(f"--{name}", required=name in required, help=text)


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
#: Spellings earlier versions took for a machine's part or a llama.cpp option (by its name here),
#: each refused in one line that names the new one.
RENAMED: dict[str, tuple[str, ...]] = {"pcie": ("--link",), "threads": ("--cpu-threads",),
                                       "ctx": ("--context",)}


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


def add_probe_option(s: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--probe-seconds``, how long the memory probe of 'this' runs; left out, compose_machine's
    own default (said in the help from its signature, the one place it is written)."""
    default = inspect.signature(compose_machine).parameters["probe_seconds"].default
    s.add_argument("--probe-seconds", type=float,
                   help=f"how long the memory probe of 'this' runs (default {default:g})")


def machine_from_args(args: argparse.Namespace, **given: Any) -> Machine:
    """The machine :func:`add_machine_options`' flags name
    (:func:`cope_core.machine.compose_machine`).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed flags; a part whose flag the command does not take is None, and so is
        ``--probe-seconds`` left out (:func:`add_probe_option`: compose_machine's default).
    **given
        A part's value in place of its flag's, by the part's name (:data:`MACHINE_PARTS`): a
        command's own fallback (``cpu=args.cpu or DEFAULT_CPU``), or ``threads=None`` where
        ``--threads`` is the operating point and not the machine's.
    """
    unknown = set(given) - set(MACHINE_PARTS)
    if unknown:
        raise TypeError(f"machine_from_args: no machine part {sorted(unknown)}")
    part: dict[str, Any] = {p: given[p] if p in given else getattr(args, p, None)
                            for p in MACHINE_PARTS}
    probe = getattr(args, "probe_seconds", None)
    return compose_machine(gpu=part["gpu"], cpu=part["cpu"], memory=part["memory"],
                           link=part["pcie"], threads=part["threads"],
                           **({} if probe is None else {"probe_seconds": probe}))


# --- how llama.cpp is run ---------------------------------------------------------------------
#: llama.cpp's run options, by name: spellings, type, metavar and words, ``{default}`` where the
#: default goes (:func:`llamacpp_defaults`).
LLAMACPP_OPTIONS: dict[str, tuple[tuple[str, ...], type, str, str]] = {
    "ctx": (("--ctx",), int, "N",
            "llama.cpp's context (-c): its KV cache on the GPU (default {default})"),
    "cache-type-k": (("-ctk", "--cache-type-k"), str, "TYPE",
                     "llama.cpp's K cache type (-ctk: f16, q8_0, ...; default {default})"),
    "cache-type-v": (("-ctv", "--cache-type-v"), str, "TYPE",
                     "llama.cpp's V cache type (-ctv; default {default})"),
    "fitt": (("--fitt",), int, "MIB",
             "llama.cpp's --fit margin (-fitt, MiB kept free; default {default})"),
    "llamacpp": (("--llamacpp",), str, "BUILD",
                 "the llama.cpp build you run: b10500, 10500, v1.1.1, the line "
                 "`llama-server --version` prints, 'latest' (default: the newest build whose "
                 "flags COPE knows) or 'this' (asks the llama-server on PATH); the search, the "
                 "flags and the default compared are that build's "
                 "(docs/design.md#llamacpp-builds)"),
    "ubatch-size": (("-ub", "--ubatch-size"), int, "N",
                    "llama.cpp's physical batch (-ub): the compute buffer is reserved for this "
                    "many tokens (default {default})"),
    "batch-size": (("-b", "--batch-size"), int, "N",
                   "llama.cpp's logical batch (-b): the physical one is at most it "
                   "(default {default})"),
    "no-op-offload": (("--no-op-offload",), bool, "",
                      "llama.cpp's --no-op-offload: host weights are not copied to the GPU for "
                      "batches of 32 tokens or more, so the compute buffer holds no copy"),
    "ram-gib": (("--ram-gib",), float, "GIB",
            "the host's memory in GiB: the request's search then also prices --no-mmap, whose "
            "host experts stay pinned (a faster prompt) and must fit in it beside 4 GiB for "
            "the rest (default: not given, --no-mmap is not priced)"),
}


def llamacpp_defaults() -> dict[str, int | str | None]:
    """Each option's default in its flag's unit (``--fitt`` in MiB): the context is
    :data:`cope_core.geometry.DEFAULT_CONTEXT`, the rest :class:`LlamaSettings`' and --fit's
    (the host memory: None, not known unless given)."""
    d = LlamaSettings()
    return {"ctx": DEFAULT_CONTEXT, "cache-type-k": d.type_k, "cache-type-v": d.type_v,
            "fitt": FIT_MARGIN >> 20, "llamacpp": LATEST_BUILD, "ubatch-size": d.n_ubatch,
            "batch-size": d.n_batch, "no-op-offload": not d.op_offload, "ram-gib": None}


def add_request_options(s: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--prompt-tokens`` and ``--gen-tokens``: the request llama.cpp's answer is ranked by
    (defaults :data:`~cope_core.llamacpp.answer.request.DEFAULT_PROMPT_TOKENS` and
    ``DEFAULT_GEN_TOKENS``, a chat turn); :func:`request_from_args` reads them back."""
    s.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS, metavar="P",
                   help="tokens in the prompt: llama.cpp's answer is ranked by the time to the "
                        "first token plus the answer's decode, with -ub searched beside the "
                        f"placement (default {DEFAULT_PROMPT_TOKENS}; 0: rank by decode alone)")
    s.add_argument("--gen-tokens", type=int, default=DEFAULT_GEN_TOKENS, metavar="G",
                   help=f"tokens in the answer (default {DEFAULT_GEN_TOKENS})")
    s.add_argument("--prompt-refit", metavar="FILE",
                   help="the prompt rates refitted from your own llama-bench prompt rows "
                        "(cope evaluate --llama-bench ... --refit FILE), for this GPU")


def refitted(args: argparse.Namespace, target: Any) -> Any:
    """``target`` (a :class:`Machine` or a profile) with ``--prompt-refit``'s rates on its
    platform spec; as it is when none is given or it has no spec."""
    path = getattr(args, "prompt_refit", None)
    if path is None:
        return target
    if isinstance(target, Machine):
        if target.spec is None:
            raise CopeInputError("prices offload prompts: a CPU-only machine has none",
                                 field="--prompt-refit")
        return replace(target, spec=read_prompt_refit(path, target.spec))
    spec = (target.platform or {}).get("spec")
    if not isinstance(spec, dict):
        raise CopeInputError("the profile has no platform spec to refit (an analytic profile "
                             "has one)", field="--prompt-refit")
    from ..platforms import PlatformSpec
    new = read_prompt_refit(path, PlatformSpec.from_dict(spec))
    return replace(target, platform={**target.platform, "spec": new.to_dict()})


def request_from_args(args: argparse.Namespace) -> Request | None:
    """The request :func:`add_request_options` names (None: ``--prompt-tokens 0``, decode
    alone)."""
    return None if args.prompt_tokens == 0 else Request(args.prompt_tokens, args.gen_tokens)


def request_settings(args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp's settings and the request (``--prompt-tokens``, ``--gen-tokens``) for its
    record: the context grows to hold the request's tokens."""
    llama, request = llama_settings_from_args(args), request_from_args(args)
    if request is not None:
        llama = replace(llama, n_ctx=request.context_for(llama.n_ctx))
    return {"llama": llama, "request": request}


def add_llamacpp_options(s: argparse.ArgumentParser | argparse._ArgumentGroup,
                         options: tuple[str, ...] = tuple(LLAMACPP_OPTIONS), *,
                         helps: dict[str, str] | None = None) -> None:
    """How llama.cpp is run, for its memory: ``--ctx``, ``-ctk/--cache-type-k``,
    ``-ctv/--cache-type-v`` and ``--fitt`` (the ``options`` a command takes), with
    :data:`LLAMACPP_OPTIONS`' words unless ``helps`` replaces an option's; the old spellings of
    :data:`RENAMED` refused. :func:`llama_settings_from_args` reads them back."""
    defaults = llamacpp_defaults()
    for name in options:
        flags, kind, metavar, text = LLAMACPP_OPTIONS[name]
        text = (helps or {}).get(name, text).format(default=defaults[name])
        if kind is bool:
            s.add_argument(*flags, action="store_true", help=text)
        else:
            s.add_argument(*flags, type=kind, default=defaults[name], metavar=metavar,
                           help=text)
        for old in RENAMED.get(name, ()):
            renamed(s, old, flags[-1])


def llama_settings_from_args(args: argparse.Namespace) -> LlamaSettings:
    """The options of :func:`add_llamacpp_options` (``--fitt``'s default where a command does
    not take it), with --model's GGUF tensor table when --model names a GGUF file (else the
    table is made from the priced geometry)."""
    model = getattr(args, "model", None)
    gguf = model if model and os.path.isfile(model) and model.lower().endswith(".gguf") \
        else None
    fitt = getattr(args, "fitt", None)
    if fitt is not None and fitt < 0:
        raise CopeInputError(f"expected MiB >= 0, got {fitt}", field="--fitt")
    d = LlamaSettings()
    return llama_settings(gguf, n_ctx=args.ctx,
                          margin_bytes=FIT_MARGIN if fitt is None else fitt << 20,
                          type_k=args.cache_type_k, type_v=args.cache_type_v,
                          build=llamacpp_build(args),
                          n_ubatch=getattr(args, "ubatch_size", d.n_ubatch),
                          n_batch=getattr(args, "batch_size", d.n_batch),
                          op_offload=not getattr(args, "no_op_offload", False),
                          host_ram_gib=getattr(args, "ram_gib", None))


def llamacpp_build(args: argparse.Namespace) -> Build:
    """The build ``--llamacpp`` names (the newest known where a command does not take it; an
    empty name is refused, not read as the default)."""
    given = getattr(args, "llamacpp", None)
    return parse_build(LATEST_BUILD if given is None else given)
