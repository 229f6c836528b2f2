r"""ik_llama.cpp flags for a policy: the same GGUF placement as llama.cpp, under its own flags.

Read in ikawrakow/ik_llama.cpp at 8337e4cd3861406fc04e0854b1409cd1b027fbc9 (2026-08-15):

* ``common/common.cpp``: ``-ncmoe N`` / ``-cmoe`` only set ``params.ncmoe``; ``-ot`` is split at
  commas, then at the first ``=`` (``parse_buft_overrides``); ``--fit`` is a boolean (no value,
  no ``-fit`` alias), and any argument no branch knows is ``error: unknown argument`` (exit 1),
  so mainline's ``-fit off`` does not parse there.
* ``src/llama-load-tensors.cpp`` (PR ikawrakow/ik_llama.cpp#2262, commit da2293ded, 2026-08-07):
  on one GPU ``-ncmoe N`` puts the experts of the **last** N blocks that hold experts on the CPU
  (scanning down from the last block, MTP layers left out), where mainline takes the first N;
  user ``-ot`` entries come before ``-ncmoe``'s and ``std::regex_search`` takes the first match;
  ``--fit`` refuses ``-ot`` and ``-ncmoe``. ``-ngl`` defaults to 999 with a GPU.
* Its default (``cope advise``'s baseline, :data:`cope_core.export.formats.EXPORT_FORMATS`):
  ``common/common.h`` l. 303, 306, 308: ``n_gpu_layers = -1``, ``ncmoe = 0``, ``fit = false``;
  ``common/common.cpp`` l. 4247-4248 (``common_model_params_to_llama``) passes ``-ngl`` on only
  when given, and ``src/llama.cpp`` l. 7756-7760 (``llama_model_load_from_file``) turns -1 into
  999 when a GPU is found (0 without one, which also drops ``-ot`` and ``-ncmoe``). So with no
  placement flag every layer, experts included, is on the GPU: it loads only when the whole
  model fits. Fused MoE (``fused_moe_up_gate``, l. 425, ``-no-fmoe`` turns it off) and flash
  attention (l. 422) are on by default; neither moves a tensor.

COPE's layer partition keeps the *first* MoE layers on the CPU, so the exact line is an ``-ot``
override of those blocks (ik_llama.cpp's own pattern, ``\.(weight|scale)``); the ``-ncmoe`` line
is ik_llama.cpp's own placement, the last layers, at the number that fits the same VRAM
(:class:`cope_core.placement.LayerFlag` ``IK_LLAMACPP``, docs/design.md#layer-placement). Both
lines are written by the one command builder in its ``ik_llama.cpp`` dialect
(:class:`~cope_core.llamacpp.LlamaFlags`, ``dialect="ik_llama.cpp"``: ``-ngl 999``, ``-ncmoe``,
the pattern and no ``-fit``), where each difference from mainline is cited.
"""
from __future__ import annotations

from dataclasses import replace

from ..llamacpp import LlamaFlags
from ..matrix import LAYER_PARTITION
from ..placement import LayerFlag, describe_blocks, layer_plan
from .common import (
    Rendered,
    gap_line,
    header,
    host_ram_line,
    layer_partition_summary,
    whole_layer_equivalent,
)
from .policy import Policy

#: the runtime's dialect of the command builder
IK = "ik_llama.cpp"


def render_ik_llamacpp(policy: Policy) -> Rendered:
    plan = policy.layer_plan
    g = policy.model
    L = g.n_layers
    exact = whole_layer_equivalent(policy)
    lines = header(policy, "ik_llama.cpp")
    summary = ""
    if not exact:
        summary = layer_partition_summary(
            policy, "ik_llama.cpp cannot express {candidate}: it places expert tensors, never "
                    "single experts")
        lines += [f"# ik_llama.cpp CANNOT express {policy.candidate}: GGUF keeps all experts of a "
                  "layer in one tensor per projection; below, the nearest expressible policy,",
                  f"# {LAYER_PARTITION} at the same VRAM ({plan.n_gpu} GPU layers: the most whose "
                  f"experts fit K's bytes).",
                  gap_line(policy, LAYER_PARTITION)]
    lines += [f"# MoE layers on the CPU: {plan.n_cpu} of {L}, the first ones "
              f"({describe_blocks(plan.cpu_blocks)}); on the GPU: {plan.n_gpu} "
              f"({describe_blocks(plan.gpu_blocks)}); dense prefix: {plan.dense_layers} block(s)",
              host_ram_line(policy, plan.n_cpu * g.n_experts, "the host layers' experts"),
              "# not mainline llama.cpp's flags: there is no -fit here (--fit is a switch, and "
              "refuses -ot and -ncmoe), and -ncmoe N takes the LAST N",
              "# MoE layers (PR ikawrakow/ik_llama.cpp#2262); the exact placement is the "
              "override of the first ones:"]
    # every layer on the GPU (-ngl 999; fit is off there by default: no flag switches it off)
    common = LlamaFlags.placed(plan.n_blocks, policy.cpu_threads, dialect=IK)
    if plan.n_cpu:
        lines.append(replace(common, cpu_blocks=plan.cpu_blocks).command())
        own = layer_plan(g, policy.experts_per_layer, LayerFlag.IK_LLAMACPP.side)
        n = own.flag_value(LayerFlag.IK_LLAMACPP)
        same = ("the same number of layers, priced alike" if n == plan.n_cpu else
                f"{n - plan.n_cpu:+d} against the exact line: those layers store their experts "
                "in other bytes")
        lines += [f"# or ik_llama.cpp's own placement at the same VRAM: the last {n} MoE layers "
                  f"({describe_blocks(own.cpu_blocks)}) on the CPU, {same}",
                  replace(common, n_cpu_moe=n).command()]
    else:
        lines.append(common.command())
    return Rendered("ik_llama.cpp", "\n".join(lines) + "\n", exact=exact,
                    deployed=None if exact else LAYER_PARTITION, summary=summary)
