"""exllamav3 flags, environment and expert-statistics file for a policy.

Read in the exllamav3 1.6.5 wheel (PyPI, ``py3-none-any``; the GitHub snapshot readable here is
v1.4.1, which has no ``-mcs``):

* ``exllamav3/model_init.py`` ``add_args``: ``-mcs/--moe_cpu_split N`` (an int) runs "the TAIL N
  routed experts of every eligible block-sparse MoE layer on the CPU, overlapping the CPU GEMMs
  with each layer's own GPU expert compute"; ``-mcl/--moe_cpu_offload N`` (an int) the routed
  experts of "the first N block-sparse MoE layers" on the CPU; mutually exclusive. One N for every
  layer: no per-layer form in 1.6.5 (``-mcs 8..23:64`` is "invalid int value").
* ``exllamav3/modules/block_sparse_mlp_cpu.py``: the CPU takes experts ``[E - N, E)`` of the
  layer's list; with ``EXL3_MOE_CPU_SPLIT_STATS=FILE`` the list is first permuted by
  ``sorted(range(E), key=lambda e: -counts[e])`` where ``counts = json.load(FILE).get(self.key)``
  (the module key, e.g. ``model.layers.5.mlp``), so the GPU keeps the ``E - N`` most counted;
  ``EXL3_MOE_CPU_SWAP=0`` keeps that placement (the default 1 swaps hot CPU experts in every 128
  steps: another, mutable policy); ``N >= E`` is capped to ``E - 1``.
* ``exllamav3/architecture/*.py``: the block-sparse module keys of each architecture.

So ``fixed/parallel`` at K is exact: ``-mcs E-K`` with a stats file whose counts rank each
layer's K resident experts first; ``layer_partition`` is exact as ``-mcl N_cpu`` (the first
layers: :class:`cope_core.placement.LayerFlag` ``EXLLAMAV3``).
"""
from __future__ import annotations

import json

from ..errors import UnsupportedByRuntime
from ..geometry import GIB, ModelGeometry
from ..matrix import LAYER_PARTITION, Execution, Residency, candidate_id, get_candidate
from ..placement import LayerFlag
from .common import Rendered, gap_line, gap_summary, header, host_ram_line
from .policy import Policy

DEPLOYED = candidate_id(Residency.FIXED, Execution.PARALLEL)
DEFAULT_STATS = "cope-exl3-stats.json"

#: Block-sparse module keys by model family (exllamav3 1.6.5 ``architecture/``: qwen3_moe.py,
#: mixtral.py, deepseek_v3.py, glm4_moe.py, gpt_oss.py, qwen3_5.py's MoE configs, whose prefix
#: is ``model.language_model``); matched on the start of the geometry's name.
MODULE_KEYS = (
    ("qwen3.5", "model.language_model.layers.{block}.mlp"),
    ("qwen3-", "model.layers.{block}.mlp"),
    ("mixtral", "model.layers.{block}.block_sparse_moe"),
    ("deepseek-v3", "model.layers.{block}.mlp"),
    ("glm-4.5", "model.layers.{block}.mlp"),
    ("gpt-oss", "model.layers.{block}.mlp"),
)


def module_key(g: ModelGeometry) -> str:
    """The key template of the model's block-sparse modules in exllamav3."""
    name = g.name.lower()
    for prefix, key in MODULE_KEYS:
        if name.startswith(prefix):
            return key
    raise UnsupportedByRuntime(
        f"exllamav3 1.6.5 has no architecture COPE maps to {g.name!r} (it reads Qwen3-MoE, "
        "Qwen3.5-MoE, Mixtral, DeepSeek-V3, GLM-4.5 and gpt-oss among the catalog's families)",
        field="format")


def stats_file(policy: Policy) -> dict[str, list[int]]:
    """``EXL3_MOE_CPU_SPLIT_STATS``: per block-sparse module, counts in checkpoint expert order
    that rank the layer's resident experts first (in fill order) and every other expert 0."""
    g = policy.model
    key = module_key(g)
    out = {}
    for layer, row in enumerate(policy.resident_experts):
        counts = [0] * g.n_experts
        for rank, e in enumerate(row):
            counts[e] = len(row) - rank
        out[key.format(block=g.dense_layers + layer)] = counts
    return out


