"""Cached computations of the explorer's pages (Streamlit layer): predictions at one K and over
every K (the replay cached apart from the pricing), predicted-vs-measured pairs, what-if
profiles, policies for export and trace statistics.

Every cached function takes the dataset's ``key`` (paths and modification stamps of its files)
and the dataset itself as ``_ds``, which Streamlit does not hash: equal keys mean equal inputs."""
from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pandas as pd
import streamlit as st

from ..estimate.compare import Comparison, compare
from ..estimate.costs import estimators_for
from ..estimate.evaluate import Evaluation, evaluate
from ..estimate.predict import OptimisticPredictionWarning, price, replay_counts
from ..estimate.quality import measurement_checks
from ..estimate.uncertainty import DEFAULT_DRAWS
from ..geometry import GIB, ModelGeometry
from ..llamacpp import (
    CacheVersion,
    Request,
    cache_mib_for_bytes,
    cliff_mib,
    parse_build,
    search_cache,
    selection_rates,
    ttft_by_experts,
)
from ..matrix import Residency, residencies_of
from ..placement import gpu_expert_bytes
from ..platforms import PlatformSpec
from ..profile.data import Profile
from ..replay.engine import ReplayCounts
from ..trace.stats import TraceStats, trace_stats
from . import persisted, whatif
from .dataset import Dataset
from .inputs import measured_pairs


def _replay(key: str, ks: tuple[int, ...], residencies: tuple[str, ...], ds: Dataset) -> dict:
    return replay_counts(ds.trace, ds.calibration, ks, [Residency(r) for r in residencies])


# Histograms of a sweep chunk are megabytes, those of one K kilobytes: two caches, so that many
# slider moves do not push the sweep out.
@st.cache_data(show_spinner=False, max_entries=256)
def _counts_one(key: str, ks: tuple[int, ...], residencies: tuple[str, ...],
                _ds: Dataset) -> dict:
    return _replay(key, ks, residencies, _ds)


@st.cache_data(show_spinner=False, max_entries=32)
def _counts_chunk(key: str, ks: tuple[int, ...], residencies: tuple[str, ...],
                  _ds: Dataset) -> dict:
    return _replay(key, ks, residencies, _ds)


def _counts_cached(key: str, ks: tuple[int, ...], residencies: tuple[str, ...],
                   ds: Dataset) -> dict:
    """Replay counts of one residency set at the K values ``ks`` (cached)."""
    cached = _counts_one if len(ks) == 1 else _counts_chunk
    return cached(key, ks, residencies, ds)


def clear_replays() -> None:
    """Forget cached replays and predictions, the sweeps kept on disk too (for benchmarks)."""
    for f in (_counts_one, _counts_chunk, _predict_cached, _replays_disk, _swept_disk,
              _sweep_view, _figure_cached):
        f.clear()


T = TypeVar("T")


def _priced(ds: Dataset, ks: tuple[int, ...], op: tuple[int, float], estimator: str,
            candidates: tuple[str, ...], counts: dict) -> tuple[pd.DataFrame, tuple]:
    """The library's one pricing (:func:`cope_core.estimate.predict.price`) with its default
    draws and seed on every page: a K's numbers do not depend on the other K priced with it, so
    one K alone (:func:`predict_at`) and a sweep's row (:func:`sweep_at`) are the same numbers,
    and so are ``cope predict``'s and the exported policy's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = price(ds.trace, ds.profile, counts, ks, cpu_threads=op[0], gpu_share=op[1],
                   estimator=estimator, candidates=candidates,
                   calibrated=ds.calibration is not None, draws=DEFAULT_DRAWS)
    return df, tuple(sorted({" ".join(str(w.message).split()) for w in caught}))


def _residencies(candidates: Sequence[str]) -> tuple[str, ...]:
    return tuple(r.value for r in residencies_of(candidates))


@st.cache_data(show_spinner=False, max_entries=512)
def _predict_cached(key: str, ks: tuple[int, ...], op: tuple[int, float], estimator: str,
                    candidates: tuple[str, ...], _ds: Dataset) -> tuple[pd.DataFrame, tuple]:
    # the replay does not depend on the operating point or the estimator: cached on its own
    res = _residencies(candidates)
    counts = _counts_cached(key, ks, res, _ds) if res else {}
    return _priced(_ds, ks, op, estimator, candidates, counts)


def _joined(parts: list[dict]) -> dict:
    """Replay counts of consecutive K chunks as one (priced in one call: the profile's draws are
    made once per sweep, not once per chunk)."""
    return {r: ReplayCounts(r, np.concatenate([p[r].ks for p in parts]),
                            np.concatenate([p[r].hist for p in parts]),
                            np.concatenate([p[r].ins for p in parts])) for r in parts[0]}


def predict_at(ds: Dataset, k: int, op: tuple[int, float], estimator: str,
               candidates: Sequence[str]) -> pd.DataFrame:
    """Every chosen candidate at one K (cached); warnings are shown once per run."""
    df, msgs = _predict_cached(ds.key, (int(k),), (int(op[0]), float(op[1])), estimator,
                               tuple(candidates), ds)
    _warn(msgs)
    return df


class SweepView(NamedTuple):
    """A sweep over every K and what the pages derive from it, computed once for every session
    (it does not depend on the budget): the frame, the winner's regions, the unsure budget
    ranges, and the warnings of the prediction."""

    frame: pd.DataFrame
    regions: list[whatif.Region]
    unsure: list[tuple[float, float, int, int]]
    warnings: tuple[str, ...]


def _replays(key: str, residencies: tuple[str, ...], ds: Dataset) -> dict:
    """Replay counts of every K of a sweep, joined (cached per chunk: they do not depend on the
    settings)."""
    chunks = whatif.k_chunks(ds.trace.model.n_experts)
    return _joined([_counts_cached(key, ks, residencies, ds) for ks in chunks])


def _narrowed(counts: dict) -> dict:
    """Replay counts with each histogram in the smallest unsigned type that holds its largest
    count, and that array's own type (the same numbers in a quarter to an eighth of the bytes)."""
    def small(a: np.ndarray) -> tuple[np.ndarray, str]:
        return a.astype(np.min_scalar_type(int(a.max()) if a.size else 0)), a.dtype.str
    return {r: (rc.residency, rc.ks, small(rc.hist), small(rc.ins)) for r, rc in counts.items()}


