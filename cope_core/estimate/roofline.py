"""Hierarchical roofline (after MoE-Lightning's HRM): operation time = max(FLOPs / peak FLOP/s,
bytes / bandwidth) on the device where it runs; a copy is bytes / link bandwidth; a layer is the
max of its copy, CPU and GPU parts (perfect overlap, no overheads, so zero experts cost zero).

It is the HRM estimator's arithmetic (:func:`cope_core.estimate.costs.hrm_costs`); an analytic
profile (:mod:`cope_core.profile.analytic`) on the spec of
:func:`cope_core.platforms.roofline_only` reduces to the same work terms, which the tests check.
"""
from __future__ import annotations

import numpy as np

from ..geometry import ModelGeometry
from ..matrix import Execution
from ..platforms import PlatformSpec
from ..profile.blocks import dense_block_work, moe_block_work

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


def _gpu_read_us(s: PlatformSpec, params: float, dtype_bytes: float, extra_bytes=0.0,
                 extra_flops=0.0) -> np.ndarray:
    """Weights of ``params`` read once with 2 FLOPs each, plus extra bytes and FLOPs, on the GPU."""
    flops = 2.0 * params + extra_flops
    return np.maximum(flops / s.gpu_flops, (params * dtype_bytes + extra_bytes)
                      / s.gpu_bandwidth) * US


def moe_block_us(g: ModelGeometry, s: PlatformSpec, context: np.ndarray | float) -> np.ndarray:
    """One MoE block's policy-invariant work on the GPU: attention over the KV cache (or the
    recurrent state) by architecture, the router and the shared experts
    (:func:`cope_core.profile.blocks.moe_block_work`)."""
    w = moe_block_work(g, context)
    return _gpu_read_us(s, w.params, g.weight_bytes_per_param, w.extra_bytes, w.extra_flops)


def dense_block_us(g: ModelGeometry, s: PlatformSpec, context: np.ndarray | float) -> np.ndarray:
    """One leading dense block on the GPU: attention and its FFN."""
    w = dense_block_work(g, context)
    return _gpu_read_us(s, w.params, g.weight_bytes_per_param, w.extra_bytes, w.extra_flops)


def head_us(g: ModelGeometry, s: PlatformSpec) -> float:
    """Final norm and LM head on the GPU (one embedding row is negligible)."""
    return float(_gpu_read_us(s, g.head_params, g.weight_bytes_per_param))


def shared_decode_us(g: ModelGeometry, s: PlatformSpec, context: np.ndarray | float) -> np.ndarray:
    """Policy-invariant per-token work on the GPU, composed from its parts: ``L`` MoE blocks,
    the leading dense blocks and the head, so that it follows the geometry's layer counts."""
    return (g.n_layers * moe_block_us(g, s, context)
            + g.dense_layers * dense_block_us(g, s, context) + head_us(g, s))
