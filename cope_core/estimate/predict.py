"""TPOT of every candidate: replay counts (step 1) priced by an estimator's cost table (step 2)."""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..matrix import (
    RESIDENCIES,
    Candidate,
    Residency,
    residencies_of,
    select_candidates,
)
from ..platforms import PlatformSpec
from ..profile.analytic import LATENCY_SPREAD, THROUGHPUT_SPREAD
from ..profile.data import Profile
from ..profile.pricing import check_compatible
from ..replay.engine import ReplayCounts, check_ks, replay
from ..trace.data import Trace, fill_order
from .costs import LayerCosts, layer_costs, profile_spec
from .model_error import model_error
from .ranking import fastest_first
from .tpot import (  # noqa: F401  (CandidateTPOT, candidate_tpot, compose lived here)
    CandidateTPOT,
    LayerSums,
    candidate_parts,
    candidate_tpot,
    compose,
    compose_arrays,
    layer_sums,
)
from .uncertainty import (
    DEFAULT_DRAWS,
    LEVEL,
    check_draws,
    drawn_costs,
    sweep_equivalences,
    sweep_interval_columns,
)


class OptimisticPredictionWarning(UserWarning):
    """No calibration trace: the fill order was learned from the evaluated trace itself."""


def replay_all(trace: Trace, order: np.ndarray, ks, residencies: Iterable[Residency] = RESIDENCIES
               ) -> dict[Residency, ReplayCounts]:
    """One replay per residency; every execution strategy reuses its histograms.

    At a single K the residencies run side by side on threads (the kernels release the GIL);
    a sweep already spreads its K values over cores inside each kernel."""
    residencies = list(residencies)
    ks = check_ks(ks, trace.model.n_experts)
    workers = min(len(residencies), os.cpu_count() or 1)
    if ks.size == 1 and workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {r: pool.submit(replay, trace, order, r, ks) for r in residencies}
            return {r: f.result() for r, f in futures.items()}
    return {r: replay(trace, order, r, ks) for r in residencies}


def replay_counts(trace: Trace, calibration: Trace | None, ks: int | Sequence[int],
                  residencies: Iterable[Residency] = RESIDENCIES, *,
                  fill_by_id: bool = False) -> dict[Residency, ReplayCounts]:
    """Step 1 of :func:`predict`: replay each residency over ``trace`` at every K of ``ks``.

    The result depends only on the traces and K, not on the platform or the estimator, so a
    caller that re-prices under several profiles (the app, a platform comparison) replays once.

    Parameters
    ----------
    trace : Trace
    calibration : Trace or None
        Its popularity sets the initial fill (the trace's own when None).
    ks : int or sequence of int
    residencies : iterable of Residency
        Those the candidates need (:func:`cope_core.matrix.residencies_of`).
    fill_by_id : bool
        Fill by expert id instead of popularity.
    """
    check_compatible(trace, None, calibration)
    sizes = check_ks(ks, trace.model.n_experts)
    order = fill_order(calibration if calibration is not None else trace, by_id=fill_by_id)
    return replay_all(trace, order, sizes, [r for r in RESIDENCIES if r in set(residencies)])


def counts_at(counts: dict[Residency, ReplayCounts], ks: np.ndarray
              ) -> dict[Residency, ReplayCounts]:
    """``counts`` cut to the cache sizes ``ks``, in that order: a replay over a sweep prices any
    of its K (an absent K is an error, not another K's histograms)."""
    out = {}
    for r, rc in counts.items():
        where = {int(k): i for i, k in enumerate(rc.ks)}
        missing = [int(k) for k in ks if int(k) not in where]
        if missing:
            raise CopeInputError(f"the {r.value} replay has no K={missing[0]} (it covers "
                                 f"{[int(k) for k in rc.ks]})", field="experts_per_layer")
        idx = np.array([where[int(k)] for k in ks], np.int64)
        out[r] = rc if np.array_equal(idx, np.arange(len(rc.ks))) else ReplayCounts(
            rc.residency, rc.ks[idx], rc.hist[idx], rc.ins[idx])
    return out


