"""``cope export``: render the chosen policy for a runtime (a CLI plugin, see PLUGINS in main.py).

    cope export --trace T --calibration C --profile P (-K K | --vram-gib G) [--threads N]
                [--candidate ID|best]
                --format FORMAT [-o OUT [--force]] [--strict]
    cope export --from-policy FILE --format ... [-o OUT [--force]] [--strict]
    cope export --from-verify FILE [-K K] [--threads N] --format ... [-o OUT [--force]]

FORMAT is one of ``cope_core.export.FORMATS``; the choices, the command's help and its list of
formats all come from the records of ``cope_core.export.EXPORT_FORMATS``.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import parquet_io
from ..errors import CopeInputError
from ..export import (
    EXPORT_FORMATS,
    FORMATS,
    across_cards_file,
    build_policy,
    epilog,
    get_format,
    read_policy,
    render,
)
from ..files import check_writable, sha256_file, write_atomic
from ..llamacpp import is_bench_record, read_bench_record
from ..platforms import resolve_platform
from ..verify import read_verify
from . import cards
from .args import (
    add_llamacpp_options,
    add_machine_options,
    add_model_options,
    add_request_options,
    priced_as_model,
    refitted,
    request_settings,
)

#: Options that describe how to build a policy; --from-policy takes none of them.
_BUILD_OPTIONS = (("--trace", "trace"), ("--profile", "profile"), ("--calibration", "calibration"),
                  ("--experts-per-layer", "k"), ("--vram-gib", "vram_gib"),
                  ("--threads", "threads"), ("--gpu-share", "gpu_share"),
                  ("--spec", "spec"), ("--model", "model"), ("--quant", "quant"),
                  ("--fill-by-id", "fill_by_id"))


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "export", help="export a chosen policy: " + ", ".join(FORMATS),
        description="Render the chosen policy in the form a runtime takes, and say what that "
                    "runtime cannot express.",
        epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--trace", help="evaluated routing trace (cope.trace/1)")
    s.add_argument("--profile", help="profile of the target (cope.profile/1)")
    s.add_argument("--calibration", help="trace whose popularity fills the resident experts")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--experts-per-layer", "-K", type=int, dest="k", help="cache size K")
    g.add_argument("--vram-gib", type=float, help="VRAM budget; K follows from the memory model")
    add_machine_options(s, ("threads",), threads_type=int,
                        helps={"threads": "operating point (default: the most threads)"})
    s.add_argument("--gpu-share", type=float,
                   help="GPU share of the operating point (default: the largest at those threads)")
    s.add_argument("--candidate", default="best", help="candidate id, or 'best' (default)")
    s.add_argument("--fill-by-id", action="store_true", help="fill residency by expert id")
    s.add_argument("--spec", help="platform for the roofline estimator: GPU name or JSON file")
    add_model_options(s, what="price the trace's routing as this model (e.g. the quantised GGUF "
                              "you run); its bytes size the memory notes")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--from-policy", metavar="FILE", help="re-render a saved cope.policy/1 JSON")
    src.add_argument("--from-verify", metavar="FILE",
                     help="render the verified winner of a cope verify record (cope.verify/1); "
                          "-K and --threads choose the cell when it has several, and the "
                          "record's trace, calibration and profile are used unless given")
    s.add_argument("--format", required=True, choices=FORMATS,
                   help="output format: the cope.policy/1 JSON or a runtime's settings (the "
                        "list below)")
    s.add_argument("-o", "--output", help="write here instead of stdout (" + "; ".join(
        f"{f.name}: the {f.side_file.suffix} goes next to it" for f in EXPORT_FORMATS
        if f.side_file) + ", and the flags are printed)")
    s.add_argument("--exl3-bits", type=float, metavar="BPW",
                   help="exllamav3: the model's bits per weight (config.json "
                        "quantization_config.bits), to size its experts in VRAM and RAM")
    add_llamacpp_options(s)
    add_request_options(s)
    cards.add_option(s)
    s.add_argument("--force", action="store_true", help="overwrite existing files")
    s.add_argument("--strict", action="store_true",
                   help="fail (exit 2) when the runtime cannot run exactly the chosen candidate")
    s.set_defaults(func=cmd_export)


def _from_bench_verify(args: argparse.Namespace) -> int:
    """A ``cope verify --llama-bench`` record: its verified configuration's llama-server line."""
    if args.format != "llama.cpp":
        raise CopeInputError("a llama-bench verify record verifies a llama.cpp configuration: "
                             "use --format llama.cpp", field="--format")
    import json
    record = read_bench_record(json.loads(Path(args.from_verify).read_text()), args.from_verify)
    v = record["verified"]
    text = (f"# verified by cope verify --llama-bench: {v['name']} at {v['measured_ts']:.2f} "
            f"tok/s measured ({record['stop']} after {record['rounds']} rounds)\n"
            f"{v['command']}\n")
    if args.output is None:
        sys.stdout.write(text)
        return 0
    check_writable(args.output, overwrite=args.force)
    write_atomic(args.output, text.encode(), overwrite=args.force)
    print(f"wrote {args.output}")
    return 0


