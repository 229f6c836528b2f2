"""SGLang-KT (kvcache-ai's SGLang fork, ``pip install sglang-kt``) flags and expert-location file.

Read in the sglang-kt **0.7.2** wheel from PyPI (``pip download sglang-kt==0.7.2 --no-deps``) and
the kt-kernel **0.7.2** wheel it pins (``Requires-Dist: kt-kernel==0.7.2``); paths are the
wheels'. The wheel is not the code of any commit of the kvcache-ai/sglang mirror readable here:
its ``server_args.py`` (6999 lines) and ``layers/moe/kt_ep_wrapper.py`` (6331) are in no commit of
any branch (their git blob hashes are absent). Main's head 04653fa88f5ce4ea83632c4ad436343db6bc8324
(2026-07-15) has a 3348-line ``kt_ep_wrapper.py`` but the same ``--kt-*`` argument block,
``_init_kt_gpu_experts_masks`` and ``eplb/expert_location.py`` (byte-identical) as the wheel:

* ``server_args.py`` l. 5260-5337, ``ServerArgs.add_cli_args``: ``--kt-weight-path`` (str),
  ``--kt-method`` (str, default ``AMXINT4``, no choices), ``--kt-cpuinfer`` (int),
  ``--kt-num-gpu-experts`` (int, per MoE layer), ``--kt-gpu-experts-ratio`` (float, overrides the
  count), ``--kt-enable-dynamic-expert-update`` (switch), ``--kt-expert-placement-strategy``
  (choices ``frequency``/``front-loading``/``uniform``/``random``, default ``uniform``, l. 889);
  ``--init-expert-location`` (str, default ``trivial``) l. 5007-5012.
* ``eplb/expert_location.py`` l. 564-616, ``compute_initial_expert_location_metadata``:
  ``--init-expert-location X.pt`` is ``torch.load(X, weights_only=True)`` (l. 577) and must be a
  dict with ``physical_to_logical_map`` or ``logical_count`` (a bare tensor fails ``in`` with a
  RuntimeError); with ``--kt-weight-path`` set (``_should_use_trivial_mapping_for_kt``, l. 534)
  the mapping stays trivial and ``logical_count`` is left to the KT layer (l. 593-605).
* ``layers/moe/kt_ep_wrapper.py`` l. 4510-4755, ``_init_kt_gpu_experts_masks``: MoE layers are
  the blocks ``i >= first_k_dense_replace`` with ``i % moe_layer_freq == 0`` (l. 4571-4574);
  ``--kt-num-gpu-experts K`` means ``K`` x (MoE layers) experts (l. 4608), ``--kt-gpu-experts-ratio
  R`` ``int(R * MoE layers * E)`` (l. 4592); under ``frequency`` it loads ``logical_count``
  (l. 4631-4642), requires 3 dims ``[buffer_size, num_layers, num_experts]`` with ``num_layers =
  num_hidden_layers`` (dense prefix included, l. 4644-4659), sums dim 0 (l. 4661) and calls
  kt-kernel's ``generate_gpu_experts_masks`` (l. 4677; ``kt_kernel/experts_base.py`` l. 162-213, a
  ``torch.topk`` over all layers at once, l. 204), then puts every expert of the dense blocks on
  the GPU (l. 4678-4681). ``--kt-enable-dynamic-expert-update`` acts only in the full-GPU
  fallback of long prefills (l. 5855-5861).
* ``--kt-method`` goes to kt-kernel's ``KTMoEWrapper`` unchanged (l. 5363-5369), which accepts
  only ``INFERENCE_METHODS`` (``kt_kernel/experts.py`` l. 33-50, l. 206-210).
* Host RAM (the export's host-RAM line): kt-kernel loads every routed expert, the GPU-resident
  ones too (kvcache-ai/ktransformers#2084): ``BF16``/``FP8``/``MXFP4`` run ``NativeMoEWrapper``
  (``kt_kernel/experts.py`` l. 346-363), whose ``load_weights`` (``utils/amx.py`` l. 760-797)
  takes the loader's ``load_experts`` of the whole layer (``BF16SafeTensorLoader``,
  ``utils/loader.py`` l. 631-656: every expert id); ``LLAMAFILE`` reads the whole
  ``ffn_*_exps`` GGUF tensors (``utils/llamafile.py`` l. 192-196).
* Its default (``cope advise``'s baseline): ``server_args.py`` l. 883-884 leave both counts
  None; then ``_init_kt_gpu_experts_masks`` logs "Either kt_num_gpu_experts or
  kt_gpu_experts_ratio is required but not set." and returns None (l. 4615-4616),
  ``create_kt_config_from_server_args`` returns None (l. 4780-4782), the ``kt_ep`` wrapper's
  predicate (l. 6318-6319, registered l. 6329-6331) does not match, and
  ``maybe_wrap_moe_quant_method`` (``layers/moe/quant_method_registry.py`` l. 62-65, called by
  ``FusedMoE``, ``layers/moe/fused_moe_triton/layer.py`` l. 301) keeps SGLang's own GPU method:
  every expert on the GPU, so it loads only when the whole model fits. The wrapper registers
  itself when ``models/deepseek_v4.py`` imports it (l. 47), and the model registry imports every
  module of ``sglang.srt.models`` (``models/registry.py`` l. 93-103, 131), so it is there for
  every model. (04653fa takes the same path: ``server_args.py`` l. 729-730, ``kt_ep_wrapper.py``
  l. 1918-1944, 2108-2110, 3335-3348.)

So ``{"logical_count": T[1, blocks, E]}`` with exactly ``K`` ones per MoE row selects exactly the
fixed fill (tests/test_sglang_kt.py runs the wheels' parser and these functions from their
source on the exported line and file). The other experts run on the CPU concurrently with the
GPU hits: the runtime's execution is ``parallel``, and its residency never changes during decode.
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

    kt-kernel 0.7.2's inference methods (``kt_kernel/experts.py`` l. 33-50, ``INFERENCE_METHODS``)
    include ``BF16`` (native BF16 MoE), ``LLAMAFILE`` (GGUF experts), ``FP8`` and ``MXFP4``;
    sglang-kt 0.7.2's default is ``AMXINT4`` (``server_args.py`` l. 5268), a 4-bit AMX kernel no
    COPE profile prices."""
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
