"""One function per ``cope`` sub-command: parse nothing, call the library, print the result."""
from __future__ import annotations

import argparse
import sys
from typing import Any

import pandas as pd

from .. import parquet_io, parts
from ..errors import CopeInputError
from ..estimate.evaluate import evaluate
from ..estimate.predict import predict
from ..estimate.quality import check_lines, checks_to_dict, measurement_checks
from ..estimate.uncertainty import check_draws
from ..files import print_json
from ..geometry import CATALOG, GIB
from ..llamacpp import LlamaFlags, LlamaSettings, device_names, devices_memory, n_cpu_moe_memory
from ..matrix import CANDIDATES, EXECUTIONS, RESIDENCIES, matrix_table
from ..platforms import resolve_platform
from ..profile.busy import busy_note
from ..profile.raw_samples import read_raw_samples
from . import cache_report, cards
from .args import llama_settings_from_args, model_from_args, priced_as_model, refitted
from .report import format_evaluation, format_per_k, format_sweep, format_table, prediction_json


# --- matrix / models / vram ---------------------------------------------------------------------
def cmd_matrix(args: argparse.Namespace) -> int:
    table = matrix_table()
    if args.json:
        print_json(table)
        return 0
    by_cell = {(c["residency"], c["execution"]): c for c in table["candidates"]}
    width = 30
    print("Policy Matrix (residency x execution); * = new candidate exposed by the matrix\n")
    print(" " * 22 + "".join(e.value.ljust(width) for e in EXECUTIONS))
    for r in RESIDENCIES:
        cells = []
        for e in EXECUTIONS:
            c = by_cell[(r.value, e.value)]
            text = "* new" if c["new"] else ", ".join(c["prior_systems"])
            cells.append(text[: width - 2].ljust(width))
        print(r.value.ljust(22) + "".join(cells))
    base = table["baseline"]
    print(f"\nbaseline {base['id']}: {base['description']}")
    print("\nresidency:")
    for r in table["residencies"]:
        print(f"  {r['id']:<20} {r['description']}")
    print("execution:")
    for e in table["executions"]:
        print(f"  {e['id']:<20} {e['description']}")
    print("outside the matrix:")
    for o in table["out_of_scope"]:
        print(f"  - {o}")
    print(f"\n{len(CANDIDATES)} candidates: " + ", ".join(c.id for c in CANDIDATES))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from ..models import read_model_file
    from ..models.describe import describe, preset_mib
    if args.show:
        mf = read_model_file(args.show, args.quant)
        rows = describe(mf.geometry, mf)
        if args.json:
            print_json({"fields": dict(rows), "model": mf.geometry.to_dict()})
            return 0
        width = max(len(k) for k, _ in rows)
        print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
        return 0
    if args.quant:
        raise CopeInputError("applies to --show", field="--quant")
    catalog = [dict(g.to_dict(), expert_mib=g.expert_bytes / 2**20,
                    **{f"mib_{p}": v for p, v in preset_mib(g).items()})
               for g in CATALOG.values()]
    if args.json:
        print_json(catalog)
        return 0
    df = pd.DataFrame(catalog)[["name", "n_layers", "dense_layers", "n_experts", "top_k",
                             "n_shared_experts", "hidden", "expert_intermediate"]
                            + [c for c in catalog[0] if c.startswith("mib_")]]
    df = df.rename(columns=lambda c: c.removeprefix("mib_"))
    print("MiB per routed expert in each llama-quantize preset (mean over layers; '-': the "
          "family's GGUFs keep MXFP4 experts)")
    print(df.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.2f}"))
    return 0


