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
(:class:`~cope_core.platforms.PlatformSpec`) and the rates of :mod:`.prompt_rates`: a layer's GPU
work is the larger of its FLOPs over the card's prompt rate (its FP16 peak times the efficiency
llama.cpp's own fully offloaded runs reach on it, :func:`prompt_efficiency`) and its weights read
once over the GPU's memory bandwidth; a copy is its bytes over the link from pinned memory (the
load mode leaves the host experts pinned) or over the host's staging rate from pageable memory
(mmap, llama.cpp's default: :func:`~.prompt_rates.copy_bandwidth`); a ubatch touches the experts
its tokens would drawn from the family's warm share of them (:func:`prompt_experts`); the CPU's
expert work is the larger of its FLOPs over the threads' FLOP rate and the distinct experts' bytes
over the memory bandwidth. Attention over the context so far is ``4 x tokens x (context +
tokens/2) x heads x head_dim`` FLOPs per full-attention block (causal QK^T and PV; a sliding
window's at most its window), at flash attention's own rate (:data:`~.prompt_rates.
ATTENTION_EFFICIENCY`). Each batch also pays fixed costs: every block's
kernels launched once (``gpu_kernels_per_block`` and the MoE layers'
``gpu_kernels_per_expert_group`` launches of ``gpu_launch_us``), and per host layer a copy's
latency (``link_latency_us``) or, on the CPU path, a synchronisation and a hand-off
(``gpu_sync_us + cpu_dispatch_us``), the spec's constants decode is priced with. Copy and compute
are serial: the scheduler copies a split's inputs, then runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from statistics import median

import numpy as np

from ...attention import GatedDeltaNet, SlidingWindow
from ...errors import CopeInputError
from ...geometry import ModelGeometry
from ...machine import compose_machine
from ...models import resolve_model
from ...parts import gpu_part
from ...platforms import DEFAULT_CPU, PlatformSpec
from ..placement.vram import N_BATCH, N_UBATCH, OP_OFFLOAD_MIN_BATCH
from .builds import Build, latest
from .prompt_rates import (
    ATTENTION_EFFICIENCY,
    FULL_OFFLOAD_ROWS,
    copy_bandwidth,
    fitted,
    unpriced_reason,
    warm_share,
)


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
    pinned : bool
        The host experts sit in the GPU backend's pinned host buffer (a load mode without mmap:
        :func:`~.prompt_rates.host_pinned`); False: llama.cpp's default, the file's pageable
        mapping.
    """

    n_prompt: int
    depth: int = 0
    n_ubatch: int = N_UBATCH
    n_batch: int = N_BATCH
    op_offload: bool = True
    threads: int = 1
    pinned: bool = False

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


def distinct_experts(n_tokens: float, n_experts: int, top_k: int) -> float:
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


def used_experts(n_tokens: float, g: ModelGeometry, rates: np.ndarray | None,
                 layers: range) -> float:
    """Expected distinct experts a batch of ``n_tokens`` routes to, summed over ``layers`` (MoE
    layer indices) when the tokens route independently: from each layer's selection rates
    (``sum_e 1 - (1 - p_e)^n``), else uniform routing (:func:`distinct_experts`)."""
    if rates is None:
        return len(layers) * distinct_experts(n_tokens, g.n_experts, g.top_k)
    sub = np.clip(rates[layers.start:layers.stop], 0.0, 1.0)
    return float(np.sum(1.0 - (1.0 - sub) ** n_tokens))


def prompt_experts(n_tokens: int, g: ModelGeometry, rates: np.ndarray | None,
                   layers: range) -> float:
    """Distinct experts a prompt's ubatch of ``n_tokens`` touches over ``layers``: as
    :func:`used_experts`, at most what uniform draws from the family's warm experts touch
    (:data:`~.prompt_rates.WARM_EXPERT_SHARE`)."""
    warm = warm_share(g.name) * g.n_experts
    cap = len(layers) * distinct_experts(n_tokens, round(warm), g.top_k)
    return min(used_experts(n_tokens, g, rates, layers), cap)


def offloads(run: PromptRun, tokens: int, build: Build) -> bool:
    """Whether the GPU runs a host layer's experts for a batch of ``tokens``."""
    return (run.op_offload and build.has("op_offload") and tokens >= OP_OFFLOAD_MIN_BATCH)


def _attention_flops(g: ModelGeometry, tokens: int, context: int) -> float:
    """One block's attention FLOPs for ``tokens`` after ``context``, the mean over the blocks:
    a sliding-window layer attends to at most its window (gpt-oss: every other layer), a Gated
    DeltaNet layer to nothing that grows (Qwen3.5: one full layer in ``interval``)."""
    full = 4.0 * tokens * (context + tokens / 2) * g.n_heads * g.head_dim
    fam = g.family
    if isinstance(fam, SlidingWindow):
        window = 4.0 * tokens * min(context + tokens / 2, fam.window) * g.n_heads * g.head_dim
        return full / fam.every + window * (1 - 1 / fam.every)
    if isinstance(fam, GatedDeltaNet):
        return full / fam.interval
    return full


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
    gpu_rate = spec.gpu_flops * prompt_efficiency(spec)
    attn_rate = spec.gpu_flops * ATTENTION_EFFICIENCY
    gpu_bw = spec.gpu_bandwidth * spec.gpu_efficiency
    cpu_rate = spec.cpu_flops_per_thread * run.threads * spec.cpu_efficiency
    cpu_bw = min(spec.cpu_bandwidth, spec.cpu_bandwidth_per_thread * run.threads) \
        * spec.cpu_efficiency
    link_bw = copy_bandwidth(spec, run.pinned)
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
        # every block's shared work on the GPU: weights read once, FLOPs for every token, and
        # attention at flash attention's own rate
        shared = 2 * tokens * (g.dense_layers * g.dense_block_params
                               + g.n_layers * g.moe_block_params)
        shared_bytes = bpp * (g.dense_layers * g.dense_block_params
                              + g.n_layers * g.moe_block_params)
        gpu_s += max(shared / gpu_rate, shared_bytes / gpu_bw) \
            + (g.dense_layers + g.n_layers) * _attention_flops(g, tokens, context) / attn_rate
        # the routed experts: the GPU layers' on the GPU (the used ones read once)
        expert_work = 2 * tokens * g.top_k * expert_params
        gpu_s += max(len(on_gpu) * expert_work / gpu_rate,
                     prompt_experts(tokens, g, rates, on_gpu) * g.expert_bytes / gpu_bw)
        if not host_layers:
            continue
        used = prompt_experts(tokens, g, rates, host)
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


def _solve_efficiency(row_gpu: str, model: str, quant: str, ubatch: int, n_prompt: int,
                      tokens_per_s: float) -> float:
    """The prompt efficiency at which the model prices a fully offloaded published run at its
    measured tokens per second (bisection on a log scale: time falls as the rate rises)."""
    g = resolve_model(model, quant)
    m = compose_machine(gpu=row_gpu, cpu=DEFAULT_CPU)
    assert m.spec is not None
    run = PromptRun(n_prompt, 0, ubatch, max(ubatch, N_BATCH))
    lo, hi = 1e-3, 2.0
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        t = prompt_time(g, replace(m.spec, gpu_prompt_efficiency=mid), 0, run).tokens_per_s
        lo, hi = (mid, hi) if t < tokens_per_s else (lo, mid)
    return (lo * hi) ** 0.5


@cache
def card_efficiencies() -> dict[str, float]:
    """Each card of :data:`~.prompt_rates.FULL_OFFLOAD_ROWS`: the achieved / peak FLOP/s of
    llama.cpp's fully offloaded prompt run on it (the mean of its rows)."""
    by: dict[str, list[float]] = {}
    for r in FULL_OFFLOAD_ROWS:
        by.setdefault(r.gpu, []).append(_solve_efficiency(r.gpu, r.model, r.quant, r.ubatch,
                                                          r.n_prompt, r.tokens_per_s))
    return {k: sum(v) / len(v) for k, v in by.items()}


def _vendor(gpu_name: str) -> str | None:
    try:
        return gpu_part(gpu_name).vendor
    except CopeInputError:
        return None


@cache
def card_efficiency(gpu_name: str) -> float:
    """The published prompt efficiency of a card: its own rows', else the median of its vendor's
    cards, else of every card (before the fitted scale)."""
    eff = card_efficiencies()
    if gpu_name in eff:
        return eff[gpu_name]
    vendor = _vendor(gpu_name)
    same = [e for k, e in eff.items() if vendor is not None and _vendor(k) == vendor]
    return median(same or list(eff.values()))


def prompt_unpriced(g: ModelGeometry, spec: PlatformSpec) -> str | None:
    """Why a prompt of ``g`` on ``spec``'s GPU is not priced (its backend runs it in a way the
    model does not price: :data:`~.prompt_rates.UNPRICED`), or None."""
    return unpriced_reason(g.name, _vendor(spec.gpu_name))


def prompt_efficiency(spec: PlatformSpec) -> float:
    """Achieved / peak FLOP/s of the spec's GPU on a prompt: a refit's
    (``spec.gpu_prompt_efficiency``), else the card's published one times the fitted scale."""
    if spec.gpu_prompt_efficiency is not None:
        return spec.gpu_prompt_efficiency
    return card_efficiency(spec.gpu_name) * fitted("gpu_rate_scale")
