"""``cope trace collect|import|predict|sample|stats`` and ``cope predictor train`` (CLI plugin)."""
from __future__ import annotations

import argparse

from .. import parquet_io
from ..errors import CopeInputError
from ..files import print_json
from ..geometry import get_model
from ..llamacpp import CacheVersion
from ..trace.sources.importers import FORMATS
from .args import add_model_options, check_output, layers, priced_as_model


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("trace", help="collect, import, predict and describe routing traces")
    ts = t.add_subparsers(dest="trace_command", required=True, metavar="ACTION")

    s = ts.add_parser("collect", help="record routing by greedy decode of a local HF MoE model")
    s.add_argument("--model", required=True, help="local Hugging Face model folder")
    s.add_argument("--prompts", required=True, help="text file (one prompt a line) or .jsonl")
    s.add_argument("--max-new-tokens", type=int, required=True,
                   help="generated tokens per prompt; the first comes from the prefill")
    s.add_argument("--hidden-states", help="also write MoE-layer inputs to this folder")
    s.add_argument("--hidden-dtype", default="float16", choices=["float16", "float32"],
                   help="dtype of the stored hidden states (default float16)")
    s.add_argument("--predictor", help="predictor file that fills the 'predicted' column")
    s.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    s.add_argument("--device", default="cpu", help="torch device to run the model on (default cpu)")
    s.add_argument("--name", help="model name in the trace (default: the folder name)")
    s.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    s.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-sequence")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.add_argument("--description", default="", help="free text stored in the trace metadata")
    s.add_argument("-o", "--output", required=True, help="file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing output")
    s.set_defaults(func=cmd_collect)

    s = ts.add_parser("import", help="import routing records: JSON lines, numpy, vLLM, SGLang")
    s.add_argument("--format", required=True, choices=list(FORMATS),
                   help="input format (docs/traces.md describes each)")
    s.add_argument("files", nargs="+", help="routing record files to import")
    s.add_argument("--model", required=True, help="catalog model name (geometry)")
    s.add_argument("--layers", type=layers, help="the model's MoE layer count, when it differs")
    s.add_argument("--context-start", type=int, default=0,
                   help="context of token 0 when the records hold none (default 0)")
    s.add_argument("--prompt-tokens", type=int,
                   help="vllm: prompt length of bare .npy arrays (where decode rows start)")
    s.add_argument("-o", "--output", required=True, help="file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing output")
    s.add_argument("--json", action="store_true", help="print the import report as JSON")
    s.set_defaults(func=cmd_import)

    s = ts.add_parser("predict",
                      help="fill 'predicted' from a baseline that needs no hidden states")
    s.add_argument("trace", help="routing trace (cope.trace/1)")
    s.add_argument("--method", required=True, choices=["previous-token", "popularity"],
                   help="previous-token: the previous token's next-layer experts; popularity: "
                        "the most routed ones")
    s.add_argument("--calibration", help="trace whose popularity the baselines use")
    s.add_argument("-o", "--output", required=True, help="file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing output")
    s.set_defaults(func=cmd_predict_trace)

    s = ts.add_parser("sample", help="a uniform sample of a large or sharded trace's prompts")
    s.add_argument("trace", help="routing trace (cope.trace/1 file or a folder of shards)")
    s.add_argument("--prompts", type=int, required=True, help="prompts to keep")
    s.add_argument("--seed", type=int, default=0, help="seed of the reservoir (default 0)")
    s.add_argument("-o", "--output", required=True, help="file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing output")
    s.set_defaults(func=cmd_sample)

    s = ts.add_parser("stats", help="skew, reuse, predictor recall and hit rate vs K")
    s.add_argument("trace", help="routing trace (cope.trace/1)")
    s.add_argument("--calibration", help="trace whose popularity fills the fixed residency")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.add_argument("--llamacpp-log", metavar="LOG",
                   help="a llama-server log with its MoE-cache lines: replay the trace through "
                        "the configuration below and compare slots and decode hit rate")
    s.add_argument("--n-cpu-moe", type=int, help="the server's --n-cpu-moe (blocks, dense "
                                                 "prefix included)")
    s.add_argument("--moe-cache-mib", type=int, help="the server's --moe-cache-mib")
    s.add_argument("--moe-cache-cpu-share", type=float, default=0.0,
                   help="the server's --moe-cache-cpu-share (default 0)")
    s.add_argument("--moe-cache-rule", choices=[v.value for v in CacheVersion],
                   default=CacheVersion.CLASS_LRU.value,
                   help="the build's eviction: " + " or ".join(
                       f"{v.value} ({v.builds})" for v in CacheVersion))
    add_model_options(s, what="price the trace's routing as the model the server ran (its bytes "
                              "as stored size the cache's slots)")
    s.set_defaults(func=cmd_stats)

    p = sub.add_parser("predictor", help="train the next-layer expert predictor")
    ps = p.add_subparsers(dest="predictor_command", required=True, metavar="ACTION")
    s = ps.add_parser("train", help="train on collected hidden states, validate on other prompts")
    s.add_argument("--hidden-states", nargs="+", required=True, metavar="DIR",
                   help="hidden-state folders written by cope trace collect --hidden-states")
    s.add_argument("--epochs", type=int, default=40, help="training epochs (default 40)")
    s.add_argument("--hidden-units", type=int, default=128,
                   help="hidden units of each layer pair's MLP (default 128)")
    s.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    s.add_argument("--val-fraction", type=float, default=0.25,
                   help="share of prompts held out for validation (default 0.25)")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the initial weights and the split (default 0)")
    s.add_argument("--width", type=int, help="ranked ids per prediction (default top_k)")
    s.add_argument("-o", "--output", required=True, help="file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing output")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=cmd_predictor_train)


