"""SGLang-KT (kvcache-ai's SGLang fork, ``pip install sglang-kt``) flags and expert-location file.

Read in kvcache-ai/sglang at 04653fa88f5ce4ea83632c4ad436343db6bc8324 (2026-07-15; the same code
in the sglang-kt 0.7.2 wheel):

* ``python/sglang/srt/eplb/expert_location.py``, ``compute_initial_expert_location_metadata``:
  ``--init-expert-location X.pt`` is ``torch.load(X, weights_only=True)`` and must be a dict
  with ``physical_to_logical_map`` or ``logical_count`` (a bare tensor fails ``in`` with a
  RuntimeError); with ``--kt-weight-path`` set, ``logical_count`` is left to the KT layer.
* ``python/sglang/srt/layers/moe/kt_ep_wrapper.py``, ``_init_kt_gpu_experts_masks``: under
  ``--kt-expert-placement-strategy frequency`` it takes ``logical_count``, requires 3 dims
  ``[buffer_size, num_layers, num_experts]`` with ``num_layers = num_hidden_layers`` (dense
  prefix included), sums dim 0 and puts on the GPU the ``--kt-num-gpu-experts`` x (MoE layers)
  experts with the highest scores over all layers at once (kt-kernel's
  ``generate_gpu_experts_masks``, a global top-k); ``--kt-gpu-experts-ratio R`` instead takes
  ``int(R * MoE layers * E)`` experts.
* Its default (``cope advise``'s baseline): ``server_args.py`` l. 729-730 leave both counts
  None; then ``_init_kt_gpu_experts_masks`` (``kt_ep_wrapper.py`` l. 1918-1944) logs "Either
  kt_num_gpu_experts or kt_gpu_experts_ratio is required but not set." and returns None,
  ``create_kt_config_from_server_args`` (l. 2108-2110) returns None, the ``kt_ep`` wrapper's
  predicate (l. 3335-3336, registered l. 3346-3348) does not match, and
  ``maybe_wrap_moe_quant_method`` (``layers/moe/quant_method_registry.py`` l. 62-66, called by
  ``FusedMoE``, ``layers/moe/fused_moe_triton/layer.py`` l. 294) keeps SGLang's own GPU method:
  every expert on the GPU, so it loads only when the whole model fits. The wrapper registers
  itself when ``models/deepseek_v4.py`` imports it (l. 47), and the model registry imports every
  module of ``sglang.srt.models`` (``models/registry.py`` l. 95-103, 131), so it is there for
  every model. The sglang-kt 0.7.2 wheel (``pip download sglang-kt==0.7.2``) takes the same path
  at other lines: ``server_args.py`` l. 883-884, ``kt_ep_wrapper.py`` l. 4615, 4780-4782,
  6318-6332.

So ``{"logical_count": T[1, blocks, E]}`` with exactly ``K`` ones per MoE row selects exactly the
fixed fill. The other experts run on the CPU concurrently with the GPU hits: the runtime's
execution is ``parallel``, and its residency never changes during decode.
"""
from __future__ import annotations

import io
import shlex

from ..matrix import LAYER_PARTITION, Execution, Residency, candidate_id, get_candidate
from .common import Rendered, gap_line, gap_summary, header, host_ram_line
from .policy import Policy

DEPLOYED = candidate_id(Residency.FIXED, Execution.PARALLEL)
DEFAULT_PT = "cope-expert-location.pt"


def expert_location(policy: Policy):
    """Float32 tensor ``[dense_layers + L, E]``: 1.0 exactly at the GPU-resident experts.

    For ``layer_partition`` the GPU layers' rows are all ones; otherwise each MoE layer's row
    has ones at its ``K`` fill experts.
    """
    import torch  # only this format needs torch
    g = policy.model
    t = torch.zeros((g.dense_layers + g.n_layers, g.n_experts), dtype=torch.float32)
    if policy.candidate == LAYER_PARTITION:
        for block in policy.layer_plan.gpu_blocks:
            t[block, :] = 1.0
    else:
        for layer, row in enumerate(policy.resident_experts):
            if row:
                t[g.dense_layers + layer, list(row)] = 1.0
    return t


def expert_location_file(t):
    """What ``--init-expert-location`` loads: the activation counts SGLang-KT's recorder writes,
    ``{"logical_count": [buffer_size = 1, num_hidden_layers, E]}``."""
    return {"logical_count": t.unsqueeze(0)}


def _count_flags(policy: Policy) -> str:
    """How many experts the runtime puts on the GPU, so that its top-k picks exactly the ones."""
    g = policy.model
    L, E, K = g.n_layers, g.n_experts, policy.experts_per_layer
    if policy.candidate != LAYER_PARTITION:
        return f"--kt-num-gpu-experts {K}"
    total = policy.layer_plan.n_gpu * E
    if total == K * L:
        return f"--kt-num-gpu-experts {K}"
    # The runtime takes int(L*E*ratio) experts; half an expert above the target survives any
    # rounding of the decimal text and the product, and never reaches the next whole expert.
    ratio = 1.0 if total == L * E else (total + 0.5) / (L * E)
    return f"--kt-gpu-experts-ratio {ratio!r}"


