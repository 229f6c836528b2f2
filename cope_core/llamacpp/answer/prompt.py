"""Prompt processing as llama.cpp runs it, from first principles (docs/design.md#prompt-processing):
a prompt of P tokens at depth d is evaluated in physical batches of ``-ub`` tokens (at most ``-b``);
each batch runs every layer on the GPU for its tokens, and the routed experts of the layers kept
in host memory either

* cross the link once per batch (op offload: a batch of at least 32 tokens, a build with it,
  no ``--no-op-offload``; ``ggml_backend_sched_backend_id_from_cur`` copies a host weight into
  the GPU's compute buffer for the op), only the experts the batch routes to since b6220
  (ggml-org/llama.cpp#15346, ``used_ids`` in ggml-backend.cpp), every expert of the layer before;
* or run on the CPU (a smaller batch, ``--no-op-offload``, a build without op offload).

Costs (seconds) come from the machine's published peaks
(:class:`~cope_core.platforms.PlatformSpec`): a layer's GPU work is the larger of its FLOPs over
the GPU's FLOP rate and its weights read once over the GPU's memory bandwidth, both at the spec's
efficiency; a copy is its bytes over the link's bandwidth at :data:`BULK_LINK_EFFICIENCY`; the
CPU's expert work is the larger of its FLOPs over the threads' FLOP rate and the distinct experts'
bytes over the memory bandwidth. Attention over the context so far is ``4 x tokens x (context +
tokens/2) x heads x head_dim`` FLOPs per block (causal QK^T and PV). Each batch also pays fixed
costs: every block's kernels launched once (``gpu_kernels_per_block`` and the MoE layers'
``gpu_kernels_per_expert_group`` launches of ``gpu_launch_us``), and per host layer a copy's
latency (``link_latency_us``) or, on the CPU path, a synchronisation and a hand-off
(``gpu_sync_us + cpu_dispatch_us``), the spec's constants decode is priced with. Copy and compute
are serial: the scheduler copies a split's inputs, then runs it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import CopeInputError
from ...geometry import ModelGeometry
from ...platforms import PlatformSpec
from ..placement.vram import N_BATCH, N_UBATCH, OP_OFFLOAD_MIN_BATCH
from .builds import Build, latest

#: achieved / peak link bandwidth of a copy of many MiB (one layer's used experts): an
#: assumption (a large pinned-memory copy reaches most of PCIe's peak; the spec's
#: ``link_efficiency`` is for one expert's small copy)
BULK_LINK_EFFICIENCY = 0.8


@dataclass(frozen=True)
class PromptRun:
    """One prompt as llama-bench's ``pp`` test (``-p P``, ``-d d``) runs it.

    Attributes
    ----------
    n_prompt, depth : int
        Tokens evaluated, and tokens already in the KV cache before them (``-d``).
    n_ubatch, n_batch : int
        ``-ub`` and ``-b``: batches of ``min(ub, b)`` tokens.
    op_offload : bool
        False: ``--no-op-offload``.
    threads : int
        CPU threads of the CPU path.
    """

    n_prompt: int
    depth: int = 0
    n_ubatch: int = N_UBATCH
    n_batch: int = N_BATCH
    op_offload: bool = True
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("n_prompt", "n_ubatch", "n_batch", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CopeInputError(f"expected a positive whole number, got {v!r}",
                                     field=name)
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 0:
            raise CopeInputError(f"expected a whole number >= 0, got {self.depth!r}",
                                 field="depth")

    @property
    def batch(self) -> int:
        """Tokens per physical batch: ``-ub``, at most ``-b``."""
        return min(self.n_ubatch, self.n_batch)

    def chunks(self) -> list[tuple[int, int]]:
        """``(tokens, context before them)`` of each physical batch, in order."""
        out, done = [], 0
        while done < self.n_prompt:
            n = min(self.batch, self.n_prompt - done)
            out.append((n, self.depth + done))
            done += n
        return out


@dataclass(frozen=True)
class PromptTime:
    """A prompt's predicted time, in seconds, by part, and its tokens per second."""

    gpu_s: float
    copy_s: float
    cpu_s: float
    n_prompt: int
    offloaded: bool

    @property
    def seconds(self) -> float:
        return self.gpu_s + self.copy_s + self.cpu_s

    @property
    def tokens_per_s(self) -> float:
        return self.n_prompt / self.seconds


def distinct_experts(n_tokens: int, n_experts: int, top_k: int) -> float:
    """Expected distinct experts ``n_tokens`` tokens route to, each choosing ``top_k`` of
    ``n_experts`` (uniform routing: ``E (1 - (1 - k/E)^n)``; a skewed router routes to fewer)."""
    if n_experts <= 0 or top_k <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** n_tokens)


def selection_rates(routed: np.ndarray, n_experts: int) -> np.ndarray:
    """Each MoE layer's chance that one token routes to each expert, ``(L, E)``, from a routing
    trace's ``routed`` ids ``(N, L, top_k)``: the router's skew, which makes a batch touch fewer
    experts than uniform routing would."""
    n, layers, _ = routed.shape
    out = np.zeros((layers, n_experts))
    for layer in range(layers):
        out[layer] = np.bincount(routed[:, layer, :].ravel(), minlength=n_experts)[:n_experts]
    return out / max(n, 1)