def cmd_collect(args: argparse.Namespace) -> int:
    from ..trace.sources.collect import collect, load_model, read_prompts
    from ..trace.sources.hidden import HiddenStateWriter
    from ..trace.sources.predictor import load_predictor
    check_output(args.output, args.force)
    if args.hidden_states:
        check_output(args.hidden_states, args.force, folder=True)
    prompts = read_prompts(args.prompts)
    if args.max_new_tokens < 2:
        raise CopeInputError(f"expected >= 2 (the first new token comes from the prefill), got "
                             f"{args.max_new_tokens}", field="--max-new-tokens")
    pred = load_predictor(args.predictor) if args.predictor else None
    lm = load_model(args.model, dtype=args.dtype, device=args.device, name=args.name)
    kw = dict(predictor=pred, stop_at_eos=not args.ignore_eos, chat=args.chat,
              progress=not args.no_progress, description=args.description)
    if args.hidden_states:
        with HiddenStateWriter(args.hidden_states, lm.geometry, overwrite=args.force,
                               dtype=args.hidden_dtype) as w:
            tr = collect(lm, prompts, args.max_new_tokens, hidden_writer=w, **kw)
    else:
        tr = collect(lm, prompts, args.max_new_tokens, **kw)
    parquet_io.write_trace(tr, args.output, overwrite=args.force)
    g = tr.model
    print(f"wrote {args.output}: COLLECTED trace of {args.model} ({g.n_layers} MoE layers, "
          f"top-{g.top_k} of {g.n_experts}), {tr.n_prompts} prompts, {tr.n_tokens} decode tokens"
          + (f"; hidden states in {args.hidden_states}" if args.hidden_states else "")
          + ("; predicted by " + args.predictor if pred is not None else ""))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from ..trace.sources.importers import import_trace
    g = get_model(args.model)
    if args.layers is not None:
        g = g.with_layers(args.layers)
    check_output(args.output, args.force)
    tr, rep = import_trace(args.format, args.files, g, context_start=args.context_start,
                           prompt_tokens=args.prompt_tokens)
    parquet_io.write_trace(tr, args.output, overwrite=args.force)
    if args.json:
        print_json(dict(rep.to_dict(), output=args.output, prompts_kept=tr.n_prompts,
                         tokens=tr.n_tokens))
        return 0
    print(f"wrote {args.output}: IMPORTED trace, {g.name} geometry, {tr.n_prompts} prompts, "
          f"{tr.n_tokens} decode tokens")
    for line in rep.lines():
        print(f"  {line}")
    return 0


