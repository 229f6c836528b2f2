"""``cope advise``: the command line to paste for a model on a machine, runtime by runtime, in
tokens per second (a CLI plugin, see PLUGINS in main.py; the answer is
:func:`cope_core.export.advising.advise`'s)."""
from __future__ import annotations

import argparse
from pathlib import Path

from .. import parquet_io
from ..errors import CopeInputError
from ..estimate.speed import rate
from ..export import RUNTIMES, Advice, RuntimeAnswer, Speed, request_line
from ..files import check_writable, print_json, write_atomic
from ..geometry import GIB
from ..llamacpp import FIT_MARGIN, prompt_unpriced
from ..machine import THIS
from ..models import published_preset
from .args import (
    add_llamacpp_options,
    add_machine_options,
    add_model_options,
    add_probe_option,
    add_request_options,
    llamacpp_build,
    machine_from_args,
    model_from_args,
    refitted,
    request_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("advise", help="the command to paste for a model on your machine, "
                                      "runtime by runtime, in tokens per second",
                       description="For a model on a machine named by its parts: per runtime "
                                   "(llama.cpp first) the command to paste, its predicted "
                                   "tokens/s with a 95 % interval, the runtime's default and the "
                                   "gain over it, and the Policy Matrix's winner; SYNTHETIC "
                                   "routing and an ANALYTIC profile of the parts unless --trace "
                                   "(docs/cli.md#your-machine-in-one-command-cope-advise).")
    add_model_options(s, required=True)
    add_machine_options(s, ("gpu", "cpu", "memory", "pcie"), required=("gpu", "cpu"))
    s.add_argument("--vram-gib", type=float,
                   help=f"VRAM budget (default: the card's memory less llama.cpp's "
                        f"{FIT_MARGIN / GIB:g} GiB --fit margin)")
    add_machine_options(s, ("threads",), notes={"threads": "; a hybrid part's P-cores"})
    add_llamacpp_options(s, ("ctx", "llamacpp", "ram-gib"),
                         helps={"ctx": "tokens of KV cache the VRAM holds, at least the "
                                       "request's prompt and answer (default {default})"})
    add_request_options(s)
    s.add_argument("--explain", action="store_true",
                   help="also print llama.cpp's search in words: fit's placement, every "
                        "contender, the cache's sizes and readings")
    s.add_argument("--runtime", default="all", choices=(*RUNTIMES, "all"),
                   help="one runtime, or all (default)")
    s.add_argument("--trace", help="a routing trace (cope.trace/1) to price instead of the "
                                   "synthetic one made in memory")
    s.add_argument("--calibration", help="with --trace: the trace whose popularity fills the "
                                         "cache")
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic routing "
                                                       "(default 0)")
    add_probe_option(s)
    s.add_argument("--output-dir", metavar="DIR",
                   help="write the files the commands read (exllamav3's expert statistics, "
                        "SGLang-KT's expert locations) into DIR")
    s.add_argument("--force", action="store_true", help="overwrite files in --output-dir")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=cmd_advise)


def cmd_advise(args: argparse.Namespace) -> int:
    from ..export import advise
    if args.calibration and not args.trace:
        raise CopeInputError("needs --trace", field="--calibration")
    quant, weights = quant_of(args)
    g = model_from_args(args, quant)
    machine = refitted(args, machine_from_args(args))
    trace = parquet_io.read_trace(args.trace) if args.trace else None
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    out = advise(g, machine, runtimes=RUNTIMES if args.runtime == "all" else (args.runtime,),
                 vram_gib=args.vram_gib, context=args.ctx, trace=trace, calibration=cal,
                 seed=args.seed, with_files=args.output_dir is not None,
                 model_file=args.model if str(args.model).lower().endswith(".gguf") else None,
                 weights_source=weights, build=llamacpp_build(args),
                 request=request_from_args(args), host_ram_gib=args.ram_gib,
                 search_threads=args.threads is None)
    written = _write_files(out, args.output_dir, args.force) if args.output_dir else []
    if args.json:
        print_json({**out.to_dict(), "written": written})
        return 0
    print("\n".join(text_lines(out, detected=THIS in {str(args.gpu).lower(),
                                                      str(args.cpu).lower(),
                                                      str(args.memory).lower()},
                                explain=args.explain)))
    for path in written:
        print(f"wrote {path}")
    return 0


def quant_of(args: argparse.Namespace) -> tuple[str | None, str]:
    """The preset the model is priced as and how the weights were chosen (the first line's
    words): ``--quant``, else, for a catalog name, the preset most published GGUFs of it have
    (the file people download, not the checkpoint's 16-bit weights); ``args`` is left as
    parsed."""
    if args.quant is None and (preset := published_preset(args.model)) is not None:
        return preset, ("no --quant: the preset most published GGUFs of it have; --quant to "
                        "price another")
    return args.quant, "as given" if args.quant else "as stored in the file"


def _write_files(out: Advice, folder: str, force: bool) -> list[str]:
    files = [(str(Path(folder) / p), data) for a in out.answers for p, data in a.files]
    for path, _ in files:       # refuse before writing anything
        check_writable(path, overwrite=force)
    Path(folder).mkdir(parents=True, exist_ok=True)
    for path, data in files:
        write_atomic(path, data, overwrite=force)
    return [p for p, _ in files]