def _from_verify(args: argparse.Namespace):
    """The policy of a verify record's verified winner (one of its cells)."""
    if args.candidate != "best" or args.vram_gib is not None:
        raise CopeInputError("renders the record's verified winner; drop --candidate and "
                             "--vram-gib (-K and --threads choose the cell)",
                             field="--from-verify")
    record = read_verify(args.from_verify)
    cell = record.cell(args.k, args.threads)
    paths = {}
    for role in ("trace", "profile", "calibration"):
        given = getattr(args, role)
        saved = (record.inputs.get(role) or {}).get("path")
        if saved and not os.path.isabs(saved):       # relative to the record's folder
            beside = os.path.join(os.path.dirname(os.path.abspath(args.from_verify)), saved)
            saved = beside if os.path.exists(beside) else saved
        paths[role] = given or saved
        if paths[role] is None and role != "calibration":
            raise CopeInputError(f"the record names no {role} file: give --{role}",
                                 source=args.from_verify, field=f"inputs.{role}")
    trace = parquet_io.read_trace(str(paths["trace"]))
    profile = refitted(args, parquet_io.read_profile(str(paths["profile"])))
    cal = parquet_io.read_trace(str(paths["calibration"])) if paths["calibration"] else None
    verified = {"path": args.from_verify, "sha256": sha256_file(args.from_verify),
                "measured_us": cell.measured_us,
                "measured_ci_us": [cell.measured_lo_us, cell.measured_hi_us],
                "predicted_winner": cell.predicted_winner, "stop": cell.stop,
                "remaining": cell.remaining}
    return build_policy(trace, profile, cal, experts_per_layer=cell.K,
                        cpu_threads=cell.cpu_threads,
                        gpu_share=cell.gpu_share if args.gpu_share is None else args.gpu_share,
                        candidate=cell.verified_winner, fill_by_id=args.fill_by_id,
                        spec=resolve_platform(args.spec) if args.spec else None,
                        verified=verified)


def _policy(args: argparse.Namespace):
    if args.from_verify:
        return _from_verify(args)
    if args.from_policy:
        given = [flag for flag, dest in _BUILD_OPTIONS if getattr(args, dest) not in (None, False)]
        if args.candidate != "best":
            given.append("--candidate")
        if given:
            raise CopeInputError(f"re-renders a saved policy as it is; drop {' '.join(given)}",
                                 field="--from-policy")
        return read_policy(args.from_policy)
    missing = [flag for flag, dest in (("--trace", "trace"), ("--profile", "profile"))
               if getattr(args, dest) is None]
    if args.k is None and args.vram_gib is None:
        missing.append("--experts-per-layer/-K or --vram-gib")
    if missing:
        raise CopeInputError(f"cope export: missing {', '.join(missing)} (or give --from-policy "
                             "FILE)")
    trace = parquet_io.read_trace(args.trace)
    profile = refitted(args, parquet_io.read_profile(args.profile))
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    spec = resolve_platform(args.spec) if args.spec else None
    trace, cal = priced_as_model(args, trace, cal)
    return build_policy(trace, profile, cal, experts_per_layer=args.k, vram_gib=args.vram_gib,
                        cpu_threads=args.threads, gpu_share=args.gpu_share,
                        candidate=args.candidate,
                        fill_by_id=args.fill_by_id, spec=spec, **request_settings(args))


def cmd_export(args: argparse.Namespace) -> int:
    if args.from_verify and is_bench_record(args.from_verify):
        return _from_bench_verify(args)
    out = args.output
    spec = get_format(args.format)
    side_file = spec.side_file
    suffix = side_file.suffix if side_file else None
    side_options: dict[str, Any] = {}
    if side_file is not None:
        if not out:
            raise CopeInputError(f"the {args.format} format writes a {side_file.what} file: give "
                                 f"-o OUT (the {suffix} goes next to it)", field="--output")
        side_options = spec.side_options(side_file.stem_of(out))   # the app names it alike
    if args.exl3_bits is not None and not 1.0 <= args.exl3_bits <= 16.0:
        raise CopeInputError(f"expected bits per weight in [1, 16], got {args.exl3_bits:g}",
                             field="--exl3-bits")
    policy = _policy(args)
    r = render(policy, args.format, strict=args.strict, exl3_bits=args.exl3_bits,
               **side_options)
    if getattr(args, "more_gpus", None):
        if args.format != "llama.cpp":
            raise CopeInputError("places llama.cpp across the cards: --format llama.cpp",
                                 field="--more-gpus")
        if args.trace is None or args.profile is None:
            raise CopeInputError("needs the trace and profile the answer is made from "
                                 "(--trace, --profile)", field="--more-gpus")
        trace = parquet_io.read_trace(args.trace)
        d = cards.cards_answer(args, policy.model,
                               refitted(args, parquet_io.read_profile(args.profile)),
                               threads=policy.cpu_threads,
                               context=float(trace.context.mean()), vram_gib=args.vram_gib)
        assert d is not None
        r = replace(r, text=across_cards_file(r.text, d), command=d.flags().command())
    if not r.exact:
        warnings.warn(r.summary, stacklevel=2)
    if out is None:
        sys.stdout.write(r.text)
        return 0
    targets = list(r.files)
    if not (suffix and out.endswith(suffix)):
        targets.append((out, r.text.encode()))
    for path, _ in targets:  # refuse before writing anything
        check_writable(path, overwrite=args.force)
    for path, data in targets:
        write_atomic(path, data, overwrite=args.force)
    runs = "" if r.exact else f" (runs {r.deployed or 'a setting outside the matrix'} instead)"
    for path, _ in targets:  # these formats print their flags on stdout: the notes go to stderr
        print(f"wrote {path}: {args.format} for {policy.candidate} at K = "
              f"{policy.experts_per_layer}{runs}",
              file=sys.stderr if suffix else sys.stdout)
    if suffix:
        sys.stdout.write(r.text)
    return 0