def cmd_predict_trace(args: argparse.Namespace) -> int:
    from ..trace.baselines import predict_trace
    check_output(args.output, args.force)
    tr = parquet_io.read_trace(args.trace)
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    out = predict_trace(tr, args.method, cal)
    parquet_io.write_trace(out, args.output, overwrite=args.force)
    print(f"wrote {args.output}: {tr.source} trace with 'predicted' from the {args.method} "
          f"baseline")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    import dataclasses

    from ..trace.sample import reservoir_sample
    check_output(args.output, args.force)
    ids, counts = parquet_io.trace_prompts(args.trace)
    chosen = reservoir_sample([ids], args.prompts, args.seed)
    tr = parquet_io.read_trace(args.trace, prompts=chosen)
    note = (f"sample of {tr.n_prompts} of {len(ids)} prompts (reservoir, seed {args.seed}) "
            f"from {args.trace}")
    desc = f"{tr.description}; {note}" if tr.description else note
    parquet_io.write_trace(dataclasses.replace(tr, description=desc), args.output,
                           overwrite=args.force)
    print(f"wrote {args.output}: {tr.n_prompts} of {len(ids)} prompts ({tr.n_tokens} of "
          f"{int(counts.sum()) // tr.model.n_layers} decode tokens), a uniform reservoir sample "
          f"with seed {args.seed}"
          + ("; the trace has no more prompts, so all are kept" if tr.n_prompts == len(ids)
             else ""))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from ..trace.stats import trace_stats
    tr = parquet_io.read_trace(args.trace)
    cal = parquet_io.read_trace(args.calibration) if args.calibration else None
    if args.llamacpp_log:
        tr, cal = priced_as_model(args, tr, cal)
        return _cache_log(args, tr)
    st = trace_stats(tr, cal)
    if args.json:
        print_json(st.to_dict())
    else:
        print(st.format())
    return 0


def _cache_log(args: argparse.Namespace, tr) -> int:
    from ..llamacpp import CacheConfig, check_cache_log, read_cache_log
    if args.n_cpu_moe is None or args.moe_cache_mib is None:
        raise CopeInputError("give the server's --n-cpu-moe and --moe-cache-mib",
                             field="--llamacpp-log")
    n_cpu = args.n_cpu_moe - tr.model.dense_layers if args.n_cpu_moe else 0
    config = CacheConfig(max(n_cpu, 0), args.moe_cache_mib, args.moe_cache_cpu_share,
                         CacheVersion(args.moe_cache_rule))
    check = check_cache_log(tr, config, read_cache_log(args.llamacpp_log))
    if args.json:
        print_json({"predicted_slots": list(check.predicted_slots),
                     "logged_slots": list(check.logged_slots),
                     "predicted_hit_rate": check.predicted_hit_rate,
                     "logged_hit_rate": check.logged_hit_rate})
    else:
        print("\n".join(check.lines()))
    return 0


def cmd_predictor_train(args: argparse.Namespace) -> int:
    from ..trace.sources.hidden import read_hidden_states
    from ..trace.sources.predictor import train_predictor
    check_output(args.output, args.force)
    for name, v in (("--epochs", args.epochs), ("--hidden-units", args.hidden_units)):
        if v < 1:
            raise CopeInputError(f"expected at least 1, got {v}", field=name)
    sets = [read_hidden_states(p) for p in args.hidden_states]
    pred, res = train_predictor(sets, epochs=args.epochs, hidden_units=args.hidden_units,
                                lr=args.lr, val_fraction=args.val_fraction, seed=args.seed,
                                width=args.width, progress=not args.json)
    pred.save(args.output, overwrite=args.force)
    if args.json:
        print_json(dict(res.to_dict(), output=args.output))
        return 0
    k = pred.model.top_k
    print(f"wrote {args.output}: next-layer predictor, {pred.model.n_layers - 1} layer pairs, "
          f"trained on {res.train_prompts} prompts")
    print(f"held-out top-{k} recall on {res.val_prompts} prompts ({res.val_tokens} tokens): "
          f"predictor {res.recall:.3f} | previous-token {res.recall_previous_token:.3f} | "
          f"popularity {res.recall_popularity:.3f}")
    return 0
