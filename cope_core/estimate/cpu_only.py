"""Decode speed of a machine without a GPU: every weight in host memory, every operation on the
CPU's threads (``llama-server -ngl 0``).

The Policy Matrix needs a GPU: even at ``K = 0`` its candidates run the shared work (attention,
norms, router, the dense blocks and the LM head) on the GPU and only the routed experts on the
CPU. Without a GPU there is no placement to choose; one token costs, by the analytic model's own
atomic costs (:mod:`cope_core.profile.analytic`) with the GPU's throughput replaced by the CPU's:

* each block's shared work: its FLOPs at the threads' achieved FLOP/s or its weights and KV cache
  at the achieved host bandwidth (whichever is longer), plus the block's operations at one
  launch each (ggml's per-node thread barrier, priced as a GPU launch: an assumption);
* each MoE layer's ``top_k`` routed experts: :func:`~cope_core.profile.analytic.cpu_expert` each
  (bytes as stored, at the rate the dot-product kernel streams them from memory or the threads'
  rate for the type, whichever is lower), plus one expert group's operations;
* each block's thread barriers: ggml ends every graph node with one and every matrix product
  with a second (:data:`BARRIERS_PER_BLOCK`), each costing the threads' barrier
  (:meth:`~cope_core.platforms.PlatformSpec.cpu_barrier`: a part per thread), so past the
  threads that saturate memory more threads make a token slower;
* the LM head, and reading the token back.

No transfer, no synchronisation between devices and no hand-off to CPU workers is charged. The
interval draws the model's constants as the analytic profile's does
(:func:`~cope_core.profile.analytic.drawn_consts`) and widens by COPE's measured model error
(:mod:`cope_core.estimate.model_error`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from ..geometry import ModelGeometry
from ..parts import CpuPart, MemoryPart
from ..platforms import PlatformSpec, e_cores, host_bandwidths, with_kernel
from ..profile.analytic import (
    Consts,
    consts,
    cpu_expert,
    dense_block,
    drawn_consts,
    head,
    moe_block,
)
from .model_error import around_point, model_error
from .uncertainty import DEFAULT_DRAWS, LEVEL, check_draws

#: ggml thread barriers per block of a decode graph on the CPU: one after every node, one more
#: inside every matrix product (ggml-cpu.c ``ggml_graph_compute_thread``, ``ggml_compute_forward_
#: mul_mat``); llama.cpp issue #26200 counted about 2,000 per token of Qwen3-30B-A3B (48 blocks).
BARRIERS_PER_BLOCK = 42


@dataclass(frozen=True)
class CpuOnlyPrice:
    """Predicted time per output token on the CPU alone, microseconds, and its 95 % interval
    (None without draws)."""

    tpot_us: float
    tpot_ci_us: tuple[float, float] | None
    context: float


def host_spec(cpu: CpuPart, memory: MemoryPart) -> PlatformSpec:
    """A :class:`PlatformSpec` whose "GPU" is the host itself (its threads' FLOP/s and the
    memory's bandwidth), for the analytic constants of a CPU-only machine; a probed CPU's
    dot-product kernel (:func:`~cope_core.platforms.with_kernel`) comes with it."""
    mem_bw, core_bw = host_bandwidths(cpu, memory)
    return with_kernel(PlatformSpec(
        name=f"{cpu.name}+{memory.name} (CPU only)", gpu_name="none (CPU only)",
        gpu_flops=cpu.flops_per_thread * cpu.cores, gpu_bandwidth=mem_bw, link_name="none",
        link_bandwidth=mem_bw, cpu_name=cpu.name, cpu_cores=cpu.cores,
        cpu_flops_per_thread=cpu.flops_per_thread, cpu_bandwidth=mem_bw,
        cpu_bandwidth_per_thread=core_bw, **e_cores(cpu)), cpu.kernel)


def _on_host(c: Consts) -> Consts:
    """Constants whose device throughput is the CPU threads' (so the shared blocks' costs,
    written for the GPU, price them on the host): their weights, like the experts', stream
    through the dot-product kernels, at the probed kernel's rate where it is slower than the
    memory's."""
    return c._replace(gpu_flops=c.cpu_flops, gpu_bw=np.minimum(c.cpu_bw, c.cpu_stream_bw))