def _widened(kept: dict) -> dict:
    """:func:`_narrowed`'s inverse: each histogram back in its own type, values unchanged."""
    return {r: ReplayCounts(res, ks, h.astype(hd), i.astype(idt))
            for r, (res, ks, (h, hd), (i, idt)) in kept.items()}


# The replay of every K of a shipped example outlives the server as the sweep does (it does not
# depend on the operating point or the estimator): after a restart, the first new operating
# point or estimator is priced from it instead of replaying every K again (about 1.2 s of CPU,
# and loading numba's kernels). Kept narrowed: 2.7 MB for the Qwen3 example instead of 21.
@st.cache_data(show_spinner=False, max_entries=16, persist="disk")
def _replays_disk(code: str, key: str, residencies: tuple[str, ...], _ds: Dataset) -> dict:
    return _narrowed(_replays(key, residencies, _ds))


def _swept(key: str, op: tuple[int, float], estimator: str, candidates: tuple[str, ...],
           ds: Dataset) -> tuple[pd.DataFrame, tuple]:
    ks = tuple(range(ds.trace.model.n_experts + 1))
    res = _residencies(candidates)
    counts = {} if not res else (
        _widened(_replays_disk(persisted.fingerprint(), key, res, ds)) if persisted.shipped(ds)
        else _replays(key, res, ds))
    return _priced(ds, ks, op, estimator, candidates, counts)     # one pricing of every K


# A sweep of shipped files and catalog choices outlives the server (docs/app.md#speed): a
# restart's first page unpickles it instead of replaying and pricing every K. Also keyed by the
# library's fingerprint: changed code or data is priced afresh, never answered from disk.
@st.cache_data(show_spinner=False, max_entries=16, persist="disk")
def _swept_disk(code: str, key: str, op: tuple[int, float], estimator: str,
                candidates: tuple[str, ...], _ds: Dataset) -> tuple[pd.DataFrame, tuple]:
    return _swept(key, op, estimator, candidates, _ds)


# One object shared by every session (never modified): many sessions on one example pay for
# the sweep once, and a rerun does not copy it. Bounded, and forgotten after an hour unused.
@st.cache_resource(show_spinner="Sweeping every K …", max_entries=64, ttl=3600)
def _sweep_view(key: str, op: tuple[int, float], estimator: str,
                candidates: tuple[str, ...], _ds: Dataset) -> SweepView:
    out, msgs = (_swept_disk(persisted.fingerprint(), key, op, estimator, candidates, _ds)
                 if persisted.shipped(_ds) else _swept(key, op, estimator, candidates, _ds))
    g = _ds.trace.model
    return SweepView(out, whatif.winner_regions(out, g), whatif.uncertain_ranges(out, g), msgs)


def sweep_view(ds: Dataset, op: tuple[int, float], estimator: str,
               candidates: Sequence[str]) -> SweepView:
    """Every chosen candidate at every K in ``0..E`` with its regions and unsure budgets
    (cached for every session; the warnings shown once per run)."""
    view = _sweep_view(ds.key, (int(op[0]), float(op[1])), estimator, tuple(candidates), ds)
    _warn(view.warnings)
    return view


