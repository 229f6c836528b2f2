"""Analytic what-if profiles: every ``cope.profile/2`` row computed from published peak numbers,
achieved efficiencies and per-operation overheads, for hardware the user does not have. Such a
profile is marked ``analytic`` in its metadata and wherever it is shown; it is never a
measurement.

The pure roofline (:mod:`cope_core.estimate.roofline`, the HRM baseline) charges nothing for a
kernel launch, a synchronisation, a small copy or waking the CPU workers, and lets every lane
overlap perfectly, so splitting a layer's misses between CPU and GPU looks free. Here every
operation pays what a real runtime pays: each atomic row is its work at the achieved efficiency
plus its fixed latency, and each schedule row composes them in the order its execution strategy
imposes (what may overlap does, what must wait does). ``cope_core.platforms.roofline_only``
gives the spec on which this reduces to the roofline's work terms.

The model's own uncertainty is stated, not hidden: :func:`analytic_draws` re-prices the rows
under draws of the spec's constants (throughputs within ``THROUGHPUT_SPREAD``, latencies within
``LATENCY_SPREAD``, log-normal), shared by every row of a draw, so intervals and win
probabilities of analytic predictions say how much the pick depends on those constants.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..geometry import DEFAULT_CONTEXT, ModelGeometry
from ..matrix import Execution
from ..platforms import PlatformSpec
from ..weight_formats import cpu_efficiency
from .blocks import BlockWork, dense_block_work, moe_block_work
from .data import COLUMNS, PREFETCH_NAMES, Profile, ProfileKey, required_keys

DEFAULT_CONTEXTS = (128, 1024, 4096, 16384)
DEFAULT_SHARES = (20.0, 50.0, 80.0, 100.0)    # the paper's CUDA MPS sweep
US = 1e6
#: log-normal sigma of the model's throughput constants (efficiencies, link bandwidth) and of
#: its latencies (launch, synchronisation, transfer, CPU dispatch): docs/design.md
THROUGHPUT_SPREAD = 0.10
LATENCY_SPREAD = 0.30


class Consts(NamedTuple):
    """The numbers an analytic row depends on; each a float, or an array of draws."""

    gpu_flops: np.ndarray | float       # achieved, at the operating point's GPU share
    gpu_bw: np.ndarray | float
    link_bw: np.ndarray | float         # raw, for small transfers
    copy_bw: np.ndarray | float         # achieved, for an expert's weights
    cpu_flops: np.ndarray | float       # achieved, at the operating point's threads
    cpu_bw: np.ndarray | float
    cpu_mem_bw: np.ndarray | float      # achieved memory bandwidth, all threads
    cpu_lane_bw: np.ndarray | float     # achieved per-thread bandwidth times the threads
    cpu_stream_bw: np.ndarray | float   # weights a dot-product kernel streams from memory
    cpu_dot_bw: np.ndarray | float      # the threads' 16-bit kernel rate on cached weights
    launch: np.ndarray | float
    sync: np.ndarray | float
    link_latency: np.ndarray | float
    dispatch: np.ndarray | float
    barrier: np.ndarray | float         # one ggml thread barrier on the host, at the threads
    kernels_per_group: int
    kernels_per_block: int


def consts(spec: PlatformSpec, threads: int, share: float = 100.0) -> Consts:
    """The constants of one operating point (``share`` % of the GPU scales its throughput)."""
    s = spec.at_share(share)
    return Consts(gpu_flops=s.gpu_flops * s.gpu_efficiency,
                  gpu_bw=s.gpu_bandwidth * s.gpu_efficiency, link_bw=s.link_bandwidth,
                  copy_bw=s.link_bandwidth * s.link_efficiency,
                  cpu_flops=s.cpu_flops(threads) * s.cpu_efficiency,
                  cpu_bw=s.cpu_bw(threads) * s.cpu_efficiency,
                  cpu_mem_bw=s.cpu_bandwidth * s.cpu_efficiency,
                  cpu_lane_bw=s.cpu_bandwidth_per_thread * max(threads, 1) * s.cpu_efficiency,
                  cpu_stream_bw=(s.cpu_kernel_bw(threads) if s.cpu_kernel_bandwidth_per_thread
                                 else s.cpu_bandwidth) * s.cpu_efficiency,
                  # the probed kernel dots 8-bit weights: as a 16-bit rate, over Q8_0's ratio
                  cpu_dot_bw=s.cpu_kernel_cached(threads) * s.cpu_efficiency
                  / (cpu_efficiency("Q8_0") if s.cpu_kernel_cached_per_thread else 1.0),
                  launch=s.gpu_launch_us,
                  sync=s.gpu_sync_us, link_latency=s.link_latency_us,
                  dispatch=s.cpu_dispatch_us, barrier=s.cpu_barrier(threads),
                  kernels_per_group=s.gpu_kernels_per_expert_group,
                  kernels_per_block=s.gpu_kernels_per_block)


def drawn_consts(c: Consts, draws: int, rng: np.random.Generator) -> Consts:
    """``draws`` log-normal perturbations of every constant (one factor per constant per draw)."""
    def f(sigma: float) -> np.ndarray:
        return np.exp(rng.normal(0.0, sigma, draws))
    lat = LATENCY_SPREAD
    # one factor per efficiency: a GPU's FLOP/s and bandwidth, the link's two uses and the CPU's
    # two peaks move together within a draw
    gpu, link, cpu = f(THROUGHPUT_SPREAD), f(THROUGHPUT_SPREAD), f(THROUGHPUT_SPREAD)
    return c._replace(gpu_flops=c.gpu_flops * gpu, gpu_bw=c.gpu_bw * gpu,
                      link_bw=c.link_bw * link, copy_bw=c.copy_bw * link,
                      cpu_flops=c.cpu_flops * cpu, cpu_bw=c.cpu_bw * cpu,
                      cpu_mem_bw=c.cpu_mem_bw * cpu, cpu_lane_bw=c.cpu_lane_bw * cpu,
                      cpu_stream_bw=c.cpu_stream_bw * cpu, cpu_dot_bw=c.cpu_dot_bw * cpu,
                      launch=c.launch * f(lat), sync=c.sync * f(lat),
                      link_latency=c.link_latency * f(lat), dispatch=c.dispatch * f(lat),
                      barrier=c.barrier * f(lat))


#: each geometry's expert bytes and the bytes of each stored type summed over its layers, which
#: every row reads and a geometry recomputes over its layers at each read (a profile's rows read
#: them a thousand times); kept by identity with the (frozen) geometry itself, so that an id is
#: never reused while it is kept: hashing a geometry costs as much as the sums
_SUMS: dict[int, tuple[ModelGeometry, float, tuple[tuple[str, int], ...]]] = {}


def _sums(g: ModelGeometry) -> tuple[float, tuple[tuple[str, int], ...]]:
    """``g.expert_bytes`` and its stored types' bytes over every layer, in layer order."""
    kept = _SUMS.get(id(g))
    if kept is not None and kept[0] is g:
        return kept[1], kept[2]
    by_type: dict[str, int] = {}
    for x in g.expert_layers:
        for t, b in x.projections():
            by_type[t] = by_type.get(t, 0) + b
    if len(_SUMS) >= 64:
        _SUMS.clear()
    kept = (g, g.expert_bytes, tuple(by_type.items()))
    _SUMS[id(g)] = kept
    return kept[1], kept[2]


