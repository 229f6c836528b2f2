"""KTransformers optimize-rule YAML for a policy.

KTransformers replaces each ``model.layers.N.<moe>.experts`` module by the first rule whose
``match.name`` regex matches it, so the rules here must come before any broader experts rule of
the model's own rule file. A rule places a whole layer's experts: CPU layers get
``generate_device: cpu`` / ``KExpertsCPU``, GPU layers ``generate_device: cuda`` /
``KExpertsTorch``. Like llama.cpp it is layer-granular: ``layer_partition`` is exact, other
candidates get the layer partition at the same VRAM and the predicted gap.
"""
from __future__ import annotations

from ..errors import CopeInputError
from ..matrix import LAYER_PARTITION
from .common import Rendered, gap_line, header, layer_partition_summary, whole_layer_equivalent
from .layers import describe_blocks, int_set_regex
from .policy import Policy

EXPERTS_CLASS = "ktransformers.operators.experts.KTransformersExperts"
#: Hugging Face module path of the routed experts inside a decoder block, where it is not
#: ``mlp.experts``.
EXPERTS_MODULE = {"mixtral-8x7b": "block_sparse_moe.experts"}


def experts_module(model_name: str) -> str:
    return EXPERTS_MODULE.get(model_name, "mlp.experts")


def rule_regex(blocks: tuple[int, ...], module: str) -> str:
    """Regex of exactly the experts modules of ``blocks``."""
    return rf"^model\.layers\.{int_set_regex(blocks)}\." + module.replace(".", r"\.") + "$"


def _rule(blocks: tuple[int, ...], module: str, device: str, op: str) -> dict:
    # Prefill settings follow KTransformers' shipped rules; COPE models decode (generate) only.
    return {"match": {"name": rule_regex(blocks, module)},
            "replace": {"class": EXPERTS_CLASS,
                        "kwargs": {"prefill_device": "cuda", "prefill_op": "KExpertsTorch",
                                   "generate_device": device, "generate_op": op,
                                   "out_device": "cuda"}},
            "recursive": False}


def ktransformers_rules(policy: Policy) -> list[dict]:
    """The rules of the layer partition at the policy's VRAM, CPU layers first."""
    plan = policy.layer_plan
    module = experts_module(policy.model.name)
    rules = []
    if plan.cpu_blocks:
        rules.append(_rule(plan.cpu_blocks, module, "cpu", "KExpertsCPU"))
    if plan.gpu_blocks:
        rules.append(_rule(plan.gpu_blocks, module, "cuda", "KExpertsTorch"))
    return rules


def render_ktransformers(policy: Policy) -> Rendered:
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a declared dependency
        raise CopeInputError("the ktransformers format needs PyYAML (pip install pyyaml)",
                             field="--format") from None
    plan = policy.layer_plan
    L = policy.model.n_layers
    exact = whole_layer_equivalent(policy)
    lines = header(policy, "KTransformers")
    summary = ""
    if not exact:
        summary = layer_partition_summary(
            policy, "KTransformers optimize rules cannot express {candidate}: a rule places a "
                    "whole layer's experts module")
        lines += [
            f"# These rules CANNOT express {policy.candidate}: a rule replaces a whole "
            f"model.layers.N.{experts_module(policy.model.name)} module,",
            "# so all experts of a layer run on one side, never single experts.",
            f"# Below: the nearest expressible policy, {LAYER_PARTITION} at the same VRAM "
            f"(N_gpu = floor(K*L/E) = {plan.n_gpu}).",
            gap_line(policy, LAYER_PARTITION),
        ]
    lines += [
        f"# CPU experts: {plan.n_cpu} of {L} MoE layers, the first ones "
        f"({describe_blocks(plan.cpu_blocks)}); GPU experts: {plan.n_gpu} "
        f"({describe_blocks(plan.gpu_blocks)}); block numbers count the {plan.dense_layers} "
        "dense prefix block(s)",
        "# KTransformers applies the FIRST rule whose match.name matches a module: put these "
        "rules before",
        "# any broader '.mlp.experts' rule of the model's optimize-rule file, and run with "
        f"--cpu_infer {policy.cpu_threads} (the predicted operating point).",
    ]
    body = yaml.safe_dump(ktransformers_rules(policy), sort_keys=False, default_flow_style=False,
                          width=1000)
    return Rendered("ktransformers", "\n".join(lines) + "\n" + body, exact=exact,
                    deployed=None if exact else LAYER_PARTITION, summary=summary)
