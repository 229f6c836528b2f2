"""vLLM flags for a policy: the closest weight-offloading setting, and why it is not the policy.

vLLM offloads whole parameter tensors, not experts: with ``--offload-backend uva``,
``--cpu-offload-gb G`` and ``--cpu-offload-params experts`` it walks the decoder layers in order
and moves each MoE layer's expert tensors (``w13_weight``, then ``w2_weight``, each holding all
``E`` experts) to pinned host memory until ``G`` GiB are offloaded; the GPU then reads the routed
experts' weights of those layers over the link at every token (zero-copy). Nothing runs on the
CPU and nothing is cached, so no Policy Matrix candidate is expressible (GPU zero-copy reads of
host memory are outside the matrix, docs/design.md#the-policy-matrix).

Read in the vllm 0.33.0 wheel (``vllm/config/offload.py``, ``vllm/engine/arg_utils.py``,
``vllm/model_executor/offloader/uva.py``) and dated with the 0.16.0 and 0.17.0 wheels: the three
flags first appear in **vLLM 0.17.0** (``--cpu-offload-params`` from PR
vllm-project/vllm#34535); ``--cpu-offload-gb`` is GiB **per GPU**; ``--cpu-offload-params`` takes
space-separated name segments (``experts`` also matches quantized ``*_scale`` parameters, not
``shared_experts``). The tests parse the emitted flags with vLLM's own ``EngineArgs``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..geometry import GIB, MIB
from ..matrix import LAYER_PARTITION
from ..placement import describe_blocks
from .common import Rendered, gap_line, gap_summary, header, ms, whole_layer_equivalent
from .policy import Policy


@dataclass(frozen=True)
class VllmOffload:
    """The closest vLLM setting and what it does.

    Attributes
    ----------
    cpu_offload_gb : float
        GiB to offload: the experts that do not fit ``K`` slots per layer, rounded up to 0.01.
    needed_bytes : int
        ``(E - K) * L * expert_bytes``.
    offloaded_bytes : int
        What vLLM's parameter walk offloads for that setting (whole tensors, so at least that).
    full_layers : int
        MoE layers, from the first, whose expert tensors are all offloaded.
    partial_w13 : bool
        Whether the next layer's ``w13_weight`` (gate and up, 2/3 of its experts' bytes) is too.
    """

    cpu_offload_gb: float
    needed_bytes: int
    offloaded_bytes: int
    full_layers: int
    partial_w13: bool


def vllm_offload(policy: Policy) -> VllmOffload:
    g = policy.model
    L, E, K = g.n_layers, g.n_experts, policy.experts_per_layer
    needed = (E - K) * g.per_k_bytes
    gb = math.ceil(needed / GIB * 100) / 100
    limit = int(gb * GIB)  # vLLM's byte limit from --cpu-offload-gb
    # per layer, w13 = E x 2I x H and w2 = E x H x I, at the bytes each layer stores them in
    done, full, partial = 0, 0, False
    for l in range(L):
        if g.expert_layers:
            x = g.expert_layers[l]
            w13, w2 = E * (x.gate_bytes + x.up_bytes), E * x.down_bytes
        else:
            w13, w2 = 2 * E * g.layer_expert_bytes[l] // 3, E * g.layer_expert_bytes[l] // 3
        if done >= limit:
            break
        done += w13
        if done >= limit:
            partial = True
            break
        done += w2
        full += 1
    return VllmOffload(gb, needed, done, full, partial)


def render_vllm(policy: Policy) -> Rendered:
    g = policy.model
    L, E, K = g.n_layers, g.n_experts, policy.experts_per_layer
    off = vllm_offload(policy)
    plan = policy.layer_plan
    lines = header(policy, "vLLM")
    if off.needed_bytes == 0:  # K = E: nothing to offload
        exact = whole_layer_equivalent(policy)
        summary = "" if exact else (
            f"vLLM cannot express {policy.candidate}: it has no expert prefetching; with K = E "
            f"every expert is resident anyway, as in {LAYER_PARTITION}; "
            + gap_summary(policy, LAYER_PARTITION))
        lines += ["# K = E: every expert fits the VRAM budget and stays resident; no offloading "
                  "flag is needed."]
        if not exact:
            lines += [f"# vLLM CANNOT express {policy.candidate}'s prefetching; it runs every "
                      "expert resident:", gap_line(policy, LAYER_PARTITION)]
        lines.append("vllm serve MODEL")
        return Rendered("vllm", "\n".join(lines) + "\n", exact=exact,
                        deployed=None if exact else LAYER_PARTITION, summary=summary)
    lines += [
        f"# vLLM CANNOT express {policy.candidate}, nor any Policy Matrix candidate: it offloads "
        "whole parameter tensors (per layer and parameter),",
        "# not experts, and its GPU reads offloaded weights over the link (UVA zero-copy) instead "
        "of computing misses on the CPU or caching experts.",
    ]
    blocks = tuple(range(g.dense_layers, g.dense_layers + off.full_layers))
    partial = f" and the w13_weight of block {g.dense_layers + off.full_layers}"
    where = describe_blocks(blocks) + (partial if off.partial_w13 else "")
    layers_equiv = off.offloaded_bytes / (E * g.expert_bytes)
    lines += [
        f"# closest setting: offload the experts that do not fit K = {K} slots per layer: "
        f"(E-K)*L = {(E - K) * L} experts x {g.expert_bytes / MIB:g} MiB "
        f"= {off.needed_bytes / GIB:.3f} GiB -> --cpu-offload-gb {off.cpu_offload_gb:.2f}",
        f"# vLLM then moves the expert tensors of the first MoE layers to pinned host memory: "
        f"{where} ({off.offloaded_bytes / GIB:.3f} GiB);",
        "# the routed experts of those layers are read from host memory over the link at every "
        "token, all others stay in VRAM.",
        "# COPE has no prediction for that mechanism (outside the matrix). The nearest matrix "
        f"candidate, {LAYER_PARTITION} at the same VRAM",
        f"# ({plan.n_gpu} of {L} MoE layers on the GPU, the rest computed on the CPU):",
        gap_line(policy, LAYER_PARTITION),
    ]
    link = (policy.platform.get("spec") or {}).get("link_bandwidth")
    if isinstance(link, (int, float)) and link > 0:
        floor = layers_equiv * g.top_k * g.expert_bytes / link * 1e6
        lines.append(f"# link-time floor of the zero-copy reads (roofline, not a COPE prediction): "
                     f"{layers_equiv:.2f} layers x {g.top_k} experts x "
                     f"{g.expert_bytes / MIB:g} MiB / {link / 1e9:g} GB/s = {ms(floor)} per token")
    lines += [
        "# (--offload-backend prefetch with --offload-params experts copies whole layers ahead of "
        "use instead: also outside the matrix.)",
        "# needs vLLM >= 0.17.0; --cpu-offload-gb is GiB per GPU (COPE's budget is one GPU's)",
        f"vllm serve MODEL --offload-backend uva --cpu-offload-gb {off.cpu_offload_gb:.2f} "
        "--cpu-offload-params experts",
    ]
    summary = (f"vLLM cannot express {policy.candidate}: it offloads whole expert tensors of the "
               f"first MoE layers ({where}) and reads them over the link, outside the Policy "
               f"Matrix; nearest matrix candidate {LAYER_PARTITION} is predicted at "
               f"{ms(policy.cope_us(LAYER_PARTITION))}/token against {ms(policy.cope_us())}")
    return Rendered("vllm", "\n".join(lines) + "\n", exact=False, summary=summary)