def _expert_bytes(g: ModelGeometry) -> float:
    return _sums(g)[0]


# --- atomic operations (µs) ---------------------------------------------------------------------
def gpu_experts(g: ModelGeometry, c: Consts, n: int):
    """``n`` routed experts for one token on the GPU: one launch group over the routed ids."""
    if n <= 0:
        return 0.0 * c.launch
    work = np.maximum(g.expert_flops / c.gpu_flops, _expert_bytes(g) / c.gpu_bw) * US
    return n * work + c.kernels_per_group * c.launch


def cpu_experts(g: ModelGeometry, c: Consts, n: int):
    """``n`` experts on the CPU workers, waking and joining them once."""
    if n <= 0:
        return 0.0 * c.dispatch
    return n * cpu_expert(g, c) + c.dispatch


def cpu_expert(g: ModelGeometry, c: Consts):
    """One expert on the CPU: its FLOPs, or its bytes as stored streamed at each projection's
    rate: what the dot-product kernel streams from memory, or the threads' 16-bit rate times
    the type's efficiency when fewer (docs/design.md#bytes-as-stored); a geometry stored in
    ``dtype_bytes`` streams at the 16-bit rate. Unprobed, the kernel's rates are the memory's
    and the per-thread bandwidths (``cpu_mem_bw``, ``cpu_lane_bw``), as before the probe."""
    if not g.expert_layers:
        stream = _expert_bytes(g) / np.minimum(c.cpu_stream_bw, c.cpu_dot_bw)
        return np.maximum(g.expert_flops / c.cpu_flops, stream) * US
    stream = sum(b / np.minimum(c.cpu_stream_bw, cpu_efficiency(t) * c.cpu_dot_bw)
                 for t, b in _sums(g)[1]) / g.n_layers
    return np.maximum(g.expert_flops / c.cpu_flops, stream) * US