def sweep_at(view: SweepView, k: int) -> pd.DataFrame:
    """The sweep's rows at one K, the same numbers as :func:`predict_at`'s (the same draws; a
    K's do not depend on the K priced with it), shaped as its frame: a page that shows the sweep
    anyway shows its K from it, so moving the budget slider prices nothing."""
    f = whatif.plain(view.frame)
    rows = f[f["experts_per_layer"].to_numpy() == int(k)].reset_index(drop=True)
    unc = view.frame.attrs.get("uncertainty", {})
    per_k = unc.get("per_k", {})
    rows.attrs = {**{a: v for a, v in view.frame.attrs.items() if a != "uncertainty"},
                  "uncertainty": {**{a: v for a, v in unc.items() if a != "per_k"},
                                  "per_k": {int(k): per_k[int(k)]} if int(k) in per_k else {}}}
    return rows


def sweep(ds: Dataset, op: tuple[int, float], estimator: str,
          candidates: Sequence[str]) -> pd.DataFrame:
    """Every chosen candidate at every K in ``0..E`` (:func:`sweep_view`'s frame)."""
    return sweep_view(ds, op, estimator, candidates).frame


# Figures for every session: a page passes everything a figure depends on as ``key`` (the
# dataset's key and the settings), so equal keys draw equal figures. A hit costs no plotly
# construction, only Streamlit's serialisation. Bounded and aged: a long class does not grow.
@st.cache_resource(show_spinner=False, max_entries=256, ttl=1800)
def _figure_cached(name: str, key: tuple, _build: Callable[[], Any]) -> Any:
    return _build()


def figure(name: str, key: tuple, build: Callable[[], T]) -> T:
    """What ``build()`` draws (a figure, or a figure's ``to_dict()``), made once per
    ``(name, key)`` for every session and never modified after: Streamlit only serialises it,
    and :func:`cope_core.app.figures.mark_budget` copies what it changes."""
    return _figure_cached(name, key, build)


def _warn(msgs: tuple[str, ...]) -> None:
    shown = st.session_state.setdefault("_cope_warned_run", set())
    for m in msgs:
        if m not in shown:
            st.warning(m)
            shown.add(m)


_RUNS = {"started": 0}


def reset_run_state() -> None:
    """Called once at the top of every run (warnings are shown once per run).

    At the second run of the process the objects alive then (the modules the first page
    imported: numpy, pandas, plotly, numba, Streamlit; about 220,000 tracked by the garbage
    collector) are moved out of the collector's sight (``gc.freeze``): they live as long as the
    server, and Python's full collections, which a re-priced sweep's allocations set off about
    every other operating point, scanned them all each time (about 0.1 s of the run). Objects
    made later are collected as before; what was frozen is still freed when its last reference
    goes, only a reference cycle among those objects is never collected (once, at the start)."""
    _RUNS["started"] += 1
    if _RUNS["started"] == 2:
        gc.freeze()
    st.session_state["_cope_warned_run"] = set()


@st.cache_data(show_spinner=False, max_entries=64)
def _pairs_cached(key: str, estimator: str, _ds: Dataset) -> pd.DataFrame:
    assert _ds.measurements is not None        # the page asks for measurements first
    return measured_pairs(_ds.trace, _ds.profile, _ds.calibration, _ds.measurements, estimator)


def measurement_pairs(ds: Dataset) -> dict[str, pd.DataFrame]:
    """Predicted-vs-measured pairs for every estimator the profile supports (cached)."""
    return {est: _pairs_cached(ds.key, est, ds) for est in estimators_for(ds.profile)}


@st.cache_data(show_spinner=False, max_entries=16)
def _evaluation_cached(key: str, _ds: Dataset) -> dict[str, Evaluation]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimisticPredictionWarning)   # the banner says it
        assert _ds.measurements is not None
        return evaluate(_ds.trace, _ds.profile, _ds.measurements, _ds.calibration,
                        estimators=estimators_for(_ds.profile))


def evaluation(ds: Dataset) -> dict[str, Evaluation]:
    """``cope evaluate``'s scores of every estimator (:func:`cope_core.estimate.evaluate.
    evaluate`: accuracy, regret, tie-aware top-1, measured intervals per cell; cached)."""
    return _evaluation_cached(ds.key, ds)


@st.cache_data(show_spinner=False, max_entries=16)
def _quality_cached(key: str, _ds: Dataset) -> pd.DataFrame:
    assert _ds.measurements is not None
    return measurement_checks(_ds.measurements)