def used_experts(n_tokens: int, g: ModelGeometry, rates: np.ndarray | None,
                 layers: range) -> float:
    """Expected distinct experts a batch of ``n_tokens`` routes to, summed over ``layers`` (MoE
    layer indices): from each layer's selection rates (tokens independent:
    ``sum_e 1 - (1 - p_e)^n``), else uniform routing (:func:`distinct_experts`)."""
    if rates is None:
        return len(layers) * distinct_experts(n_tokens, g.n_experts, g.top_k)
    sub = np.clip(rates[layers.start:layers.stop], 0.0, 1.0)
    return float(np.sum(1.0 - (1.0 - sub) ** n_tokens))


def offloads(run: PromptRun, tokens: int, build: Build) -> bool:
    """Whether the GPU runs a host layer's experts for a batch of ``tokens``."""
    return (run.op_offload and build.has("op_offload") and tokens >= OP_OFFLOAD_MIN_BATCH)


def _attention_flops(g: ModelGeometry, tokens: int, context: int) -> float:
    return 4.0 * tokens * (context + tokens / 2) * g.n_heads * g.head_dim


def prompt_time(g: ModelGeometry, spec: PlatformSpec, host_layers: int, run: PromptRun,
                build: Build | None = None, rates: np.ndarray | None = None) -> PromptTime:
    """The time llama.cpp takes to evaluate ``run``'s prompt with the routed experts of
    ``host_layers`` MoE layers in host memory (``--n-cpu-moe``; the rest on the GPU), on the
    machine ``spec`` and the llama.cpp ``build`` (default the newest known).

    Parameters
    ----------
    g : ModelGeometry
        The model (its weights as stored: :attr:`ModelGeometry.expert_bytes`).
    spec : PlatformSpec
        The machine's peaks and efficiencies.
    host_layers : int
        MoE layers whose routed experts are in host memory.
    run : PromptRun
        The prompt and the batch settings.
    build : Build, optional
        Which op offload the build has (none before b2454; every expert copied before b6220).
    rates : ndarray, optional
        Each MoE layer's expert selection rates (:func:`selection_rates` of a routing trace):
        how many distinct experts a batch touches (default: uniform routing).
    """
    if not 0 <= host_layers <= g.n_layers:
        raise CopeInputError(f"expected host MoE layers in [0, {g.n_layers}], got "
                             f"{host_layers}", field="--n-cpu-moe")
    b = build if build is not None else latest()
    bpp = g.weight_bytes_per_param
    gpu_rate = spec.gpu_flops * spec.gpu_efficiency
    gpu_bw = spec.gpu_bandwidth * spec.gpu_efficiency
    cpu_rate = spec.cpu_flops_per_thread * run.threads * spec.cpu_efficiency
    cpu_bw = min(spec.cpu_bandwidth, spec.cpu_bandwidth_per_thread * run.threads) \
        * spec.cpu_efficiency
    link_bw = spec.link_bandwidth * BULK_LINK_EFFICIENCY
    expert_params = 3 * g.hidden * g.expert_intermediate
    gpu_s = copy_s = cpu_s = 0.0
    offloaded = False
    host, on_gpu = range(0, host_layers), range(host_layers, g.n_layers)
    # every batch launches each block's kernels once (its shared work, the GPU layers' experts)
    # and crosses each host layer's split boundary: fixed costs a small batch does not amortise
    launches = (g.dense_layers + g.n_layers) * spec.gpu_kernels_per_block \
        + g.n_layers * spec.gpu_kernels_per_expert_group
    for tokens, context in run.chunks():
        gpu_s += launches * spec.gpu_launch_us * 1e-6
        attn = _attention_flops(g, tokens, context)
        # every block's shared work on the GPU: weights read once, FLOPs for every token
        shared = (g.dense_layers * (2 * tokens * g.dense_block_params + attn)
                  + g.n_layers * (2 * tokens * g.moe_block_params + attn))
        shared_bytes = bpp * (g.dense_layers * g.dense_block_params
                              + g.n_layers * g.moe_block_params)
        gpu_s += max(shared / gpu_rate, shared_bytes / gpu_bw)
        # the routed experts: the GPU layers' on the GPU (the used ones read once)
        expert_work = 2 * tokens * g.top_k * expert_params
        gpu_s += max(len(on_gpu) * expert_work / gpu_rate,
                     used_experts(tokens, g, rates, on_gpu) * g.expert_bytes / gpu_bw)
        if not host_layers:
            continue
        used = used_experts(tokens, g, rates, host)
        if offloads(run, tokens, b):
            offloaded = True
            moved = used if b.has("op_offload_used_experts") else host_layers * g.n_experts
            copy_s += moved * g.expert_bytes / link_bw \
                + host_layers * spec.link_latency_us * 1e-6
            gpu_s += max(host_layers * expert_work / gpu_rate, moved * g.expert_bytes / gpu_bw)
        else:
            # a split into the CPU and back per host layer: a synchronisation and a hand-off
            cpu_s += max(host_layers * expert_work / cpu_rate, used * g.expert_bytes / cpu_bw) \
                + host_layers * (spec.gpu_sync_us + spec.cpu_dispatch_us) * 1e-6
    return PromptTime(gpu_s, copy_s, cpu_s, run.n_prompt, offloaded)


