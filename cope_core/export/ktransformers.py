"""Optimize-rule YAML of legacy KTransformers (<= 0.4.1) for a policy.

The rule engine (``optimize_rules``, ``KTransformersExperts``, ``KExpertsCPU``) exists only in
legacy ktransformers: kvcache-ai/ktransformers moved it under ``archive/`` in commit
57d14d22bc9fe911694530cc8ff3ca7d20fa493a (2025-11-10); v0.4.1 is the last release with it at
the top level. Current releases put the kernels in kt-kernel and serve through SGLang-KT: use
``--format sglang-kt`` there. Read at 95009ea6856c0799e517e93cb12be5e8494bc7ce:

* ``archive/ktransformers/optimize/optimize.py`` (``gen_optimize_config``): rules are tried in
  file order, ``match.name`` with ``re.search``, and the **first** matching rule wins;
  ``recursive: False`` keeps it from descending into the replaced module.
* the shipped rule files use ``KTransformersExperts`` (DeepSeek-V2-Lite-Chat.yaml, Mixtral.yaml,
  Qwen2-57B-A14B-Instruct.yaml) with ``KExpertsCPU`` for CPU experts; Qwen3-MoE is served only by
  the balance_serve backend, whose MoE block calls the experts with five arguments, so
  Qwen3Moe-serve.yaml uses ``KTransformersExpertsV2`` — and only ``KExpertsCPU`` takes that call
  (``archive/ktransformers/operators/experts.py``).
* GPU-resident experts, as in doc/en/multi-gpu-tutorial.md and DeepSeek-V3-Chat-multi-gpu-marlin
  .yaml: ``generate_device: cuda:0`` with ``KExpertsMarlin``, and "you have to close the cuda
  graph" (``--no-use_cuda_graph`` for the server, ``use_cuda_graph=False`` for local_chat).
* ``archive/ktransformers/models/`` has no OLMoE, Qwen3.5 or gpt-oss model class.

Like llama.cpp it is layer-granular: ``layer_partition`` is exact, other candidates get the
layer partition at the same VRAM and the predicted gap.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CopeInputError, UnsupportedByRuntime
from ..matrix import LAYER_PARTITION
from ..placement import describe_blocks, int_set_regex
from .common import Rendered, gap_line, header, layer_partition_summary, whole_layer_equivalent
from .policy import Policy

V1 = "ktransformers.operators.experts.KTransformersExperts"
V2 = "ktransformers.operators.experts.KTransformersExpertsV2"


@dataclass(frozen=True)
class Family:
    """How legacy KTransformers runs one model family's experts."""

    name: str
    module: str                 # the experts module inside a decoder block
    experts_class: str
    rule_file: str              # the shipped file the rules go in front of
    gpu_experts: bool           # whether a GPU-resident experts layer can run at all


FAMILIES = {
    "deepseek": Family("DeepSeek-V2", "mlp.experts", V1, "DeepSeek-V2-Lite-Chat.yaml", True),
    "mixtral": Family("Mixtral", "block_sparse_moe.experts", V1, "Mixtral.yaml", True),
    "qwen2": Family("Qwen2-MoE", "mlp.experts", V1, "Qwen2-57B-A14B-Instruct.yaml", True),
    "qwen3": Family("Qwen3-MoE", "mlp.experts", V2, "Qwen3Moe-serve.yaml", False),
}
#: Families legacy KTransformers has no model class for, by what their names contain.
UNSUPPORTED = {"olmoe": "OLMoE", "qwen3.5": "Qwen3.5", "qwen3_5": "Qwen3.5",
               "gpt-oss": "gpt-oss", "gpt_oss": "gpt-oss"}
GENERIC = Family("unknown family", "mlp.experts", V1, "your model's rule file", True)


def family(model_name: str) -> Family:
    """The family of a model name (catalog or Hugging Face folder name); a family legacy
    KTransformers cannot run is a one-line error."""
    name = model_name.lower()
    for key, label in UNSUPPORTED.items():
        if key in name:
            raise UnsupportedByRuntime(f"legacy KTransformers (<= 0.4.1) has no model class for "
                                 f"{label} ({model_name}); use --format sglang-kt (current "
                                 "KTransformers serves through SGLang-KT)", field="--format")
    for key in ("deepseek", "mixtral", "qwen3", "qwen2", "qwen1.5"):
        if key in name:
            return FAMILIES["qwen2" if key == "qwen1.5" else key]
    return GENERIC