def host_tpot(g: ModelGeometry, c: Consts, context: float):
    """One token on the CPU alone (module docstring), microseconds; ``c`` from
    :func:`_on_host` (floats, or arrays of draws)."""
    experts = g.top_k * cpu_expert(g, c) + c.kernels_per_group * c.launch
    barriers = BARRIERS_PER_BLOCK * c.barrier
    return (g.dense_layers * (dense_block(g, c, context) + barriers)
            + g.n_layers * (moe_block(g, c, context) + experts + barriers) + head(g, c))


def spec_tpot(g: ModelGeometry, spec: PlatformSpec, threads: int, context: float) -> float:
    """:func:`host_tpot` at ``threads`` of a host spec (:func:`host_spec`, or one a refit
    moved: :mod:`cope_core.estimate.refit`), microseconds."""
    return float(host_tpot(g, _on_host(consts(spec, threads)), context))


def cpu_only_price(g: ModelGeometry, cpu: CpuPart, memory: MemoryPart, threads: int,
                   context: float, *, draws: int = DEFAULT_DRAWS, seed: int = 0) -> CpuOnlyPrice:
    """Predict decode on the CPU alone at ``threads`` and a KV cache of ``context`` tokens.

    Parameters
    ----------
    g : ModelGeometry
    cpu, memory : CpuPart, MemoryPart
        The host (:func:`cope_core.machine.compose_machine`'s ``cpu`` and ``memory``).
    threads : int
        CPU threads (more than the cores count as the cores).
    context : float
        Tokens in the KV cache each decode step reads (the mean over the decode).
    draws, seed : int
        Draws of the analytic constants for the interval (0: none).
    """
    draws = check_draws(draws)
    c = consts(host_spec(cpu, memory), threads)
    point = float(host_tpot(g, _on_host(c), context))
    if not draws:
        return CpuOnlyPrice(point, None, float(context))
    drawn = np.asarray(host_tpot(g, _on_host(drawn_consts(c, draws, np.random.default_rng(seed))),
                                 context), np.float64)
    lo, hi = around_point(np.array([point]), drawn[:, None], LEVEL, model_error().sigma("cope"))
    return CpuOnlyPrice(point, (float(lo[0]), float(hi[0])), float(context))


#: how much faster fewer threads must be predicted before the answer runs fewer than the cores
#: (a smaller gain is inside the model's own spread)
FEWER_THREADS_GAIN = 0.01


@dataclass(frozen=True)
class ThreadChoice:
    """The threads the CPU-only decode is fastest at by the model, beside the default's."""

    threads: int
    tpot_us: float
    default_threads: int
    default_tpot_us: float

    @property
    def fewer(self) -> bool:
        """Fewer threads than the default, predicted faster by more than
        :data:`FEWER_THREADS_GAIN`."""
        return (self.threads < self.default_threads
                and self.tpot_us < self.default_tpot_us * (1 - FEWER_THREADS_GAIN))


def best_threads(g: ModelGeometry, cpu: CpuPart, memory: MemoryPart, default: int,
                 context: float) -> ThreadChoice:
    """Every thread count from 1 to the cores a thread can land on (P-cores, then E-cores)
    priced on the CPU alone: past the threads that saturate memory the barriers make a token
    slower (module docstring), so the fastest may be fewer than the default."""
    spec = host_spec(cpu, memory)
    most = max(default, cpu.cores + (cpu.e_cores if cpu.e_flops_per_thread else 0))
    tpot = {t: spec_tpot(g, spec, t, context) for t in range(1, most + 1)}
    t = min(tpot, key=lambda x: (tpot[x], x))
    return ThreadChoice(t, tpot[t], default, tpot[default])


@lru_cache(maxsize=1)
def published_error() -> dict:
    """The CPU model's measured error on the published CPU A/Bs (tokens/s, ratios, and each
    memory-clock pair's predicted rise as a share of the measured one), as
    ``scripts/cpu_ab.py --write`` last scored it (``cope_core/estimate/data/cpu-ab-error.json``;
    docs/results.md#published-cpu-ab-sets)."""
    return json.loads((resources.files("cope_core.estimate") / "data" / "cpu-ab-error.json")
                      .read_text())
