"""Flags for two runtimes that take a cache size and a strategy, not a residency list: FreeToken
(``ft serve``) and fastllm (``ftllm server``).

Read in the PyPI wheels ``freetoken`` 0.2.1 and ``ftllm`` 1.9.0 (fastllm's package; the PyPI name
``fastllm`` is another project):

* FreeToken ``freetoken/server/args.py`` and ``freetoken/moe/__init__.py``: ``--moe-strategy``
  is ``fused`` (every expert resident), ``offload`` (missing experts streamed over PCIe into a GPU
  slot cache), ``cpu`` (every expert computed on the CPU from host banks) or ``hybrid`` (at most
  ``--moe-hybrid-max-fetch`` missing experts fetched per layer and step, the rest on the CPU,
  overlapped); ``--moe-cache-size N`` slots, ``--moe-cache-scope unified`` (one LRU pool per expert
  format, all layers) or ``per-layer``; ``--moe-cache-policy lru``.
* fastllm ``ftllm/cli.py`` and ``ftllm/util.py`` (``make_normal_parser``): ``--moe_device cpu``
  runs routed experts on the CPU, ``--moe_device_layers N`` for the **last** N MoE layers (-1:
  all), ``--moe_cuda_cache SIZE`` a per-GPU expert cache during hybrid decode whose contents
  follow a decayed heat (``--moe_cache_half_life`` 128 decode steps, up to
  ``--moe_cache_max_replacements`` 96 swaps per update across layers), ``-t`` threads.

Neither keeps a fixed set of experts per layer, nor prefetches by prediction: of COPE's
candidates, each runs exactly every expert on the GPU (fixed residency at K = E) and every
expert on the CPU (``fixed/parallel`` at K = 0); fastllm also ``layer_partition`` (its last N
layers, at the N that fits the same VRAM: :class:`cope_core.placement.LayerFlag` ``FASTLLM``).
Any other candidate renders the runtime's cache at the same VRAM, a policy outside the Policy
Matrix (demand-filled or heat-driven), and says so.
"""
from __future__ import annotations

from ..matrix import LAYER_PARTITION, Execution, Residency, get_candidate
from ..placement import LayerFlag, layer_plan
from .common import Rendered, header, host_ram_line
from .policy import Policy


def _kind(policy: Policy) -> str:
    """``gpu`` (every expert resident), ``cpu`` (every expert on the CPU), ``layers`` (layer
    partition) or ``cache`` (no exact form: the runtime's cache at the same VRAM)."""
    c = get_candidate(policy.candidate)
    K, E = policy.experts_per_layer, policy.model.n_experts
    if c.is_layer_partition:
        return "layers"
    if c.residency is Residency.FIXED and K == E:
        return "gpu"
    if c.residency is Residency.FIXED and K == 0 and c.execution is Execution.PARALLEL:
        return "cpu"
    return "cache"


def _outside(policy: Policy, runtime: str, what: str) -> tuple[list[str], str]:
    summary = (f"{runtime} cannot express {policy.candidate}: it keeps no fixed set of experts "
               f"per layer and prefetches nothing by prediction; below, its {what} at the same "
               "VRAM, a policy outside the Policy Matrix that COPE does not predict")
    return [f"# {runtime} CANNOT express {policy.candidate}: its GPU experts are a {what}, "
            "filled as it decodes, not a fixed or predicted set;",
            "# below, that cache at the same VRAM (outside the Policy Matrix: no prediction)."
            ], summary


def render_freetoken(policy: Policy) -> Rendered:
    g = policy.model
    K, L, E = policy.experts_per_layer, g.n_layers, g.n_experts
    kind = _kind(policy)
    lines = header(policy, "FreeToken")
    if kind != "gpu":
        lines.append(host_ram_line(policy, L * E, "the offload family serves every expert from "
                                                  "pinned host banks"))
    base = f"ft serve --model MODEL --moe-cpu-threads {policy.cpu_threads}"
    summary = ""
    if kind == "gpu":
        lines.append("# every routed expert resident on the GPU")
        lines.append(f"{base} --moe-strategy fused")
    elif kind == "cpu":
        lines.append("# every routed expert computed on the CPU from the host banks")
        lines.append(f"{base} --moe-strategy cpu")
    else:
        c = get_candidate(policy.candidate)
        offload = c.execution in (Execution.WAIT_THEN_GPU, Execution.READY_FIRST)
        slots = K * L if kind == "cache" else policy.layer_plan.n_gpu * E
        what = "demand-filled LRU slot cache"
        more, summary = _outside(policy, "FreeToken", what)
        if kind == "layers":
            more[0] = ("# FreeToken CANNOT express layer_partition: it places no whole layers on "
                       f"the CPU by count; below, its {what} of the same slots")
            summary = summary.replace("keeps no fixed set of experts per layer",
                                      "places no whole layers")
        strategy = ("offload" if offload else "hybrid")
        lines += more + [
            f"# {slots} slots = {'K x L' if kind == 'cache' else 'the layer partition'}'s GPU "
            f"experts; --moe-strategy {strategy}: misses "
            + ("fetched, then run on the GPU" if offload else
               "fetched up to the benched PCIe/CPU share, the rest on the CPU, overlapped"),
            f"{base} --moe-strategy {strategy} --moe-cache-size {slots} "
            "--moe-cache-scope unified --moe-cache-policy lru"]
    exact = kind in ("gpu", "cpu")
    return Rendered("freetoken", "\n".join(lines) + "\n", exact=exact, deployed=None,
                    summary=summary)


def render_fastllm(policy: Policy) -> Rendered:
    g = policy.model
    K, L = policy.experts_per_layer, g.n_layers
    kind = _kind(policy)
    lines = header(policy, "fastllm")
    base = f"ftllm server MODEL --device cuda -t {policy.cpu_threads}"
    summary = ""
    if kind == "gpu":
        lines += ["# every routed expert on the GPU", base]
    elif kind == "cpu":
        lines += ["# every routed expert on the CPU",
                  host_ram_line(policy, L * g.n_experts, "every expert"),
                  f"{base} --moe_device cpu"]
    elif kind == "layers":
        plan = policy.layer_plan
        n = layer_plan(g, K, LayerFlag.FASTLLM.side).flag_value(LayerFlag.FASTLLM)
        same = ("the same number, priced alike" if n == plan.n_cpu else
                f"{n - plan.n_cpu:+d}: the layers store their experts in other bytes")
        lines.append(f"# {LAYER_PARTITION}: fastllm puts the LAST N MoE layers' experts on the "
                     f"CPU (--moe_device_layers): N = {n} ({same})")
        lines.append(host_ram_line(policy, n * g.n_experts, "the host layers' experts"))
        lines.append(f"{base} --moe_device cpu --moe_device_layers {n}" if n else base)
    else:
        more, summary = _outside(policy, "fastllm", "heat-driven expert cache")
        mib = max(int(K * g.per_k_bytes // 2**20), 1)
        lines += more + [host_ram_line(policy, L * g.n_experts, "every expert (the cache copies "
                                                                 "some to the GPU)"),
                         f"# --moe_cuda_cache {mib}m = the VRAM of K = {K} experts in each of "
                         f"the {L} MoE layers; misses on the CPU",
                         f"{base} --moe_device cpu --moe_cuda_cache {mib}m"]
    exact = kind != "cache"
    return Rendered("fastllm", "\n".join(lines) + "\n", exact=exact, deployed=None,
                    summary=summary)