def memory_lines(policy: Policy, bits: float | None) -> list[str]:
    """exllamav3's memory in its own terms: EXL3 experts at ``bits`` per weight."""
    g = policy.model
    if bits is None:
        return ["# memory: exllamav3 stores experts at its own bits per weight; give --exl3-bits "
                "(config.json quantization_config.bits) to size them"]
    per = 3 * g.hidden * g.expert_intermediate * bits / 8
    K, L, E = policy.experts_per_layer, g.n_layers, g.n_experts
    if policy.candidate == LAYER_PARTITION:
        gpu, cpu = policy.layer_plan.n_gpu * E, policy.layer_plan.n_cpu * E
    else:
        gpu, cpu = L * K, L * (E - K)
    budget = K * g.per_k_bytes
    k_exl3 = min(int(budget // (L * per)), E)
    return [f"# memory at {bits:g} bits per weight: {per / 2**20:.2f} MiB per expert; GPU experts "
            f"{gpu * per / GIB:.2f} GiB, CPU experts {cpu * per / GIB:.2f} GiB of RAM",
            f"# the VRAM K = {K} takes in {g.format_name} ({budget / GIB:.2f} GiB) holds "
            f"K = {k_exl3} EXL3 experts per layer: -mcs {E - k_exl3} there (predicted at K = "
            f"{K}; re-run cope with the EXL3 bytes to price it)"]


def render_exllamav3(policy: Policy, stats_path: str = DEFAULT_STATS,
                     bits: float | None = None) -> Rendered:
    g = policy.model
    cand = get_candidate(policy.candidate)
    K, E = policy.experts_per_layer, g.n_experts
    module_key(g)                                   # refuse a model exllamav3 cannot load
    lines = header(policy, "exllamav3")
    files: tuple[tuple[str, bytes], ...] = ()
    lp = cand.is_layer_partition or K == 0          # whole layers (-mcs caps N at E - 1)
    exact = cand.is_layer_partition or (cand.residency is Residency.FIXED and (
        cand.execution is Execution.PARALLEL or K == E))
    summary = ""
    if not exact:
        summary = (f"exllamav3 cannot express {policy.candidate}: -mcs keeps a fixed set of GPU "
                   f"experts per layer and runs the rest on a CPU worker concurrently, i.e. "
                   f"{DEPLOYED}; " + gap_summary(policy, DEPLOYED))
        why = ("its GPU experts do not change during decode with EXL3_MOE_CPU_SWAP=0 (the "
               "default swap is another, mutable policy)" if cand.residency is not None
               and cand.residency.mutable else
               f"it runs every miss on the CPU beside the GPU hits, not '{policy.execution}'")
        lines += [f"# exllamav3 CANNOT express {policy.candidate}: {why};",
                  f"# below, the same resident experts run as {DEPLOYED}.",
                  gap_line(policy, DEPLOYED)]
    base = f"python examples/chat.py -m MODEL_DIR -mct {policy.cpu_threads}"
    if lp:
        if cand.is_layer_partition:
            n_cpu = policy.layer_plan.flag_value(LayerFlag.EXLLAMAV3)
        else:
            n_cpu = g.n_layers                    # fixed/parallel at K = 0: every layer's experts
        lines.append(f"# the routed experts of the first {n_cpu} of {g.n_layers} MoE layers on "
                     "the CPU (whole layers), the rest on the GPU")
        lines.append(host_ram_line(policy, n_cpu * E, "the CPU worker's layers"))
        lines += memory_lines(policy, bits)
        lines.append(base + (f" -mcl {n_cpu}" if n_cpu else ""))
    elif K == E:
        lines += ["# every expert on the GPU: no CPU split"] + memory_lines(policy, bits)
        lines.append(base)
    else:
        stats = stats_file(policy)
        files = ((stats_path, (json.dumps(stats, separators=(",", ":")) + "\n").encode()),)
        lines += [f"# {stats_path}: per MoE module ({module_key(g).format(block='N')}), counts "
                  f"ranking its {K} resident experts first, so the GPU keeps exactly them",
                  f"# -mcs {E - K}: the {E - K} coldest experts of every MoE layer on the CPU "
                  "worker, concurrently with the GPU's; EXL3_MOE_CPU_SWAP=0 keeps the placement",
                  host_ram_line(policy, g.n_layers * (E - K), "the CPU worker's experts")]
        lines += memory_lines(policy, bits)
        lines.append(f"EXL3_MOE_CPU_SWAP=0 EXL3_MOE_CPU_SPLIT_STATS={stats_path} "
                     f"{base} -mcs {E - K}")
    return Rendered("exllamav3", "\n".join(lines) + "\n", files=files, exact=exact,
                    deployed=None if exact else DEPLOYED, summary=summary)
