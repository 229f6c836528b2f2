"""llama.cpp's own MoE expert cache as candidates: priced from the profile, searched over its
three knobs at a VRAM budget, and compared with the Policy Matrix
(docs/design.md#llamacpp-moe-cache).

Which profile rows price which part, per token:

* a cached layer's lookup with ``h`` hits, ``c`` misses computed on the CPU and ``u = top_k - h
  - c`` uploads is the ``cost_selected`` schedule row at ``(h, c, u)`` (hits on the GPU, ``u``
  experts copied and run on the GPU, ``c`` on the CPU, overlapped), plus one ``sync``: upstream
  reads the selected expert ids back to the host before it can plan the uploads
  (``llama_moe_cache::copy``, a synchronous read per cached layer);
* a host layer that is not cached (no cache, or its group's share holds fewer than ``top_k``
  slots) is ``cpu_layer`` plus llama.cpp's graph hand-offs around it (:func:`split_handoff`);
  a GPU layer is ``gpu_layer`` (as ``layer_partition`` prices them);
* the shared work is the same as every candidate's.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...errors import CopeInputError
from ...estimate.costs import cope_costs
from ...estimate.predict import candidate_tpot, counts_at, replay_counts
from ...estimate.uncertainty import drawn_point, percentile_interval, prompt_bootstrap
from ...geometry import GIB, ModelGeometry
from ...matrix import EXECUTIONS, Execution, Residency, get_candidate, residencies_of
from ...placement import gpu_expert_bytes, layer_plan
from ...profile.data import Profile
from ...profile.layout import OperatingPoint
from ...replay.engine import ReplayCounts
from ...trace.data import Trace
from .cache_cliff import below_cliff
from .moe_cache import (
    TUNER_SHARES,
    CacheConfig,
    CacheCounts,
    CacheVersion,
    cache_layout,
    cache_mib_for_bytes,
    replay_cache,
)

#: the label of these rows wherever the Policy Matrix is shown
CACHE_LABEL = "llama.cpp MoE cache"
PREFIX = "llamacpp_cache/"
#: the candidates: one per eviction rule; a configuration without a cache is layer_partition
CACHE_CANDIDATES = tuple(PREFIX + v.value for v in CacheVersion)
_C = EXECUTIONS.index(Execution.COST_SELECTED)


def config_candidate(config: CacheConfig) -> str:
    """``llamacpp_cache/lru`` or ``/classlru``; ``layer_partition`` without a cache."""
    return PREFIX + config.version.value if config.cache_mib else "layer_partition"


@dataclass(frozen=True, eq=False)
class CacheCosts:
    """Costs in microseconds (leading draw dimensions allowed, as :class:`LayerCosts`).

    ``lookup[..., h, c]``: one cached layer at ``h`` hits and ``c`` CPU misses (0 where
    ``h + c > top_k``, which never occurs)."""

    lookup: np.ndarray
    cpu_layer: np.ndarray
    gpu_layer: np.ndarray


def cache_costs(op: OperatingPoint) -> CacheCosts:
    """The rows of one operating point (point or drawn) that price the cache."""
    k = op.top_k
    h = np.arange(k + 1)[:, None]
    c = np.arange(k + 1)[None, :]
    sched = np.asarray(op.schedule)[..., _C, :, :]
    sync = np.asarray(op.sync, np.float64)[..., None, None]
    lookup = np.where(h + c <= k, np.nan_to_num(sched) + sync, 0.0)
    return CacheCosts(lookup, np.asarray(op.cpu_layer, np.float64) + split_handoff(op),
                      np.asarray(op.gpu_layer, np.float64))


def split_handoff(op: OperatingPoint) -> np.ndarray:
    """What llama.cpp's scheduler adds to a CPU expert layer beyond the profile's ``cpu_layer``
    (docs/design.md#llamacpp-graph-splits): one more ``act_copy`` and one more ``sync``.

    A CPU expert layer cuts the decode graph twice (4 + 2 N splits per token at ``--n-cpu-moe``
    N, nibor1896/Crow#159). ``ggml_backend_sched_compute_splits`` (ggml/src/ggml-backend.cpp of
    b11434, lines 1802-1994) copies each input of a split from the backend that produced it:
    the CPU split reads three tensors from the GPU (the normalised activation, the selected
    expert ids and their weights), each a synchronous copy, since the CPU backend has no
    ``cpy_tensor_async`` (lines 1939-1948; ggml-cpu.cpp line 200), and the next GPU split reads
    the experts' sum back, also synchronously, since ``ggml_backend_cuda_cpy_tensor_async``
    refuses a host source (ggml-cuda.cu lines 2544-2554); each boundary waits for the other
    side. So four small transfers and two waits where ``cpu_layer`` has two and one."""
    return (np.asarray(op.act_copy, np.float64) + np.asarray(op.sync, np.float64))


def expert_tpot(counts: CacheCounts, costs: CacheCosts, tokens: np.ndarray) -> np.ndarray:
    """Per-prompt expert cost per token of every configuration, shape ``(..., configs, P)``."""
    cached = np.einsum("...hc,nphc->...np", costs.lookup, counts.cnt.astype(np.float64))
    cached = cached / np.asarray(tokens, np.float64)
    n_gpu = np.array([lay.n_gpu for lay in counts.layouts], np.float64)
    host = np.array([lay.uncached_cpu_layers for lay in counts.layouts], np.float64)
    return cached + _placed(costs, n_gpu, host)[..., None]


def _placed(costs: CacheCosts, n_gpu: np.ndarray, n_host: np.ndarray) -> np.ndarray:
    """Expert cost per token of layers placed whole: ``n_gpu`` on the GPU, ``n_host`` on the
    CPU (as ``layer_partition`` prices them), shape ``(..., len(n_gpu))``."""
    return n_gpu * costs.gpu_layer[..., None] + n_host * costs.cpu_layer[..., None]


def placement_tpot(profile: Profile, model: ModelGeometry, n_cpu: Sequence[float],
                   context: float, *, cpu_threads: int | None = None,
                   gpu_share: float | None = None) -> np.ndarray:
    """TPOT in microseconds of llama.cpp's plain ``--n-cpu-moe`` placements (no cache): the
    routed experts of the first ``n`` MoE layers on the CPU, the rest on the GPU, one token at
    ``context``. No trace is needed: every routed expert runs where its layer is.

    Parameters
    ----------
    profile : Profile
    model : ModelGeometry
        The geometry priced (e.g. the quantised file run).
    n_cpu : sequence of float
        MoE layers on the CPU, each in ``[0, n_layers]`` (fit's placement may leave a fraction
        of a layer's experts there).
    context : float
        Tokens in the context while decoding (the shared work's attention).
    """
    n = np.asarray(list(n_cpu), np.float64)
    if n.size == 0 or (n < 0).any() or (n > model.n_layers).any():
        raise CopeInputError(f"--n-cpu-moe layers must be in [0, {model.n_layers}], got "
                             f"{list(n_cpu)}", field="n_cpu_moe")
    shared, gpu_layer, cpu_layer = placement_parts(profile, model, context,
                                                   cpu_threads=cpu_threads, gpu_share=gpu_share)
    return shared + (model.n_layers - n) * gpu_layer + n * cpu_layer


def placement_parts(profile: Profile, model: ModelGeometry, context: float, *,
                    cpu_threads: int | None = None, gpu_share: float | None = None
                    ) -> tuple[float, float, float]:
    """What :func:`placement_tpot` adds up, in microseconds per token: the shared work of every
    block at ``context``, one MoE layer's routed experts on the GPU, and on the CPU (with
    llama.cpp's split hand-off)."""
    op = profile.resolve(cpu_threads, gpu_share, model=model)
    costs = cache_costs(op)
    return (float(cope_costs(op).shared_at(np.array([float(context)]))[0]),
            float(costs.gpu_layer), float(costs.cpu_layer))


def search_space(g: ModelGeometry, budget_bytes: float, *,
                 versions: Sequence[CacheVersion] = tuple(CacheVersion),
                 shares: Sequence[float] = TUNER_SHARES, n_cpu: Sequence[int] | None = None,
                 cache_mib: Sequence[int] | None = None) -> list[CacheConfig]:
    """Every configuration that fits ``budget_bytes`` of VRAM for routed experts.

    Per ``--n-cpu-moe`` (every one whose GPU layers fit, or those of ``n_cpu``): the placement
    alone (no cache), and the cache with the most MiB the rest of the budget holds (or each of
    ``cache_mib`` that fits) under each eviction rule and, for the class-LRU, each CPU share.
    The search's own size is never below the cliff (``llamacpp.cache_cliff.below_cliff``: some
    cached layer could not hit); sizes given in ``cache_mib`` are kept (a sweep shows them)."""
    if not np.isfinite(budget_bytes):
        raise CopeInputError(f"expected a finite budget, got {budget_bytes!r}", field="vram")
    L = g.n_layers
    ns = range(L + 1) if n_cpu is None else sorted(set(int(n) for n in n_cpu))
    out: list[CacheConfig] = []
    for n in ns:
        if not 0 <= n <= L:
            raise CopeInputError(f"--n-cpu-moe layers must be in [0, {L}], got {n}",
                                 field="n_cpu_moe")
        free = budget_bytes - gpu_expert_bytes(g, n)
        if free < 0:
            continue
        out.append(CacheConfig(n, 0, 0.0, CacheVersion.LRU))
        if n == 0:
            continue
        mibs = [cache_mib_for_bytes(g, n, free)] if cache_mib is None else [
            m for m in cache_mib if cache_layout(g, n, int(m)).alloc_bytes <= free]
        for mib in sorted(set(int(m) for m in mibs if m > 0)):
            layout = cache_layout(g, n, mib)
            if not layout.cached_layers:
                continue            # every group below top_k slots: the cache holds nothing
            for v in versions:
                for f in (shares if v.share_build else (0.0,)):
                    if cache_mib is None and below_cliff(g, layout, v, f):
                        continue
                    out.append(CacheConfig(n, mib, float(f), v))
    if not out:
        raise CopeInputError(
            f"the budget leaves {budget_bytes / GIB:.2f} GiB for routed experts: no "
            "--n-cpu-moe fits" + ("" if n_cpu is None else f" among {list(ns)}"), field="vram")
    return out


@dataclass(frozen=True, eq=False)
class CacheSearch:
    """llama.cpp's space priced at one operating point.

    ``frame``: one row per configuration (columns in :func:`search`); ``counts`` the replay."""

    frame: pd.DataFrame
    counts: CacheCounts

    def subset(self, keep: np.ndarray) -> CacheSearch:
        """The rows where ``keep`` is true (a build's share of the space), numbered afresh, with
        their replay counts."""
        idx = np.flatnonzero(np.asarray(keep, bool))
        if idx.size == 0:
            raise CopeInputError("no configuration of the search runs on this build",
                                 field="--llamacpp")
        frame = self.frame.iloc[idx].reset_index(drop=True)
        frame.attrs.update(self.frame.attrs)
        c = self.counts
        return CacheSearch(frame, CacheCounts(tuple(c.configs[i] for i in idx),
                                              tuple(c.layouts[i] for i in idx), c.cnt[idx]))

    def best(self) -> pd.DataFrame:
        """The fastest configuration of each candidate (the cache rules and layer_partition),
        fastest first; ties to the earlier row (fewer host layers, smaller cache, lower share).
        A size below the cliff (``below_cliff``) is never one of them."""
        df = self.frame[~self.frame["below_cliff"]]
        idx = df.groupby("candidate", sort=False)["tpot_us"].idxmin()
        return df.loc[idx].sort_values("tpot_us", kind="stable")


def search_cache(trace: Trace, profile: Profile, budget_bytes: float, *,
           cpu_threads: int | None = None, gpu_share: float | None = None,
           versions: Sequence[CacheVersion] = tuple(CacheVersion),
           shares: Sequence[float] = TUNER_SHARES, n_cpu: Sequence[int] | None = None,
           cache_mib: Sequence[int] | None = None, persist: bool = True) -> CacheSearch:
    """Replay and price every configuration of :func:`search_space` over ``trace``.

    Returns
    -------
    CacheSearch
        ``frame`` columns: ``candidate, version, build, n_cpu, n_cpu_moe, cache_mib,
        cpu_share, slots, cached_layers, host_layers_uncached, cache_bytes, tpot_us, shared_us,
        experts_us, hits, uploads, cpu_misses`` (per token, summed over layers), ``hit_rate``
        (of the cached layers' lookups), ``below_cliff`` (a size some cached layer cannot hit
        at, :func:`cope_core.llamacpp.cache.cache_cliff.below_cliff`), ``prompt_tpot_us``.
    """
    g = trace.model
    configs = search_space(g, budget_bytes, versions=versions, shares=shares, n_cpu=n_cpu,
                           cache_mib=cache_mib)
    counts = replay_cache(trace, configs, persist=persist)
    op = profile.resolve(cpu_threads, gpu_share, model=g)
    costs = cache_costs(op)
    tokens = trace.tokens_per_prompt
    shared = cope_costs(op).shared_per_prompt(trace.context, trace.prompt_start)
    tpot = expert_tpot(counts, costs, tokens) + shared
    per = counts.per_token(tokens)
    rows = []
    for i, (cfg, lay) in enumerate(zip(configs, counts.layouts)):
        lookups = len(lay.cached_layers) * g.top_k
        rows.append({
            "candidate": config_candidate(cfg),
            "version": cfg.version.value if cfg.cache_mib else "",
            "build": _build(cfg), "n_cpu": cfg.n_cpu,
            "n_cpu_moe": g.dense_layers + cfg.n_cpu if cfg.n_cpu else 0,
            "cache_mib": cfg.cache_mib, "cpu_share": cfg.cpu_share, "slots": lay.n_slots,
            "cached_layers": len(lay.cached_layers),
            "host_layers_uncached": lay.uncached_cpu_layers, "cache_bytes": lay.alloc_bytes,
            "tpot_us": float(tpot[i].mean()), "shared_us": float(shared.mean()),
            "experts_us": float((tpot[i] - shared).mean()),
            "hits": float(per["hits"][i].mean()), "uploads": float(per["uploads"][i].mean()),
            "cpu_misses": float(per["cpu_misses"][i].mean()),
            "hit_rate": float(per["hits"][i].mean() / lookups) if lookups else float("nan"),
            "below_cliff": bool(cfg.cache_mib) and below_cliff(g, lay, cfg.version,
                                                                cfg.cpu_share),
            "prompt_tpot_us": tpot[i]})
    frame = pd.DataFrame(rows)
    frame.attrs.update(cpu_threads=op.cpu_threads, gpu_share=op.gpu_share,
                       budget_bytes=float(budget_bytes), persist=persist,
                       analytic=bool(profile.analytic))
    return CacheSearch(frame, counts)


def _build(cfg: CacheConfig) -> str:
    if not cfg.cache_mib:
        return ""
    return cfg.version.share_build or "" if cfg.cpu_share else cfg.version.build


@dataclass(frozen=True)
class Contender:
    """One policy's TPOT with its 95 % interval, and how often the best cache beats it."""

    name: str
    tpot_us: float
    lo_us: float
    hi_us: float
    cache_faster: float | None


def compare(search_result: CacheSearch, trace: Trace, profile: Profile,
            matrix_winner: str | None = None, *, calibration: Trace | None = None,
            experts_per_layer: int | None = None, draws: int = 1000, seed: int = 0,
            raw_samples: Mapping[str, Sequence[float]] | None = None,
            counts: Mapping[Residency, ReplayCounts] | None = None,
            baseline: tuple[str, float] | None = None) -> list[Contender]:
    """The fastest configuration llama.cpp can run (first) against ``layer_partition`` at
    ``experts_per_layer`` (when that is another configuration) and the Policy Matrix's winner,
    under the same paired draws of the profile and a bootstrap of the prompts
    (docs/design.md#uncertainty). With a persistent cache a prompt's counts depend on the
    prompts before it; the bootstrap treats them as independent. ``counts``: the Policy Matrix's
    replay at ``experts_per_layer`` when the caller has it (else the winner's is replayed).
    ``baseline``: a name and the MoE layers' worth of routed experts it keeps in host memory
    (llama.cpp's default, ``--fit``), priced as placed layers and compared last."""
    df = search_result.frame
    threads, share = df.attrs["cpu_threads"], df.attrs["gpu_share"]
    rng = np.random.default_rng(seed)
    dp = drawn_point(profile, threads, share, draws, rng, raw_samples, trace.model) \
        if draws else None
    op = profile.resolve(threads, share, model=trace.model)
    tokens = trace.tokens_per_prompt
    # the shared work of every candidate, per prompt, at the medians and in each draw
    lc = cope_costs(op)
    dl = None if dp is None else cope_costs(dp, lc.split)
    shared = lc.shared_per_prompt(trace.context, trace.prompt_start)
    shared_d = None if dl is None else dl.shared_per_prompt(trace.context, trace.prompt_start)

    names: list[str] = []
    point_t: list[np.ndarray] = []
    drawn_t: list[np.ndarray] = []
    i_best = int(search_result.best().index[0])
    lp = df[(df["cache_mib"] == 0)]
    if experts_per_layer is not None:     # the plain placement at K's bytes (placement.py)
        lp = lp[lp["n_cpu"] == layer_plan(trace.model, experts_per_layer).n_cpu]
    rows = [i_best] + ([int(lp["tpot_us"].idxmin())] if len(lp) else [])
    sub = CacheCounts(tuple(search_result.counts.configs[i] for i in rows),
                      tuple(search_result.counts.layouts[i] for i in rows),
                      search_result.counts.cnt[rows])
    point = expert_tpot(sub, cache_costs(op), tokens) + shared
    drawn = None if dp is None or shared_d is None else (
        expert_tpot(sub, cache_costs(dp), tokens) + shared_d[:, None])
    at_k = "" if experts_per_layer is None else f" at K = {experts_per_layer}"
    names += [str(df.loc[i_best, "candidate"])] + ([f"layer_partition{at_k}"] if len(lp) else [])
    point_t += list(point)
    drawn_t += [] if drawn is None else list(np.moveaxis(drawn, 1, 0))
    if matrix_winner not in (None, "layer_partition") and experts_per_layer is not None:
        cand = get_candidate(matrix_winner)
        if counts is None:
            counts = replay_counts(trace, calibration, [experts_per_layer],
                                   residencies_of([cand]))
        else:
            counts = counts_at(dict(counts), np.array([experts_per_layer]))
        part = candidate_tpot(trace, counts, lc, cand, 0, experts_per_layer)
        names.append(f"the Policy Matrix's winner {matrix_winner}")
        point_t.append(shared + part.experts + part.prefetch)
        if dl is not None and shared_d is not None:
            dpart = candidate_tpot(trace, counts, dl, cand, 0, experts_per_layer)
            drawn_t.append(shared_d + dpart.experts + dpart.prefetch)
    if baseline is not None:            # a placement without a cache: layers placed whole
        host = np.array([baseline[1]], np.float64)
        names.append(baseline[0])
        point_t.append(shared + _placed(cache_costs(op), trace.model.n_layers - host, host)[0])
        if dp is not None and shared_d is not None:
            drawn_t.append(shared_d + _placed(cache_costs(dp), trace.model.n_layers - host,
                                              host))
    if not draws:
        return [Contender(n, float(t.mean()), float("nan"), float("nan"), None)
                for n, t in zip(names, point_t)]
    means, _ = prompt_bootstrap(drawn_t if drawn_t else point_t, draws, rng)  # (draws, n)
    lo, hi = percentile_interval(means, np.array([t.mean() for t in point_t]), "cope")
    out = []
    for j, name in enumerate(names):
        # the placement at K may be the best configuration itself: then no "faster in" share
        same = j < len(rows) and rows[j] == i_best
        faster = None if same else float((means[:, 0] < means[:, j]).mean())
        out.append(Contender(name, float(point_t[j].mean()), float(lo[j]), float(hi[j]), faster))
    return out