def cmd_vram(args: argparse.Namespace) -> int:
    g = model_from_args(args)
    if args.gpu is not None or args.tensor_split is not None:
        return _vram_devices(args, g)
    if args.gib is None and args.k is None:
        raise CopeInputError("needs --gib, --experts-per-layer, or --gpu with --n-cpu-moe",
                             field="vram")
    if args.n_cpu_moe is not None:
        return _vram_llamacpp(args, g)
    if not (args.workspace_gib >= 0 and args.workspace_gib < float("inf")):
        raise CopeInputError(f"expected a finite size >= 0, got {args.workspace_gib}",
                             field="--workspace-gib")
    ws = int(args.workspace_gib * GIB)
    if args.gib is not None:
        k = g.experts_per_layer_for_vram(args.gib * GIB, context=args.ctx, workspace_bytes=ws)
        gib = args.gib
    else:
        k = args.k
        gib = g.vram_for_experts_per_layer(k, context=args.ctx, workspace_bytes=ws) / GIB
    need = g.vram_for_experts_per_layer(k, context=args.ctx, workspace_bytes=ws) / GIB
    out = {"model": g.name, "weights": g.format_name, "vram_gib": gib, "experts_per_layer": k,
           "n_experts": g.n_experts, "vram_needed_gib": need,
           "expert_mib": g.expert_bytes / 2**20, "context": args.ctx,
           "workspace_gib": args.workspace_gib}
    if args.json:
        print_json(out)
    else:
        print(f"{g.name} ({g.format_name}): {gib:.2f} GiB of VRAM holds K = {k} of "
              f"{g.n_experts} experts per layer "
              f"(K = {k} needs {need:.2f} GiB: non-expert weights {g.non_expert_bytes / GIB:.2f}, "
              f"KV cache at {args.ctx} tokens {g.kv_cache_bytes(args.ctx) / GIB:.2f}, "
              f"workspace {args.workspace_gib:.2f}, "
              f"experts {k * g.per_k_bytes / GIB:.2f})")
    return 0


# --- producing files ----------------------------------------------------------------------------
def cmd_synth(args: argparse.Namespace) -> int:
    from ..trace.synth import synthesize_parts
    fit = None
    if args.fit:
        from ..trace.fit import check_fit_input, fit_synth
        real = parquet_io.read_trace(args.fit)
        check_fit_input(real)
        g = model_from_args(args) or real.model
        if (g.n_experts, g.top_k) != (real.model.n_experts, real.model.top_k):
            raise CopeInputError(f"model {g.name} routes top-{g.top_k} of {g.n_experts}, the "
                                 f"fitted trace top-{real.model.top_k} of {real.model.n_experts}",
                                 field="--model")
        fit = fit_synth(real, seed=args.seed)
    elif not args.model or args.prompts is None or args.tokens is None:
        raise CopeInputError("--model, --prompts and --tokens are required without --fit",
                             field="synth")
    else:
        g = model_from_args(args)
    if args.layers is not None:
        g = g.with_layers(args.layers)
    if args.predictor_accuracy is not None:
        acc_text = str(args.predictor_accuracy).lower()
    elif fit is not None:  # a trace without predictions fits to none
        acc_text = "none" if fit.predictor_accuracy is None else str(fit.predictor_accuracy)
    else:
        acc_text = "0.7"
    try:
        acc = None if acc_text == "none" else float(acc_text)
    except ValueError:
        raise CopeInputError(f"expected a number in [0, 1] or 'none', got {acc_text!r}",
                             field="--predictor-accuracy") from None
    skew = args.skew if args.skew is not None else (fit.skew if fit else 1.0)
    reuse = args.reuse if args.reuse is not None else (fit.reuse if fit else 0.5)
    # without --fit both were required above
    prompts = args.prompts if args.prompts is not None or fit is None else fit.prompts
    tokens = args.tokens if args.tokens is not None or fit is None else fit.tokens
    desc = args.description
    if fit is not None:
        desc = f"{desc.strip()}; fitted to {args.fit}: {fit.describe()}".lstrip("; ")
    # written in parts of whole prompts, so memory stays bounded whatever the trace's size
    parts = synthesize_parts(g, prompts=prompts, tokens=tokens, seed=args.seed, skew=skew,
                             reuse=reuse, predictor_accuracy=acc, description=desc,
                             first_prompt=args.first_prompt)
    parquet_io.write_trace_parts(parts, args.output, overwrite=args.force)
    print(f"wrote {args.output}: SYNTHETIC trace, {g.name} geometry ({g.n_layers} MoE layers, "
          f"top-{g.top_k} of {g.n_experts}), {prompts} prompts x {tokens} tokens, "
          f"seed {args.seed}")
    if fit is not None:
        print(f"  {fit.describe()}")
        print("  K         " + " ".join(f"{k:>6d}" for k in fit.ks))
        print("  real hit  " + " ".join(f"{h:6.3f}" for h in fit.real_hit_rate))
        print("  synth hit " + " ".join(f"{h:6.3f}" for h in fit.synth_hit_rate))
    return 0


