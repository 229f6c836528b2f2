"""Hierarchical roofline (after MoE-Lightning's HRM): operation time = max(FLOPs / peak FLOP/s,
bytes / bandwidth) on the device where it runs; a copy is bytes / link bandwidth; a layer is the
max of its copy, CPU and GPU parts (perfect overlap, no overheads, so zero experts cost zero).

Both the HRM estimator and ``cope profile --analytic`` use these functions, so an analytic
profile and the HRM baseline agree by construction.
"""
from __future__ import annotations

import numpy as np

from .geometry import ModelGeometry
from .matrix import Execution
from .platforms import PlatformSpec

US = 1e6


def gpu_experts_us(g: ModelGeometry, s: PlatformSpec, n: int) -> float:
    """``n`` experts computed on the GPU for one token."""
    return n * max(g.expert_flops / s.gpu_flops, g.expert_bytes / s.gpu_bandwidth) * US


def cpu_experts_us(g: ModelGeometry, s: PlatformSpec, n: int, threads: int) -> float:
    """``n`` experts computed on ``threads`` CPU threads for one token."""
    return n * max(g.expert_flops / s.cpu_flops(threads), g.expert_bytes / s.cpu_bw(threads)) * US


def copy_experts_us(g: ModelGeometry, s: PlatformSpec, n: int) -> float:
    """Host-to-device copy of ``n`` experts' weights."""
    return n * g.expert_bytes / s.link_bandwidth * US


def act_copy_us(g: ModelGeometry, s: PlatformSpec) -> float:
    """One token's activation to the host and the expert result back."""
    return 2 * g.hidden * g.dtype_bytes / s.link_bandwidth * US


def layer_us(g: ModelGeometry, s: PlatformSpec, threads: int, h: int, c: int, u: int,
             prefetched: int = 0) -> float:
    """One MoE layer: ``h`` resident experts on the GPU, ``c`` on the CPU, ``u`` staged and run
    on the GPU, plus ``prefetched`` experts copied for the next layer on the same link."""
    copy = copy_experts_us(g, s, u + prefetched) + (act_copy_us(g, s) if c > 0 else 0.0)
    return max(copy, cpu_experts_us(g, s, c, threads), gpu_experts_us(g, s, h + u))


def execution_split(execution: Execution, h: int, top_k: int,
                    cpu: int | None = None) -> tuple[int, int]:
    """Misses ``(c, u)`` on the CPU and staged, for an execution at ``h`` hits.

    ``cpu`` is the cost-selected split's CPU share (chosen from the profile by COPE).
    """
    m = top_k - h
    if execution is Execution.PARALLEL:
        return m, 0
    if execution is Execution.COST_SELECTED:
        if cpu is None or not 0 <= cpu <= m:
            raise ValueError(f"cost_selected needs a CPU share in [0, {m}], got {cpu}")
        return cpu, m - cpu
    return 0, m


def shared_decode_us(g: ModelGeometry, s: PlatformSpec, context: np.ndarray | float) -> np.ndarray:
    """Policy-invariant per-token work on the GPU: every non-expert weight but the input
    embedding table is read once (one embedding row is negligible), attention reads the KV cache,
    and the non-expert matmuls do 2 FLOPs per weight."""
    ctx = np.asarray(context, dtype=np.float64)
    weights = g.non_expert_bytes - g.vocab * g.hidden * g.dtype_bytes
    blocks = g.n_layers + g.dense_layers
    kv_bytes = 2.0 * blocks * g.n_kv_heads * g.head_dim * g.dtype_bytes * ctx
    flops = 2.0 * weights / g.dtype_bytes + 4.0 * blocks * g.n_heads * g.head_dim * ctx
    return np.maximum(flops / s.gpu_flops, (weights + kv_bytes) / s.gpu_bandwidth) * US