def kt_method(policy: Policy) -> tuple[str, str]:
    """The ``--kt-method`` whose CPU kernel the profile priced, and why.

    kt-kernel's inference methods (kvcache-ai/ktransformers 95009ea, ``kt-kernel/python/
    experts.py`` ``INFERENCE_METHODS``) include ``BF16`` (native BF16 MoE), ``LLAMAFILE`` (GGUF
    experts), ``FP8`` and ``MXFP4``; sglang-kt's default is ``AMXINT4`` (``server_args.py``), a
    4-bit AMX kernel no COPE profile prices."""
    g = policy.model
    if g.stored:
        types = {t for x in g.expert_layers for t, _ in x.projections()}
        if types == {"MXFP4"}:
            return "MXFP4", "the experts are MXFP4"
        return "LLAMAFILE", f"the experts are GGUF ({g.format_name}), priced per stored type"
    if g.dtype_bytes == 2:
        return "BF16", "the profile priced 16-bit experts (BF16 native MoE kernel)"
    return "FP8" if g.dtype_bytes == 1 else "BF16", f"the experts are {g.format_name}"


def gpu_experts(policy: Policy) -> int:
    """How many ones :func:`expert_location` holds (the GPU-resident experts, all layers)."""
    if policy.candidate == LAYER_PARTITION:
        return len(policy.layer_plan.gpu_blocks) * policy.model.n_experts
    return sum(len(row) for row in policy.resident_experts)


def render_sglang_kt(policy: Policy, pt_path: str = DEFAULT_PT, with_files: bool = True
                     ) -> Rendered:
    """The flags and, unless ``with_files`` is False (the text alone: no torch), the
    expert-location file they name."""
    cand = get_candidate(policy.candidate)
    g = policy.model
    files: tuple[tuple[str, bytes], ...] = ()
    if with_files:
        import torch  # only this format's file needs torch
        buf = io.BytesIO()
        torch.save(expert_location_file(expert_location(policy)), buf)
        files = ((pt_path, buf.getvalue()),)
    exact = policy.candidate in (DEPLOYED, LAYER_PARTITION)
    lines = header(policy, "SGLang-KT")
    summary = ""
    if cand.residency is Residency.FIXED and not exact:
        summary = (f"SGLang-KT cannot express {policy.candidate}: it keeps the fixed fill but runs "
                   f"every miss on the CPU alongside the GPU hits, i.e. {DEPLOYED}; "
                   + gap_summary(policy, DEPLOYED))
        lines += [
            f"# SGLang-KT CANNOT express the execution '{policy.execution}': the resident "
            "experts below are exact, but the runtime",
            "# computes every miss on the CPU concurrently with the GPU hits, so it runs "
            f"{DEPLOYED}.",
            gap_line(policy, DEPLOYED),
        ]
    elif cand.residency is not None and cand.residency.mutable:
        need = ("prefetch, while layer l runs, the first predicted expert of layer l+1 that is not "
                "resident into layer l+1's K slots, evicting that layer's least recently used")
        if cand.residency is Residency.MUTABLE_CROSS_LAYER:
            need = ("share one pool of K*L slots among all layers and prefetch, while layer l "
                    "runs, the first predicted expert of layer l+1, evicting the least recently "
                    "used expert of any layer but l")
        summary = (f"SGLang-KT cannot express {policy.candidate}: its GPU experts are fixed during "
                   f"decode; it runs the same initial fill as {DEPLOYED}; "
                   + gap_summary(policy, DEPLOYED))
        lines += [
            f"# SGLang-KT CANNOT express {policy.candidate}. It would need, at every decode token, "
            "a next-layer expert prediction and to",
            f"# {need}.",
            "# SGLang-KT's GPU experts stay fixed during decode (--kt-enable-dynamic-expert-update "
            "only re-places them from routing",
            "# statistics at long prefills), so below is the same initial fill, run as "
            f"{DEPLOYED} (misses on the CPU).",
            gap_line(policy, DEPLOYED),
        ]
    if policy.candidate == LAYER_PARTITION:
        plan = policy.layer_plan
        lines.append(f"# layer partition as a per-expert mask: every expert of the last "
                     f"{plan.n_gpu} of {g.n_layers} MoE layers on the GPU, the first {plan.n_cpu} "
                     "layers on the CPU")
    dense = ("" if not g.dense_layers else " (dense-prefix row 0 all zero)" if g.dense_layers == 1
             else f" (dense-prefix rows 0-{g.dense_layers - 1} all zero)")
    method, why = kt_method(policy)
    lines += [
        f"# --kt-method {method}: {why}; sglang-kt's default AMXINT4 would run a 4-bit AMX "
        "kernel the profile did not price (re-profile before using it)",
        host_ram_line(policy, g.n_layers * g.n_experts,
                      "kt-kernel loads every routed expert into host RAM, the GPU-resident ones "
                      "too (kvcache-ai/ktransformers#2084)"),
        f"# {pt_path}: {{'logical_count': float32 [1, {g.dense_layers + g.n_layers} blocks, "
        f"{g.n_experts} experts]}}, 1.0 at the {gpu_experts(policy)} GPU experts, 0.0 "
        f"elsewhere{dense}",
        "# do not add --kt-enable-dynamic-expert-update: it would change the placement.",
        f"python -m sglang.launch_server --model-path MODEL --kt-weight-path KT_WEIGHTS "
        f"--kt-method {method} --kt-cpuinfer {policy.cpu_threads} {_count_flags(policy)} "
        f"--kt-expert-placement-strategy frequency --init-expert-location {shlex.quote(pt_path)}",
    ]
    text = "\n".join(lines) + "\n"
    return Rendered("sglang-kt", text, files=files, exact=exact,
                    deployed=None if exact else DEPLOYED, summary=summary)