def stage(g: ModelGeometry, c: Consts, n: int):
    """Copy ``n`` experts' weights to the GPU, one transfer each."""
    return n * (_expert_bytes(g) / c.copy_bw * US + c.link_latency)


def act_copy(g: ModelGeometry, c: Consts):
    """The token's activation to the host and the CPU experts' result back: two transfers."""
    return 2 * (g.hidden * g.dtype_bytes / c.link_bw * US + c.link_latency)


def merge(c: Consts):
    """Adding the CPU experts' result into the GPU's: one kernel."""
    return c.launch


def schedule(g: ModelGeometry, c: Consts, e: Execution, h: int, cpu: int, staged: int):
    """One MoE layer under execution ``e``: ``h`` resident experts, ``cpu`` on the CPU,
    ``staged`` copied and run on the GPU; lanes overlap only where the strategy lets them."""
    R = gpu_experts(g, c, h)
    joins = cpu > 0 or staged > 0
    F = c.sync if joins else 0.0 * c.sync
    if cpu > 0:
        cpu_lane = cpu_experts(g, c, cpu) + act_copy(g, c)
        M = merge(c)
    else:
        cpu_lane, M = 0.0, 0.0
    if e is Execution.WAIT_THEN_GPU:        # every miss copied first, then all GPU work
        return stage(g, c, staged) + F + gpu_experts(g, c, h + staged)
    # parallel, ready_first and cost_selected: resident work, CPU work and copies overlap;
    # staged experts run after their copy and after the resident ones
    first = np.maximum(np.maximum(R, cpu_lane), stage(g, c, staged))
    return first + gpu_experts(g, c, staged) + F + M


def predictor(c: Consts):
    """The next layer's prediction: two small kernels (router of the next layer, top-k)."""
    return 2 * c.launch


def insertion(g: ModelGeometry, c: Consts):
    """One inserted expert on the copy stream: the slot index update (a small transfer of the
    layer's expert-to-slot map, which the GPU's routed kernels read) and then the weights.
    The eviction itself is a choice on the host, launched with the prediction; it moves no
    data."""
    return c.link_latency + stage(g, c, 1)


def prefetch_beside(g: ModelGeometry, c: Consts, cpu: int):
    """One inserted prefetch beside a ``parallel`` layer that computes ``cpu`` of its routed
    experts on the CPU (the profiler's ``prefetch`` rows with ``cpu = c``): the layer with the
    copy issued at its start, the next block's shared work and the next layer's wait for the
    copy, less the same without the copy.

    The copy runs on the link while the resident experts run on the GPU and the misses on the
    CPU, so it hides behind the longer of the two lanes, the layer's join and the next block.
    The copy and the CPU experts both read host memory: the DMA engine reads each copied byte
    once at ``copy_bw``, the CPU lane reads its experts' bytes at the rate its own cost implies.
    While both run, a demand above the host's achieved bandwidth (``cpu_mem_bw``) slows both in
    proportion (fluid sharing); whichever ends first frees the bandwidth for the other. Below
    that bandwidth nothing slows; what the CPU lane loses is charged when it is the layer's
    critical path (docs/design.md#prefetch-beside-cpu-misses)."""
    k = g.top_k
    R = gpu_experts(g, c, k - cpu)
    per = cpu_expert(g, c)
    b = cpu * per                                     # the CPU lane's expert work, alone
    lane = cpu_experts(g, c, cpu) + act_copy(g, c)
    a = _expert_bytes(g) / c.copy_bw * US             # the weights' transfer, alone
    demand = cpu * _expert_bytes(g) / b + c.copy_bw / US    # bytes per µs
    s = np.minimum(1.0, c.cpu_mem_bw / US / demand)
    both = np.minimum(a, b) / s                       # both running, slowed by s
    # the insertion's fixed latencies (index update, transfer) on top of the shared transfer
    copy_end = np.where(a <= b, both, both + (a - b)) + (insertion(g, c) - a)
    cpu_end = np.where(b <= a, both, both + (b - a))
    lane_with = lane + (cpu_end - b)
    layer, layer_with = np.maximum(R, lane), np.maximum(R, lane_with)
    window = layer_with + c.sync + merge(c) + moe_block(g, c, DEFAULT_CONTEXT)
    return (predictor(c) + c.sync + (layer_with - layer)
            + np.maximum(copy_end - window, 0.0))