def price(trace: Trace, profile: Profile, counts: dict[Residency, ReplayCounts],
          ks: int | Sequence[int], *, cpu_threads: int | None = None,
          gpu_share: float | None = None, estimator: str = "cope",
          candidates: Iterable[str] | None = None, spec: PlatformSpec | None = None,
          histograms: bool = False, calibrated: bool = True, draws: int = DEFAULT_DRAWS,
          seed: int = 0, raw_samples: Mapping[str, Sequence[float]] | None = None
          ) -> pd.DataFrame:
    """Step 2 of :func:`predict`: price replay counts with one estimator at an operating point.

    Parameters
    ----------
    trace, profile
        As for :func:`predict`.
    counts : dict of Residency -> ReplayCounts
        From :func:`replay_counts`, at (at least) the residencies the candidates need and the
        cache sizes ``ks``.
    ks : int or sequence of int
        The cache sizes to price.
    calibrated : bool
        Whether the counts' fill came from a calibration trace (without one an
        :class:`OptimisticPredictionWarning` is issued).
    cpu_threads, gpu_share, estimator, candidates, spec, histograms, draws, seed, raw_samples
        As for :func:`predict`.

    Returns
    -------
    DataFrame
        The frame :func:`predict` describes.
    """
    check_compatible(trace, profile)
    sizes = check_ks(ks, trace.model.n_experts)
    draws = check_draws(draws)
    cands = select_candidates(candidates)
    if not calibrated:
        warnings.warn("no calibration trace given: the fill order comes from the evaluated trace, "
                      "so the prediction is optimistic", OptimisticPredictionWarning, stacklevel=3)
    counts = counts_at(counts, sizes)
    op = profile.resolve(cpu_threads, gpu_share, model=trace.model)
    if spec is None and estimator == "hrm":
        spec = profile_spec(profile)
    costs = layer_costs(estimator, op, trace.model, spec)
    use = {r: counts[r] for r in residencies_of(cands)}
    sums = layer_sums(use)
    df, point = compose_arrays(trace, use, costs, cands, histograms, ks=sizes, sums=sums)
    df.attrs.update(cpu_threads=op.cpu_threads, gpu_share=op.gpu_share,
                    analytic=bool(profile.analytic))
    _add_uncertainty(df, point, trace, profile, use, sums, costs, cands, sizes, draws, seed,
                     raw_samples)
    return df


#: K priced together in one array expression of the draws: (K, candidates, draws, prompts)
#: doubles are 13 MB at 16 K x 13 candidates x 1000 draws x 8 prompts
K_BLOCK = 16