def measurement_quality(ds: Dataset) -> pd.DataFrame:
    """Per cell: noise floor, margin, outliers measured again, same-work inconsistencies
    (:func:`cope_core.estimate.quality.measurement_checks`; cached)."""
    return _quality_cached(ds.key, ds)


@st.cache_data(show_spinner=False, max_entries=16)
def analytic_what_if(model: dict, gpu: str) -> Profile:
    """An ANALYTIC profile of the same model on a catalog GPU (cached)."""
    from ..platforms import platform_spec
    from ..profile.analytic import analytic_profile
    return analytic_profile(ModelGeometry.from_dict(model), platform_spec(gpu))


@st.cache_data(show_spinner=False, max_entries=32)
def _cache_sizes_cached(key: str, gib: float, op: tuple[int, float], n_cpu: int,
                        _ds: Dataset) -> pd.DataFrame:
    g = _ds.trace.model
    budget = g.expert_budget_bytes(gib * GIB)
    top = cache_mib_for_bytes(g, n_cpu, budget - gpu_expert_bytes(g, n_cpu))
    sizes = sorted({max(top * i // 12, 1) for i in range(1, 13)}) if top else []
    found = search_cache(_ds.trace, _ds.profile, budget, cpu_threads=op[0], gpu_share=op[1],
                         n_cpu=[n_cpu], cache_mib=sizes)
    out = found.frame.drop(columns=["prompt_tpot_us"])
    out.attrs["cliff_mib"] = {v.value: cliff_mib(g, n_cpu, v) for v in CacheVersion}
    return out


def cache_sizes(ds: Dataset, gib: float, op: tuple[int, float], n_cpu: int) -> pd.DataFrame:
    """The cache at 12 sizes up to the largest that fits beside ``n_cpu`` host layers, under
    both rules and every CPU share, and the placement alone (cached)."""
    return _cache_sizes_cached(ds.key, float(gib), (int(op[0]), float(op[1])), int(n_cpu), ds)


@st.cache_data(show_spinner=False, max_entries=32)
def _ttft_cached(key: str, tokens: tuple[int, int], threads: int, llamacpp: str,
                 _ds: Dataset) -> np.ndarray:
    g = _ds.trace.model
    spec = PlatformSpec.from_dict(_ds.profile.platform["spec"])
    return ttft_by_experts(g, spec, Request(*tokens), range(g.n_experts + 1), threads=threads,
                           build=parse_build(llamacpp),
                           rates=selection_rates(_ds.trace.routed, g.n_experts))


def ttft_curve(ds: Dataset, request: Request, threads: int, llamacpp: str) -> np.ndarray | None:
    """Seconds to the first token of ``request`` at every K = 0 … E (the index), the prompt as
    llama.cpp runs it (:func:`cope_core.llamacpp.ttft_by_experts`); None for a measured profile
    (the prompt is priced from a machine's peaks, which only an analytic profile carries)."""
    if not ds.profile.analytic or not isinstance((ds.profile.platform or {}).get("spec"), dict):
        return None
    return _ttft_cached(ds.key, (request.prompt_tokens, request.gen_tokens), int(threads),
                        llamacpp, ds)


@st.cache_data(show_spinner=False, max_entries=16)
def _stats_cached(key: str, _ds: Dataset) -> TraceStats:
    return trace_stats(_ds.trace, _ds.calibration)


def trace_statistics(ds: Dataset) -> TraceStats:
    """:func:`cope_core.trace.stats.trace_stats` of the evaluated trace, with the calibration
    trace's popularity (cached)."""
    return _stats_cached(ds.key, ds)


@st.cache_data(show_spinner=False, max_entries=64)
def _comparison_cached(key: str, names: tuple[str, ...], custom: tuple[float, ...], gib: float,
                       op: tuple[int, float], estimator: str, _ds: Dataset) -> Comparison:
    from . import compare_view
    plats = compare_view.build(names, _ds.profile, custom, op)
    n = _ds.trace.model.n_experts
    # the replay at every K is cached apart: adding a platform only prices it
    counts = _counts_cached(key, tuple(range(n + 1)), tuple(r.value for r in Residency), _ds)
    return compare(_ds.trace, plats, gib, _ds.calibration, cpu_threads=op[0], gpu_share=op[1],
                   estimator=estimator, counts=counts)


def comparison(ds: Dataset, names: Sequence[str], custom: Sequence[float], gib: float,
               op: tuple[int, float], estimator: str) -> Comparison:
    """:func:`cope_core.estimate.compare.compare` of the chosen platforms (cached)."""
    return _comparison_cached(ds.key, tuple(names), tuple(float(v) for v in custom), float(gib),
                              (int(op[0]), float(op[1])), estimator, ds)
