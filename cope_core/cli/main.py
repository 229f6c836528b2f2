"""``cope``: the command-line face of the pipeline (trace -> profile -> replay -> estimate).

Every user mistake ends in one ``cope: error: ...`` line and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence

from ..errors import CopeInputError
from ..estimate.costs import ESTIMATORS
from . import cache_report, commands, llamabench_cmd
from .args import (
    add_input_options,
    add_llamacpp_options,
    add_machine_options,
    add_model_options,
    candidate_list,
    k_arg,
    layers,
    share,
)

#: Modules of this package that add sub-commands: each has ``register(subparsers)``. Every
#: sub-command, these and the ones built here, sets ``func`` (``parser.set_defaults(func=...)``)
#: to a function of ``args`` that returns the exit status.
PLUGINS: tuple[str, ...] = ("export_cmd", "trace_cmd", "app_cmd", "measure_cmd", "compare_cmd",
                            "contention_cmd", "verify_cmd", "parts_cmd", "advise_cmd")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one CopeInputError line, like every other one,
    and takes every flag only as spelled: no prefix matching (``--gpu`` must never be read as
    ``--gpu-share``, nor an error name a flag the user did not type). Sub-command parsers are of
    this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        raise CopeInputError(f"{self.prog}: {message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cope", description=(
        "COPE Explorer: predict which MoE offloading policy is fastest on a model and machine."))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("matrix", help="print the Policy Matrix")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=commands.cmd_matrix)

    s = sub.add_parser("models", help="list the built-in model catalog, or show what a model "
                                      "file says (--show)")
    s.add_argument("--show", metavar="FILE",
                   help="a GGUF file, model folder or config.json: print the geometry read "
                        "from it (a GGUF's header and tensor table; never the weights)")
    s.add_argument("--quant", metavar="PRESET",
                   help="with --show on an HF config: price it as this llama-quantize preset")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=commands.cmd_models)

    s = sub.add_parser("vram", help="convert a VRAM budget to experts per layer (K) and back")
    add_model_options(s, required=True)
    g = s.add_mutually_exclusive_group(required=False)
    g.add_argument("--gib", type=float, help="VRAM budget in GiB (one of --gib, "
                   "--experts-per-layer, or --gpu with --n-cpu-moe)")
    g.add_argument("--experts-per-layer", type=int, dest="k",
                   help="experts per layer K (prints the VRAM it needs)")
    add_llamacpp_options(s, ("ctx",), helps={"ctx": "KV-cache tokens (default {default})"})
    s.add_argument("--workspace-gib", type=float, default=0.5,
                   help="VRAM kept free for activations and the runtime (default 0.5)")
    s.add_argument("--n-cpu-moe", type=int, metavar="N",
                   help="with --gib: llama.cpp's own count of -ngl 99 --n-cpu-moe N (the token "
                        "embedding in host memory, the KV cache at --ctx, the compute "
                        "buffer); refused with how much it is over")
    s.add_argument("--gpu", help="with --n-cpu-moe: several cards, comma-separated (catalog "
                                 "names or part files, in device order): each card's count "
                                 "under llama.cpp's layer split, refused when any card is over "
                                 "(its memory, all free, is the budget; --gib is not given)")
    s.add_argument("--tensor-split", "-ts", metavar="A,B,...",
                   help="with --gpu: llama.cpp's -ts, one value per card (default: the split "
                        "by each card's free memory)")
    add_llamacpp_options(s, ("cache-type-k", "cache-type-v", "ubatch-size", "batch-size",
                             "no-op-offload"), helps={
        "cache-type-k": "with --n-cpu-moe: llama.cpp's K cache type (default {default})",
        "cache-type-v": "with --n-cpu-moe: llama.cpp's V cache type (default {default})",
        "ubatch-size": "with --n-cpu-moe: llama.cpp's physical batch (-ub), which sizes its "
                       "compute buffer (default {default})",
        "batch-size": "with --n-cpu-moe: llama.cpp's logical batch (-b; default {default})"})
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=commands.cmd_vram)

    s = sub.add_parser("synth", help="write a synthetic routing trace")
    add_model_options(s, what="the model (required unless --fit gives the geometry)")
    s.add_argument("--layers", type=layers, help="keep only the first N MoE layers")
    s.add_argument("--prompts", type=int, help="required unless --fit (default: the trace's)")
    s.add_argument("--tokens", type=int,
                   help="decode tokens per prompt; required unless --fit (default: its mean)")
    s.add_argument("--seed", type=int, required=True,
                   help="random seed (the same seed writes the same trace)")
    s.add_argument("--first-prompt", type=int, default=0,
                   help="id of the first prompt (default 0); a calibration trace of the same "
                        "synthetic model keeps --seed and starts after the evaluated prompts")
    s.add_argument("--skew", type=float, help="power-law exponent of popularity (default 1.0)")
    s.add_argument("--reuse", type=float, help="token-to-token reuse probability (default 0.5)")
    s.add_argument("--predictor-accuracy",
                   help="next-layer prediction recall in [0, 1], or 'none' (default 0.7)")
    s.add_argument("--fit", metavar="TRACE",
                   help="estimate skew, reuse (and predictor accuracy) from this real trace")
    s.add_argument("--description", default="", help="free text stored in the trace metadata")
    s.add_argument("-o", "--output", required=True, help="Parquet file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing file")
    s.set_defaults(func=commands.cmd_synth)

    importlib.import_module(f"{__package__}.profile_cmd").register(sub)

    s = sub.add_parser("predict", help="predict every candidate's TPOT")
    _inputs(s)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--experts-per-layer", "-K", type=k_arg, dest="k",
                   help="an int, a comma list or 'all'")
    g.add_argument("--vram-gib", type=float, help="VRAM budget; K follows from the memory model")
    s.add_argument("--estimator", default="cope", choices=ESTIMATORS,
                   help="cope: profiled whole-layer schedules (default); atomic: composed "
                        "operator costs; hrm: roofline")
    s.add_argument("--candidates", type=candidate_list,
                   help="comma list of candidate ids (default: all 13)")
    s.add_argument("--fill-by-id", action="store_true", help="fill residency by expert id")
    _draw_options(s)
    s.add_argument("--raw-samples", metavar="JSON",
                   help="raw profile samples (from cope profile --raw-samples): draw the "
                        "profile's spread from them instead of its median and IQR")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    cache_report.add_options(s)
    s.set_defaults(func=commands.cmd_predict)

    s = sub.add_parser("evaluate", help="compare predictions with measurements")
    _inputs(s, required=False)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--measurements",
                   help="measured TPOT (cope.measurements/1, from cope measure)")
    g.add_argument("--llama-bench", metavar="FILE",
                   help="llama-bench's results (-o json, jsonl, csv or md) of --model FILE.gguf "
                        "on this machine: each decode row matched to its placement and predicted "
                        "(no --trace; --profile or --gpu)")
    llamabench_cmd.add_options(s)
    _draw_options(s)
    s.add_argument("--per-k", action="store_true",
                   help="also compare winners per cache size (TPOT averaged over prompts)")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=commands.cmd_evaluate)

    for name in PLUGINS:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return p


def _draw_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--draws", type=int, default=1000,
                   help="bootstrap draws of the prompts and the profile's spread for intervals "
                        "and win probabilities (default 1000; 0 turns it off)")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the bootstrap draws (default 0)")


def _inputs(s: argparse.ArgumentParser, required: bool = True) -> None:
    add_input_options(s, required=("trace", "profile") if required else ())
    add_machine_options(s, ("threads",), threads_type=int,
                        helps={"threads": "operating point (default: the most threads)"})
    s.add_argument("--gpu-share", type=share,
                   help="operating point's GPU share, %% (default: the largest the profile has)")
    s.add_argument("--spec", help="platform for the roofline estimator: GPU name or JSON file")
    add_model_options(s, what="price the trace's routing as this model (e.g. the quantised GGUF "
                              "you run; same MoE layers, experts and top-k)")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code = args.func(args)
        seen = set()
        for w in caught:
            text = " ".join(str(w.message).split())
            if issubclass(w.category, UserWarning) and text not in seen:
                seen.add(text)
                print(f"cope: warning: {text}", file=sys.stderr)
        return code
    except CopeInputError as exc:
        print(f"cope: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:
        print(f"cope: error: {getattr(exc, 'filename', '') or ''}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