def _add_uncertainty(df: pd.DataFrame, point: np.ndarray, trace: Trace, profile: Profile,
                     counts: dict[Residency, ReplayCounts], sums: LayerSums, costs: LayerCosts,
                     cands: Sequence[Candidate], ks: np.ndarray, draws: int, seed: int,
                     raw_samples: Mapping[str, Sequence[float]] | None) -> None:
    """The interval columns of :func:`predict` and ``df.attrs["uncertainty"]``
    (:mod:`cope_core.estimate.uncertainty`); ``point``: the per-prompt TPOTs of ``df``'s rows,
    shape ``(K, candidates, prompts)``; ``sums``: :func:`~cope_core.estimate.tpot.layer_sums`
    of ``counts``."""
    rng = np.random.default_rng(seed)
    drawn = None
    if draws:
        drawn = drawn_costs(profile, costs, df.attrs["cpu_threads"], df.attrs["gpu_share"],
                            draws, rng, raw_samples, model=trace.model)
    shared_d = (np.zeros(0) if drawn is None
                else drawn.shared_per_prompt(trace.context, trace.prompt_start))
    # every K resamples its prompts from the same generator state: K's numbers do not depend on
    # which other K are priced with it (a sweep's row equals the prediction at that K alone)
    after_profile = rng.bit_generator.state
    n = len(cands)

    def block(start: int) -> tuple[dict, list]:
        kis = np.arange(start, min(start + K_BLOCK, len(ks)))
        if not draws:
            nan = np.full((len(kis), n), np.nan)
            return {"tpot_lo_us": nan, "tpot_hi_us": nan, "draws_lo_us": nan,
                    "draws_hi_us": nan, "win_probability": nan,
                    "equivalent_to": sweep_equivalences(point[kis], point[kis], cands)}, []
        full = None
        if drawn is not None:       # (K, candidates, draws, prompts), summed in place
            full = np.empty((len(kis), n) + shared_d.shape)
            for i, c in enumerate(cands):
                part = candidate_parts(trace, counts, drawn, c, kis, ks[kis], sums=sums)
                np.add(shared_d, part.experts, out=full[:, i])
                if c.residency is not None and c.residency.mutable:   # others' is 0
                    np.add(full[:, i], part.prefetch, out=full[:, i])
        own = np.random.default_rng()
        own.bit_generator.state = after_profile
        return sweep_interval_columns(point[kis], full, cands, draws, own,
                                      estimator=costs.estimator)

    # blocks are independent (two threads were no faster on two busy cores: the Python work
    # between the array operations holds the GIL)
    starts = range(0, len(ks), K_BLOCK)
    done = [block(s) for s in starts]
    parts = [cols for cols, _ in done]
    per_k = {int(ks[ki]): c.to_dict() for (_, confs), s in zip(done, starts)
             for ki, c in zip(range(s, s + K_BLOCK), confs)}
    for col in ("tpot_lo_us", "tpot_hi_us", "draws_lo_us", "draws_hi_us", "win_probability"):
        df[col] = np.concatenate([p[col].ravel() for p in parts]).astype(np.float64)
    df["equivalent_to"] = pd.Series([e if isinstance(e, str) else None for p in parts
                                     for row in p["equivalent_to"] for e in row], dtype=object)
    spread = (f"model uncertainty of the analytic profile (log-normal, throughputs "
              f"{THROUGHPUT_SPREAD:.0%}, latencies {LATENCY_SPREAD:.0%})"
              if profile.analytic and drawn is not None
              else "none (analytic profile without overheads)" if profile.analytic
              else "none (the roofline has no spread)" if costs.estimator == "hrm"
              else "raw samples" if raw_samples
              else "normal approximation from each row's median, IQR and sample count"
              if drawn is not None else "none (every row has zero spread)")
    err = model_error()
    df.attrs["uncertainty"] = {"draws": draws, "seed": int(seed), "level": LEVEL,
                               "sources": ["prompts"] + (["profile"] if drawn is not None else []),
                               "profile_spread": spread, "per_k": per_k,
                               "model_error": {"sigma_log": err.sigma(costs.estimator),
                                               "ratio_median_pct": err.ratio_median_pct,
                                               "ratio_p95_pct": err.ratio_p95_pct,
                                               "source": "data/model-error.json"}}