def tps(s: Speed) -> str:
    """``154.2 tokens/s [102.2, 213.7] (6.484 ms/token)``."""
    return rate(s.tpot_us, s.tpot_ci_us)


def _gain(x: float | None) -> str:
    return "" if x is None else f"; x{x:.2f} over the default"


def _runtime_lines(a: RuntimeAnswer, explain: bool = False) -> list[str]:
    """One runtime's answer: the command, its build, request and speed, the default's, the
    commands offered beside it and how sure; ``explain`` adds what the answer rests on (the
    nearest policy a runtime runs, every offer, llama.cpp's search in words)."""
    lines = [a.runtime]
    if a.command is None:
        return lines + [f"  {n}" for n in a.notes]
    # the command first (what a user pastes), then which llama.cpp build it is for
    lines += [f"  {a.command}"] + ([f"  {a.build}"] if a.build else [])
    if a.request is not None:
        lines.append(f"  {request_line(a.request)}")
    if a.speed is not None and (a.request is None or explain):
        lines.append(f"  predicted {tps(a.speed)}, runs {a.runs}")
    default = f"{a.default_what}" + ("" if a.default is None else
                                     f": {a.default.tokens_per_s:.1f} tokens/s")
    dr, r = a.default_request, a.request
    gain = _gain(a.gain_over_default) if dr is None or r is None else \
        f", request {dr.request_s:.1f} s" + ("" if r is dr else
                                             f"; x{dr.request_s / r.request_s:.2f} faster request")
    lines.append(f"  default: {default}{gain}")
    for alt in a.alternatives:
        if not explain and not alt.acted_on:      # the answer's kinds say which are acted on
            continue
        speed = "" if alt.speed is None else f": {tps(alt.speed)}"
        note = f" ({alt.note})" if alt.note else ""
        lines.append(f"  {alt.label}: {alt.command}{speed}{note}")
    lines += [f"  note: {n}" for n in (a.detail if explain else ()) + a.notes]
    if explain and a.explain:
        lines += ["  in detail (--explain):"] + [f"    {x}" for x in a.explain]
    return lines


def text_lines(out: Advice, detected: bool = False, explain: bool = False) -> list[str]:
    """What ``cope advise`` prints."""
    g, m = out.model, out.machine
    cpu = m.cpu.name if m.cpu.origin == "catalog" else m.cpu.label
    mem = (f"memory measured at {m.memory.bandwidth / 1e9:.1f} GB/s" if m.memory.measured
           else m.memory.name)
    parts = (f"{cpu}, {mem}, no GPU (CPU only)" if m.cpu_only else
             f"{' + '.join(g.name for g, _ in m.cards)} on "
             f"{', '.join(lk.name for _, lk in m.cards)}, {cpu}, {mem}")
    said = "" if out.weights_source.startswith("as ") else f"; {out.weights_source}"
    lines = [f"{g.name} ({g.format_name}{said}): {g.n_layers} MoE layers, top-{g.top_k} of "
             f"{g.n_experts} experts", f"machine: {parts}; {out.threads} CPU threads"]
    if detected:
        lines += ["", m.describe(), ""]
    if out.vram_gib is not None:
        first = "" if len(m.cards) < 2 else "the first card's "
        lines.append(f"{first}VRAM budget {out.vram_gib:.2f} GiB ({out.vram_source}): K = "
                     f"{out.experts_per_layer} of {g.n_experts} experts per MoE layer with "
                     f"{out.context} tokens of KV cache")
    unpriced = None if m.spec is None else prompt_unpriced(g, m.spec)
    if out.request is not None and not m.cpu_only and unpriced is not None:
        lines.append(f"request: {out.request.describe()} (--prompt-tokens, --gen-tokens) is "
                     f"not priced: {unpriced}; llama.cpp's answer is ranked by decode")
    elif out.request is not None and not m.cpu_only:
        lines.append(f"request: {out.request.describe()} (--prompt-tokens, --gen-tokens): "
                     "llama.cpp's answer is ranked by its time, -ub searched beside the "
                     "placement; prompt processing is priced for llama.cpp only")
    lines += [f"routing: {out.routing}",
              f"costs: {out.costs}; intervals 95 % with the model's measured error", ""]
    for a in out.answers:
        lines += _runtime_lines(a, explain)
        if a.runtime == "llama.cpp" and out.helps:
            lines.append(f"  what would help most (the command's decode, "
                         f"{out.helps[0].base_tokens_per_s:.1f} tokens/s, with one part "
                         "changed):")
            lines += [f"    {u.text()}" for u in out.helps]
    if out.winner is not None:
        name, sp = out.winner
        gain = "" if out.baseline is None else \
            f"; x{out.baseline.tpot_us / sp.tpot_us:.2f} over llama.cpp's default"
        lines += ["", f"Policy Matrix winner (for reference; no runtime runs it unless named "
                      f"above): {name}, {tps(sp)}{gain}"]
    return lines