def experts_module(model_name: str) -> str:
    return family(model_name).module


def rule_regex(blocks: tuple[int, ...], module: str) -> str:
    """Regex of exactly the experts modules of ``blocks``."""
    return rf"^model\.layers\.{int_set_regex(blocks)}\." + module.replace(".", r"\.") + "$"


def _rule(blocks: tuple[int, ...], fam: Family, gpu: bool) -> dict:
    if gpu:    # the shipped GPU-experts form (multi-gpu tutorial, *-multi-gpu-marlin.yaml)
        kwargs = {"generate_device": "cuda:0", "generate_op": "KExpertsMarlin"}
    else:      # the shipped rule files' experts rule; COPE models decode (generate) only
        kwargs = {"prefill_device": "cuda", "prefill_op": "KExpertsTorch",
                  "generate_device": "cpu", "generate_op": "KExpertsCPU", "out_device": "cuda"}
    return {"match": {"name": rule_regex(blocks, fam.module)},
            "replace": {"class": fam.experts_class, "kwargs": kwargs},
            "recursive": False}


def ktransformers_rules(policy: Policy) -> list[dict]:
    """The rules of the layer partition at the policy's VRAM, CPU layers first."""
    plan = policy.layer_plan
    fam = family(policy.model.name)
    if plan.gpu_blocks and not fam.gpu_experts:
        raise UnsupportedByRuntime(
            f"legacy KTransformers runs {fam.name} only through balance_serve, whose "
            f"{fam.experts_class.rsplit('.', 1)[1]} calls the experts with five arguments that "
            "only KExpertsCPU takes: GPU-resident expert layers cannot be expressed there (this "
            f"placement has {plan.n_gpu}); use --format sglang-kt", field="--format")
    rules = []
    if plan.cpu_blocks:
        rules.append(_rule(plan.cpu_blocks, fam, gpu=False))
    if plan.gpu_blocks:
        rules.append(_rule(plan.gpu_blocks, fam, gpu=True))
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
    fam = family(policy.model.name)
    rules = ktransformers_rules(policy)
    lines = header(policy, "legacy KTransformers (<= 0.4.1) optimize rules")
    lines += ["# current KTransformers releases serve through SGLang-KT (--format sglang-kt); "
              "these rules need ktransformers <= 0.4.1"]
    summary = ""
    if not exact:
        summary = layer_partition_summary(
            policy, "KTransformers optimize rules cannot express {candidate}: a rule places a "
                    "whole layer's experts module")
        lines += [
            f"# These rules CANNOT express {policy.candidate}: a rule replaces a whole "
            f"model.layers.N.{fam.module} module,",
            "# so all experts of a layer run on one side, never single experts.",
            f"# Below: the nearest expressible policy, {LAYER_PARTITION} at the same VRAM "
            f"({plan.n_gpu} GPU layers: the most whose experts fit K's bytes).",
            gap_line(policy, LAYER_PARTITION),
        ]
    lines += [
        f"# CPU experts: {plan.n_cpu} of {L} MoE layers, the first ones "
        f"({describe_blocks(plan.cpu_blocks)}); GPU experts: {plan.n_gpu} "
        f"({describe_blocks(plan.gpu_blocks)}); block numbers count the {plan.dense_layers} "
        "dense prefix block(s)",
        "# KTransformers applies the FIRST rule whose match.name matches a module (re.search): "
        "put these rules before",
        f"# the experts rule of {fam.rule_file} ({fam.name}, experts class "
        f"{fam.experts_class.rsplit('.', 1)[1]}), and run with --cpu_infer {policy.cpu_threads} "
        "(the predicted operating point).",
    ]
    if fam is GENERIC:
        lines.append(f"# {policy.model.name}: not a family legacy KTransformers ships rules for; "
                     "the module path follows DeepSeek-V2 (model.layers.N.mlp.experts): check it")
    if plan.gpu_blocks:
        lines.append("# GPU expert layers use KExpertsMarlin and need CUDA graphs off: server "
                     "--no-use_cuda_graph, local_chat use_cuda_graph=False")
    body = yaml.safe_dump(rules, sort_keys=False, default_flow_style=False, width=1000)
    return Rendered("ktransformers", "\n".join(lines) + "\n" + body, exact=exact,
                    deployed=None if exact else LAYER_PARTITION, summary=summary)