def predict(trace: Trace, profile: Profile, experts_per_layer: int | Sequence[int],
            calibration: Trace | None = None, cpu_threads: int | None = None,
            estimator: str = "cope", *, gpu_share: float | None = None,
            candidates: Sequence[str] | None = None, fill_by_id: bool = False,
            spec: PlatformSpec | None = None, histograms: bool = False,
            draws: int = DEFAULT_DRAWS, seed: int = 0,
            raw_samples: Mapping[str, Sequence[float]] | None = None) -> pd.DataFrame:
    """Predict every candidate's TPOT over ``trace`` with one estimator, and how sure it is.

    The composition of :func:`replay_counts` (cache state, platform-independent) and
    :func:`price` (costs of one estimator at one operating point).

    Parameters
    ----------
    trace : Trace
        Evaluated routing trace.
    profile : Profile
        Costs of the target platform (measured or analytic).
    experts_per_layer : int or sequence of int
        Cache size(s) ``K`` in ``[0, E]``; a sequence runs a sweep.
    calibration : Trace, optional
        Trace whose popularity sets the initial fill. Without it the evaluated trace is used and
        an :class:`OptimisticPredictionWarning` is issued.
    cpu_threads : int, optional
        Operating point; default: the most threads, then the largest GPU share.
    estimator : {"cope", "atomic", "hrm"}
    gpu_share : float, optional
        GPU share of the operating point (default: the largest measured at ``cpu_threads``).
    candidates : sequence of str, optional
        Candidate ids to evaluate (default: all 13); rows always follow the canonical order.
    fill_by_id : bool
        Fill residency by expert id instead of popularity.
    spec : PlatformSpec, optional
        Peak numbers for ``hrm``; default: the profile's ``platform.spec``.
    histograms : bool
        Add a ``hist`` column (prompt x layer x hits counts).
    draws : int
        Bootstrap draws of the prompts and the profile's spread (0: none); see
        :mod:`cope_core.estimate.uncertainty`.
    seed : int
        Seed of the draws (the same seed gives the same intervals; a K's are the same
        whichever other K are predicted with it).
    raw_samples : mapping, optional
        Raw profile samples (the JSON of ``cope profile --raw-samples``): drawn from these
        instead of the median/IQR approximation.

    Returns
    -------
    pandas.DataFrame
        One row per (K, candidate) in candidate order: ``experts_per_layer, candidate, residency,
        execution, estimator, tpot_us, shared_us, experts_us, prefetch_us, hit_rate, prefetches,
        prompt_tpot_us, prompt_hit_rate, prompt_prefetches, rank, winner, tpot_lo_us,
        tpot_hi_us, draws_lo_us, draws_hi_us, win_probability, equivalent_to``. Per-prompt
        columns hold arrays in the order of ``df.attrs["prompts"]``; ``rank`` 1 is the winner
        at that K (exact ties to the earlier candidate). ``tpot_lo_us``/``tpot_hi_us`` bound
        the 95 % interval on absolute TPOT (the draws' spread with the model's measured error,
        around the point), ``draws_lo_us``/``draws_hi_us`` the draws' spread alone,
        ``win_probability`` is the share of draws the candidate is fastest in (NaN for a
        candidate ``equivalent_to`` an earlier one, which is not counted as a rival; all NaN
        with ``draws=0``). ``df.attrs["uncertainty"]`` holds the settings and, per K, the
        winner's confidence (:class:`cope_core.estimate.uncertainty.KConfidence`).
    """
    check_compatible(trace, profile, calibration)
    cands = select_candidates(candidates)
    counts = replay_counts(trace, calibration, experts_per_layer, residencies_of(cands),
                           fill_by_id=fill_by_id)
    return price(trace, profile, counts, experts_per_layer, cpu_threads=cpu_threads,
                 gpu_share=gpu_share, estimator=estimator, candidates=[c.id for c in cands],
                 spec=spec, histograms=histograms,
                 calibrated=calibration is not None or fill_by_id, draws=draws, seed=seed,
                 raw_samples=raw_samples)


def winner(df: pd.DataFrame, experts_per_layer: int | None = None) -> pd.Series:
    """The winning row at one K of a :func:`predict` frame.

    Parameters
    ----------
    df : DataFrame
        A :func:`predict` (or :func:`price`) frame.
    experts_per_layer : int, optional
        The K (default: the frame's first).

    Returns
    -------
    Series
        The row of the lowest TPOT, exact ties to the earlier candidate id
        (:func:`cope_core.estimate.ranking.fastest_first`).
    """
    if experts_per_layer is None:
        experts_per_layer = int(df["experts_per_layer"].iloc[0])
    sub = df[df["experts_per_layer"] == experts_per_layer]
    best = fastest_first(dict(zip(sub["candidate"], sub["tpot_us"].astype(float))))[0]
    return sub[sub["candidate"] == best].iloc[0]