def moe_block(g: ModelGeometry, c: Consts, ctx: float):
    return _gpu_block(g, c, moe_block_work(g, ctx))


def dense_block(g: ModelGeometry, c: Consts, ctx: float):
    return _gpu_block(g, c, dense_block_work(g, ctx))


def head(g: ModelGeometry, c: Consts):
    """Final norm and LM head, and the synchronisation that reads the next token back."""
    p = g.head_params
    work = np.maximum(2.0 * p / c.gpu_flops, p * g.weight_bytes_per_param / c.gpu_bw) * US
    return work + 2 * c.launch + c.sync


def _gpu_block(g: ModelGeometry, c: Consts, w: BlockWork):
    """A block's work by its architecture (:mod:`cope_core.profile.blocks`) plus its launches."""
    flops = 2.0 * w.params + w.extra_flops
    work = np.maximum(flops / c.gpu_flops,
                      (w.params * g.weight_bytes_per_param + w.extra_bytes) / c.gpu_bw) * US
    return work + c.kernels_per_block * c.launch


def row_cost(g: ModelGeometry, c: Consts, key: ProfileKey):
    """The cost of one profile row (a float, or an array of draws)."""
    kind, name, hits, cpu, staged, count, context = key
    k = g.top_k
    if kind == "shared":
        return {"moe_block": lambda: moe_block(g, c, context),
                "dense_block": lambda: dense_block(g, c, context),
                "head": lambda: head(g, c)}[name]()
    if kind == "schedule":
        return schedule(g, c, Execution(name), hits, cpu, staged)
    if kind == "prefetch":
        if cpu >= 1:
            return prefetch_beside(g, c, cpu)
        # as profiled: a fully resident layer, the next block's shared work and the next
        # layer's wait for ``count`` experts copied meanwhile, less the same without the copy;
        # the predictor's two small kernels are paid either way
        if count == 0:
            return predictor(c)
        window = gpu_experts(g, c, k) + moe_block(g, c, DEFAULT_CONTEXT)
        return predictor(c) + np.maximum(count * insertion(g, c) - window, 0.0) + c.sync
    if kind == "layer":
        if name == "cpu_layer":
            return cpu_experts(g, c, k) + act_copy(g, c) + c.sync + merge(c)
        return gpu_experts(g, c, k)
    return {
        "gpu_expert": lambda: gpu_experts(g, c, count),
        "staged_gpu_expert": lambda: gpu_experts(g, c, count),
        "cpu_expert": lambda: cpu_experts(g, c, count),
        "stage": lambda: stage(g, c, count),
        "act_copy": lambda: act_copy(g, c),
        "prefetch": lambda: insertion(g, c),
        "sync": lambda: c.sync,
        "merge": lambda: merge(c),
    }[name]()


def default_threads(spec: PlatformSpec) -> list[int]:
    return sorted({t for t in (1, 2, 4, 8, 16, 32, 64) if t <= spec.cpu_cores} | {spec.cpu_cores})