def _vram_llamacpp(args: argparse.Namespace, g) -> int:
    """``cope vram --n-cpu-moe N --gib G``: llama.cpp's own count of that placement."""
    if args.gib is None:
        raise CopeInputError("needs --gib (the VRAM the placement must fit)", field="--n-cpu-moe")
    llama = llama_settings_from_args(args)     # --fit's own margin: vram takes no --fitt
    mem = n_cpu_moe_memory(g, args.n_cpu_moe, args.gib, llama)
    out = {"model": g.name, "weights": g.format_name, "vram_gib": args.gib,
           "n_cpu_moe": args.n_cpu_moe, "context": args.ctx,
           "cache_types": [args.cache_type_k, args.cache_type_v], "fits": True,
           "gpu_gib": mem.total / GIB, "weights_gib": mem.model / GIB,
           "kv_cache_gib": mem.context / GIB, "compute_gib": mem.compute / GIB,
           "ubatch": llama.n_ubatch, "batch": llama.n_batch, "op_offload": llama.op_offload}
    if args.json:
        print_json(out)
    else:
        d = LlamaSettings()
        flags = LlamaFlags(n_gpu_layers=99, n_cpu_moe=args.n_cpu_moe,
                           n_batch=None if llama.n_batch == d.n_batch else llama.n_batch,
                           n_ubatch=None if llama.n_ubatch == d.n_ubatch else llama.n_ubatch,
                           op_offload=llama.op_offload).text()
        print(f"{g.name} ({g.format_name}): {flags} fits "
              f"{args.gib:g} GiB: llama.cpp counts {mem.total / GIB:.2f} GiB on the GPU "
              f"(weights {mem.model / GIB:.2f} without the token embedding, KV cache "
              f"{mem.context / GIB:.2f} at -c {args.ctx}, compute buffer "
              f"{mem.compute / GIB:.2f}), {(args.gib * GIB - mem.total) / GIB:.2f} GiB left")
    return 0


def _vram_devices(args: argparse.Namespace, g) -> int:
    """``cope vram --gpu a,b [-ts ...] --n-cpu-moe N``: each card's count under llama.cpp's
    layer split (:func:`cope_core.llamacpp.devices_memory`)."""
    if args.gpu is None:
        raise CopeInputError("needs --gpu with the cards it splits", field="--tensor-split")
    if args.n_cpu_moe is None or args.gib is not None or args.k is not None:
        raise CopeInputError("takes --n-cpu-moe N, and no --gib or --experts-per-layer (each "
                             "card's memory is its budget)", field="--gpu")
    cards = [parts.gpu_part(x) for x in args.gpu.split(",")]
    ts = None
    if args.tensor_split is not None:
        try:
            ts = [float(x) for x in args.tensor_split.replace("/", ",").split(",")]
        except ValueError:
            raise CopeInputError(f"expected numbers separated by commas, got "
                                 f"{args.tensor_split!r}", field="--tensor-split") from None
    names = device_names([c.vendor for c in cards])
    llama = llama_settings_from_args(args)
    layout, mem = devices_memory(g, [c.memory_bytes for c in cards],
                                 [f"{n} ({c.name})" for n, c in zip(names, cards)],
                                 n_cpu_moe=args.n_cpu_moe, tensor_split=ts, llama=llama)
    rows: list[dict[str, Any]] = []
    for i, (r, x) in enumerate(zip(layout.ranges(), mem)):
        blocks = [b for b in r if b < g.dense_layers + g.n_layers]
        rows.append({"device": names[i], "gpu": cards[i].name,
                     "blocks": [blocks[0], blocks[-1]] if blocks else [],
                     "host_expert_blocks": sum(b in layout.host_blocks for b in blocks),
                     "gib": x.total / GIB, "weights_gib": x.model / GIB,
                     "kv_cache_gib": x.context / GIB, "compute_gib": x.compute / GIB,
                     "card_gib": cards[i].memory_bytes / GIB})
    if args.json:
        print_json({"model": g.name, "weights": g.format_name, "n_cpu_moe": args.n_cpu_moe,
                    "tensor_split": list(layout.counts), "context": args.ctx, "fits": True,
                    "devices": rows})
        return 0
    print(f"{g.name} ({g.format_name}): -ngl 99 --n-cpu-moe {args.n_cpu_moe} split -ts "
          f"{','.join(str(c) for c in layout.counts)} fits every card:")
    for row in rows:
        span = "-".join(str(b) for b in row["blocks"]) or "none"
        print(f"  {row['device']} {row['gpu']}: blocks {span}, {row['host_expert_blocks']} "
              f"with experts in host memory; {row['gib']:.2f} of {row['card_gib']:.2f} GiB "
              f"(weights {row['weights_gib']:.2f}, KV {row['kv_cache_gib']:.2f}, compute "
              f"{row['compute_gib']:.2f})")
    return 0