def _keys(model: ModelGeometry, contexts: Sequence[int]) -> list[ProfileKey]:
    keys = []
    for ctx in contexts:  # shared work per part: it composes into any layer count
        keys.append(ProfileKey("shared", "moe_block", context=int(ctx)))
        if model.dense_layers:
            keys.append(ProfileKey("shared", "dense_block", context=int(ctx)))
    keys.append(ProfileKey("shared", "head"))
    # one inserted prefetch beside every CPU-miss count: computed, so none is interpolated
    beside = [ProfileKey("prefetch", n, cpu=cpu, count=1) for n in PREFETCH_NAMES
              for cpu in range(1, model.top_k + 1)]
    return keys + required_keys(model.top_k) + beside


def analytic_profile(model: ModelGeometry, spec: PlatformSpec,
                     cpu_threads: Sequence[int] | None = None,
                     contexts: Sequence[int] = DEFAULT_CONTEXTS,
                     gpu_shares: Sequence[float] = DEFAULT_SHARES) -> Profile:
    """A complete profile whose every cost comes from the analytic model of ``spec``.

    Parameters
    ----------
    model : ModelGeometry
    spec : PlatformSpec
        Published or user-given peak numbers, efficiencies and overheads.
    cpu_threads : sequence of int, optional
        CPU-thread operating points; default powers of two up to the core count.
    contexts : sequence of int
        Contexts at which the shared work of one MoE (and dense) block is given.
    gpu_shares : sequence of float
        GPU shares (CUDA MPS, %) of the operating points: throughput scales, latencies do not.
    """
    threads_list = list(cpu_threads) if cpu_threads else default_threads(spec)
    keys = _keys(model, contexts)
    rows = []
    for t in threads_list:
        for share in gpu_shares:
            c = consts(spec, t, share)
            for key in keys:
                us = float(row_cost(model, c, key))
                rows.append((*key, t, float(share), us, us, us, 1))
    table = pd.DataFrame(rows, columns=list(COLUMNS)).astype(COLUMNS)
    platform = {"gpu": spec.gpu_name, "cpu": spec.cpu_name, "link": spec.link_name,
                "torch": None, "host": "analytic", "spec": spec.to_dict()}
    return Profile(table=table, model=model, platform=platform,
                   created=datetime.now(UTC).isoformat(timespec="seconds"),
                   notes=f"ANALYTIC what-if profile of {spec.name}: costs from {spec.source} peak "
                         "numbers with achieved efficiencies and per-operation overheads "
                         "(docs/design.md#overheads-and-efficiencies), not measured",
                   analytic=True)


def analytic_draws(model: ModelGeometry, spec: PlatformSpec, rows: pd.DataFrame, draws: int,
                   rng: np.random.Generator) -> np.ndarray:
    """``(rows, draws)`` costs of one operating point's rows under draws of the constants."""
    t, share = int(rows["cpu_threads"].iloc[0]), float(rows["gpu_share"].iloc[0])
    c = drawn_consts(consts(spec, t, share), draws, rng)
    keys = [ProfileKey(*k) for k in rows[list(ProfileKey._fields)].itertuples(index=False)]
    out = np.empty((len(keys), draws))
    for i, key in enumerate(keys):
        out[i] = row_cost(model, c, key)
    return out


def analytic_for_model(profile: Profile, model: ModelGeometry) -> Profile:
    """The same analytic what-if priced for another model (e.g. the quantised file a user
    runs): the profile's spec, CPU threads, GPU shares and contexts, every row computed anew.
    A measured profile cannot be re-priced and is refused."""
    from ..errors import CopeInputError
    spec = (profile.platform or {}).get("spec")
    if not profile.analytic or not isinstance(spec, dict):
        raise CopeInputError("a measured profile prices the model it timed; only an analytic "
                             "profile (with its spec) can be re-priced for another model",
                             source=profile.path, field="analytic")
    t = profile.table
    ctx = sorted({int(c) for c in t.loc[t["kind"] == "shared", "context"] if c >= 0})
    return analytic_profile(model, PlatformSpec.from_dict(spec),
                            cpu_threads=sorted({int(x) for x in t["cpu_threads"]}),
                            contexts=ctx or DEFAULT_CONTEXTS,
                            gpu_shares=sorted({float(x) for x in t["gpu_share"]}))