# --- predicting ---------------------------------------------------------------------------------
def _load(args: argparse.Namespace):
    trace = parquet_io.read_trace(args.trace)
    profile = refitted(args, parquet_io.read_profile(args.profile))
    if (note := busy_note(profile.platform)) is not None:
        print(f"warning: {args.profile}: {note}", file=sys.stderr)
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    spec = resolve_platform(args.spec) if args.spec else None
    trace, cal = priced_as_model(args, trace, cal)
    return trace, profile, cal, spec


def _ks(args: argparse.Namespace, trace) -> list[int]:
    g = trace.model
    if getattr(args, "vram_gib", None) is not None:
        return [g.experts_per_layer_for_vram(args.vram_gib * GIB)]
    if args.k == "all":
        return list(range(g.n_experts + 1))
    return [int(x) for x in args.k.split(",") if x.strip()]


def cmd_predict(args: argparse.Namespace) -> int:
    trace, profile, cal, spec = _load(args)
    ks = _ks(args, trace)
    raw = read_raw_samples(args.raw_samples) if args.raw_samples else None
    df = predict(trace, profile, ks, calibration=cal, cpu_threads=args.threads,
                 gpu_share=args.gpu_share, estimator=args.estimator, candidates=args.candidates,
                 fill_by_id=args.fill_by_id, spec=spec,
                 draws=check_draws(args.draws), seed=args.seed, raw_samples=raw)
    rec = cache_report.cache_search(args, trace, profile, cal, df, ks, raw)
    threads = int(df.attrs["cpu_threads"])
    answer = cache_report.answer_of(rec, trace, ks[0], threads)     # made once, rendered twice
    several = cards.cards_answer(args, trace.model, profile, threads=threads,
                                 context=float(trace.context.mean()), vram_gib=args.vram_gib)
    if args.json:
        print_json(prediction_json(df) + cache_report.json_rows(rec, answer, trace, ks[0],
                                                                 threads)
                   + ([] if several is None else [{"runtime": "llama.cpp",
                                                   "label": "several GPUs",
                                                   "devices": several.to_dict()}]))
        return 0
    g = trace.model
    kind = ("ANALYTIC (what-if from published specs, not measured)" if profile.analytic
            else "MEASURED")
    print(f"trace {args.trace}: {trace.source.upper()} {g.name}, {trace.n_prompts} prompts, "
          f"{trace.n_tokens} tokens | profile: {kind}, {profile.platform.get('gpu', '?')} | "
          f"cpu_threads={df.attrs['cpu_threads']} gpu_share={df.attrs['gpu_share']:g} | "
          f"estimator {args.estimator}")
    if args.vram_gib is not None:
        print(f"VRAM budget {args.vram_gib:g} GiB -> K = {ks[0]} experts per layer")
    if len(ks) == 1:
        print(format_table(df))
    else:
        print(format_sweep(df))
    print("\n".join(cache_report.text_lines(rec, answer, trace, args.explain)))
    if several is not None:
        print("\n" + "\n".join(several.lines()))
    return 0


# --- evaluating ---------------------------------------------------------------------------------
def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.llama_bench is not None:
        from .llamabench_cmd import cmd_llama_bench
        return cmd_llama_bench(args)
    from .llamabench_cmd import MACHINE_ONLY
    for part in MACHINE_ONLY:
        if getattr(args, part, None) is not None:
            raise CopeInputError("names the machine of --llama-bench; with --measurements the "
                                 "profile is the machine", field=f"--{part}")
    for flag in ("trace", "profile"):
        if getattr(args, flag) is None:
            raise CopeInputError("is required with --measurements", field=f"--{flag}")
    trace, profile, cal, spec = _load(args)
    meas = parquet_io.read_measurements(args.measurements)
    per_k = getattr(args, "per_k", False)
    scores = evaluate(trace, profile, meas, cal, spec=spec, cpu_threads=args.threads,
                      gpu_share=args.gpu_share, draws=check_draws(args.draws), seed=args.seed)
    result: dict[str, Any] = {est: ev.to_dict(per_k) for est, ev in scores.items()}
    if "hrm" not in scores:
        result["hrm"] = None
        print("cope: warning: no platform spec in the profile and no --spec: HRM not evaluated",
              file=sys.stderr)
    checks = measurement_checks(meas, seed=args.seed)
    if args.json:
        print_json({**result, "measurement_quality": checks_to_dict(checks)})
        return 0
    print(format_evaluation(result))
    if per_k:
        print(format_per_k(result))
    print("\n".join(check_lines(checks)))
    return 0
