"""How sure is a prediction: intervals, win probabilities and how much more trace would help
(docs/design.md#uncertainty).

Two sources are resampled together, ``B`` draws, seeded:

* the evaluated trace's **prompts** — a bootstrap over prompts. Prompts are independent in the
  replay, so resampling the per-prompt TPOTs is resampling the trace: no second replay;
* the **profile's measured spread** — every row's cost drawn from the sampling distribution of
  its median (from the row's raw samples when they are given, else a normal distribution with
  the median, and the standard error ``sqrt(pi / 2) * (IQR / 1.349) / sqrt(samples)`` that a
  median of that many normal samples has). Rows the profiler timed once for several keys
  (:func:`cope_core.profile.data.same_schedule`) share a draw, and every candidate prices a draw
  with the same row costs, so comparisons between candidates are paired. Analytic profiles have
  no spread and contribute nothing.

TPOT is linear in the row costs once the histograms are known (the cost-selected split stays
the one the medians chose), so all draws are priced by array arithmetic
(:func:`cope_core.estimate.tpot.candidate_parts` on costs with a leading draw dimension).
``scipy.stats.bootstrap`` does not serve here: its resamples cannot carry the paired profile
draws, so the two are drawn with one numpy generator.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from ..matrix import Candidate
from ..platforms import PlatformSpec
from ..profile.analytic import analytic_draws
from ..profile.data import Profile, ProfileKey, same_schedule
from ..profile.layout import OperatingPoint
from ..profile.raw_samples import raw_key
from .costs import LayerCosts, atomic_costs, cope_costs
from .model_error import around_point, log_spread, model_error, widen
from .ranking import CLEAR, Verdict, frame_runner_up, most_likely_fastest
from .speed import speed as speed_words

DEFAULT_DRAWS = 1000
LEVEL = 0.95
#: win probability below which ``cope predict`` estimates the prompts that would reach it
CONFIDENT = 0.90
#: standard error of a median of n normal samples is sqrt(pi / 2) sigma / sqrt(n); IQR = 1.349 sigma
_MEDIAN_SE_PER_IQR = math.sqrt(math.pi / 2) / 1.349


def check_draws(draws: object) -> int:
    """``draws`` as a whole number >= 0 (0 turns the bootstrap off)."""
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 0:
        raise CopeInputError(f"expected a whole number >= 0, got {draws!r}", field="--draws")
    return int(draws)


def row_draws(rows: pd.DataFrame, top_k: int, draws: int, rng: np.random.Generator,
              raw_samples: Mapping[str, Sequence[float]] | None = None) -> np.ndarray | None:
    """``B`` draws of every row's cost, shape ``(rows, B)``; None when no row has a spread.

    Parameters
    ----------
    rows : DataFrame
        One operating point's rows (``Profile.operating_point_rows``).
    raw_samples : mapping, optional
        Raw samples by :func:`raw_key`; a row found there is drawn as the median of a bootstrap
        resample of its samples, the others from the normal approximation.
    """
    keys = [ProfileKey(*k) for k in rows[list(ProfileKey._fields)].itertuples(index=False)]
    pos = {k: i for i, k in enumerate(keys)}
    canon = np.array([pos.get(same_schedule(k, top_k), i) for i, k in enumerate(keys)])
    med = rows["median_us"].to_numpy(np.float64)
    iqr = np.maximum(rows["p75_us"].to_numpy(np.float64) - rows["p25_us"].to_numpy(np.float64),
                     0.0)
    n = np.maximum(rows["samples"].to_numpy(np.float64), 1.0)
    se = _MEDIAN_SE_PER_IQR * iqr / np.sqrt(n)
    threads, share = int(rows["cpu_threads"].iloc[0]), float(rows["gpu_share"].iloc[0])
    raw: dict[int, np.ndarray] = {}
    for i in np.unique(canon):
        found = (raw_samples or {}).get(raw_key(keys[i], threads, share))
        if found is not None and len(found) > 1:
            raw[int(i)] = np.asarray(found, np.float64)
    if not raw and not (se > 0).any():
        return None
    out = med[:, None] + rng.standard_normal((len(keys), draws)) * se[:, None]
    for i, samples in raw.items():
        pick = rng.integers(0, samples.size, (draws, samples.size))
        out[i] = np.median(samples[pick], axis=1)
    out = out[canon]                    # rows timed once share their draw
    return np.maximum(out, 0.0)


def analytic_spec(profile: Profile) -> PlatformSpec | None:
    """The spec an analytic profile was computed from, when it records the model's overheads
    (profiles written before they existed hold pure roofline rows: nothing to draw)."""
    data = profile.platform.get("spec") if isinstance(profile.platform, dict) else None
    if not profile.analytic or not data or "gpu_launch_us" not in data:
        return None
    return PlatformSpec.from_dict(data, source=profile.path)


def drawn_point(profile: Profile, cpu_threads: int, gpu_share: float, draws: int,
                rng: np.random.Generator,
                raw_samples: Mapping[str, Sequence[float]] | None = None,
                model: ModelGeometry | None = None) -> OperatingPoint | None:
    """``B`` draws of one operating point's costs (a leading draw dimension on every array): of
    each row's measured spread, or for an analytic profile of its model's constants
    (:func:`cope_core.profile.analytic.analytic_draws`); None when there is nothing to draw
    (zero spread, or an analytic profile without overheads). ``model``: the priced geometry
    (default the profiled one), as in ``Profile.resolve``."""
    rows, layout = profile.operating_point_rows(cpu_threads, gpu_share, model=model)
    if profile.analytic:
        spec = analytic_spec(profile)
        if spec is None:
            return None
        values: np.ndarray | None = analytic_draws(profile.model, spec, rows, draws, rng)
    else:
        values = row_draws(rows, profile.model.top_k, draws, rng, raw_samples)
    return None if values is None else layout.take(values)


def drawn_costs(profile: Profile, costs: LayerCosts, cpu_threads: int, gpu_share: float,
                draws: int, rng: np.random.Generator,
                raw_samples: Mapping[str, Sequence[float]] | None = None,
                model: ModelGeometry | None = None) -> LayerCosts | None:
    """``costs`` re-priced under the draws of :func:`drawn_point`; None when there is nothing to
    draw, or for the roofline (no spread)."""
    if costs.estimator not in ("cope", "atomic"):
        return None
    op = drawn_point(profile, cpu_threads, gpu_share, draws, rng, raw_samples, model)
    if op is None:
        return None
    build = cope_costs if costs.estimator == "cope" else atomic_costs
    return build(op, costs.split)


@dataclass(frozen=True)
class KConfidence:
    """How sure the pick is at one K: the point-estimate winner, its win probability, the
    strongest rival, and (below :data:`CONFIDENT`) about how many prompts of trace would reach
    it, from how the leading difference's prompt variance shrinks as 1/n while the profile's part
    stays; ``unreachable`` says why no number of prompts would (``"tie"``: the two are equal on
    this trace; ``"profile"``: the profile's own spread is wider than the gap). ``gap_us`` is the
    contender's mean TPOT minus the winner's. ``verdict``: the named winner of the paired draws
    (:func:`cope_core.estimate.ranking.most_likely_fastest`), which the CLI and the app print."""

    winner: str
    win_probability: float
    contender: str | None
    contender_probability: float
    prompts: int
    prompts_for_confidence: int | None
    unreachable: str | None
    gap_us: float
    verdict: Verdict

    def to_dict(self) -> dict:
        return dict(self.__dict__) | {"verdict": self.verdict.to_dict()}


def equivalences(point: list[np.ndarray], full: list[np.ndarray],
                 candidates: Sequence[Candidate]) -> list[str | None]:
    """Per candidate, the first earlier candidate whose per-prompt TPOTs equal its own at every
    prompt and in every draw (it is the same policy on this trace and platform), else None."""
    n = len(candidates)
    return sweep_equivalences(np.stack(point[:n])[None], np.stack(full[:n])[None],
                              candidates)[0]


def sweep_equivalences(point: np.ndarray, full: np.ndarray, candidates: Sequence[Candidate]
                       ) -> list[list[str | None]]:
    """:func:`equivalences` at every K of a sweep: ``point`` ``(nK, C, P)``, ``full`` the same
    or ``(nK, C, B, P)`` under the draws; one list per K."""
    nK, C = point.shape[:2]
    same = (point[:, :, None] == point[:, None]).all(axis=-1)            # (nK, C, C)
    if full is not point:       # the draws too, where the points agree (they seldom do)
        for i in range(C):
            for j in range(i):
                at = np.flatnonzero(same[:, i, j])
                if at.size:
                    eq = (full[at, i] == full[at, j]).reshape(at.size, -1).all(axis=1)
                    same[at, i, j] = eq
    out: list[list[str | None]] = []
    for kk in range(nK):
        row: list[str | None] = [None] * C
        for i in range(C):
            for j in range(i):
                if row[j] is None and same[kk, i, j]:
                    row[i] = candidates[j].id
                    break
        out.append(row)
    return out


def _resampled_means(t: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Mean over each draw's resampled prompts: ``t`` is (P,) or (B, P), ``idx`` (B, P)."""
    if t.ndim == 1:
        return t[idx].mean(axis=1)
    return np.take_along_axis(t, idx, axis=1).mean(axis=1)


def resample_indices(P: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """The prompts' resamples with replacement, ``(draws, P)``: the one draw every bootstrap of
    the prompts takes from ``rng`` (a K priced alone and its row in a sweep draw alike)."""
    return rng.integers(0, P, (draws, P))


def prompt_bootstrap(per_prompt: Sequence[np.ndarray], draws: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The one bootstrap of the prompts: each series' mean over ``draws`` resamples of its ``P``
    prompts with replacement, the same resample for every series (paired), shape
    ``(draws, n)``, and the resampled indices ``(draws, P)``. A series is ``(P,)`` or, under the
    profile draws, ``(draws, P)`` (draw ``b`` takes resample ``b``)."""
    idx = resample_indices(per_prompt[0].shape[-1], draws, rng)
    return np.stack([_resampled_means(t, idx) for t in per_prompt], axis=1), idx


def percentile_interval(means: np.ndarray, point: np.ndarray, estimator: str | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The :data:`LEVEL` interval of each column of :func:`prompt_bootstrap`'s means, around
    its ``point`` (the draws' spread on each side of their median, carried to the point, so the
    point is always inside: :func:`cope_core.estimate.model_error.around_point`). With an
    ``estimator`` it is an interval on absolute speed: widened by that estimator's measured
    model error (``data/model-error.json``)."""
    sigma = 0.0 if estimator is None else model_error().sigma(estimator)
    return around_point(point, means, LEVEL, sigma)


def intervals(point: list[np.ndarray],
              drawn: list[np.ndarray] | None, candidates: Sequence[Candidate], draws: int,
              rng: np.random.Generator, *, estimator: str | None = None
              ) -> tuple[pd.DataFrame, KConfidence]:
    """Intervals, win probability, equivalence and the named winner of every candidate at one K.

    Parameters
    ----------
    point : list of ndarray (P,)
        Each candidate's per-prompt TPOT at the profile's medians (candidate order).
    drawn : list of ndarray (B, P), optional
        The same under the profile draws (None: the profile has no spread).
    estimator : str, optional
        Whose measured model error widens the interval on absolute speed (None: none).

    Returns
    -------
    (DataFrame, KConfidence)
        ``tpot_lo_us, tpot_hi_us`` (the absolute interval: the draws' spread with the model
        error), ``draws_lo_us, draws_hi_us`` (the draws' spread alone), ``win_probability,
        equivalent_to`` per candidate; and the winner's confidence, with the
        :class:`~cope_core.estimate.ranking.Verdict` of the paired draws. Every interval holds
        its point (:func:`percentile_interval`).
    """
    cols, conf = interval_columns(point, drawn, candidates, draws, rng, estimator=estimator)
    return pd.DataFrame({**cols, "equivalent_to": pd.Series(cols["equivalent_to"],
                                                             dtype=object)}), conf


def interval_columns(point: list[np.ndarray], drawn: list[np.ndarray] | None,
                     candidates: Sequence[Candidate], draws: int, rng: np.random.Generator, *,
                     estimator: str | None = None) -> tuple[dict, KConfidence]:
    """:func:`intervals`' columns as arrays (``equivalent_to`` a list) and its confidence,
    without a frame (:func:`sweep_interval_columns` at one K)."""
    n = len(candidates)
    cols, confs = sweep_interval_columns(
        np.stack(point[:n])[None], None if drawn is None else np.stack(drawn[:n])[None],
        candidates, draws, rng, estimator=estimator)
    return {c: v[0] for c, v in cols.items()}, confs[0]


def sweep_interval_columns(point: np.ndarray, drawn: np.ndarray | None,
                           candidates: Sequence[Candidate], draws: int,
                           rng: np.random.Generator, *, estimator: str | None = None
                           ) -> tuple[dict, list[KConfidence]]:
    """:func:`interval_columns` at every K of a sweep at once: ``point`` ``(nK, C, P)``, ``drawn``
    ``(nK, C, B, P)`` or None. Every K resamples its prompts with the same one draw of ``rng``,
    as pricing that K alone from this generator state would; the columns have shape
    ``(nK, C)`` (``equivalent_to`` a list per K), with one :class:`KConfidence` per K."""
    nK, C, P = point.shape
    full = drawn if drawn is not None else point
    idx = resample_indices(P, draws, rng)       # the same resample for every K
    if drawn is None:       # in C order, so each mean sums as one K's alone would
        gathered = np.take(point, idx, axis=-1)                           # (nK, C, B, P)
    else:                   # draw b's resample of prompts: flat positions b * P + idx[b]
        flat = (np.arange(draws)[:, None] * P + idx).ravel()
        gathered = np.take(drawn.reshape(nK, C, -1), flat, axis=-1).reshape(drawn.shape)
    means = gathered.mean(axis=-1).transpose(0, 2, 1)                     # (nK, B, C)
    equivalent = sweep_equivalences(point, full, candidates)
    pt = point.mean(axis=-1)
    # the draws' quantiles once, for the draws' interval and the one with the model error
    # (:func:`percentile_interval` without and with the estimator)
    h_lo, h_hi = log_spread(means.transpose(1, 0, 2), LEVEL)
    sigma = 0.0 if estimator is None else model_error().sigma(estimator)
    lo_d, hi_d = widen(pt, h_lo, h_hi, LEVEL, 0.0)
    lo, hi = widen(pt, h_lo, h_hi, LEVEL, sigma)
    prob = np.full((nK, C), np.nan)
    confs = []
    for kk in range(nK):
        rivals = [i for i, e in enumerate(equivalent[kk]) if e is None]
        m = means[kk][:, rivals]
        prob[kk, rivals] = np.bincount(np.argmin(m, axis=1), minlength=len(rivals)) / draws
        verdict = most_likely_fastest(m, [candidates[i].id for i in rivals],
                                      pt[kk, rivals].tolist())
        confs.append(_confidence(point[kk], None if drawn is None else drawn[kk], candidates,
                                 rivals, prob[kk], idx, P, verdict, pt[kk]))
    return {"tpot_lo_us": lo, "tpot_hi_us": hi, "draws_lo_us": lo_d, "draws_hi_us": hi_d,
            "win_probability": prob, "equivalent_to": equivalent}, confs


def _confidence(point, drawn, candidates, rivals, prob, idx, P, verdict,
                tpot=None) -> KConfidence:
    # tpot: each candidate's mean over the prompts when the caller has them
    # (``point.mean(axis=-1)``: the same numbers as one mean per candidate)
    tpot = np.array([p.mean() for p in point]) if tpot is None else tpot
    w = min(rivals, key=lambda i: (tpot[i], i))      # the point-estimate winner (tie rule)
    others = [i for i in rivals if i != w]
    if not others:
        return KConfidence(candidates[w].id, float(prob[w]), None, 0.0, P, None, None, 0.0,
                           verdict)
    c = max(others, key=lambda i: (prob[i], -tpot[i], -i))
    p_win = float(prob[w])
    d = point[c] - point[w]                           # per prompt: how much the winner gains
    needed, why = None, None
    if p_win < CONFIDENT:
        v_prompt = float(np.var(d[idx].mean(axis=1)))
        v_profile = 0.0 if drawn is None else float(np.var((drawn[c] - drawn[w]).mean(axis=1)))
        room = (d.mean() / NormalDist().inv_cdf(CONFIDENT)) ** 2 - v_profile
        if d.mean() <= 0:
            why = "tie"
        elif room > 0 and v_prompt > 0:
            needed = max(P + 1, math.ceil(v_prompt * P / room))
        else:
            why = "profile"
    return KConfidence(candidates[w].id, p_win, candidates[c].id, float(prob[c]), P, needed,
                       why, float(d.mean()), verdict)


def _pct(p: float) -> str:
    return f"{100 * p:.0f} %"


def speed_text(row: pd.Series) -> str:
    """``"16.944 ms/token [13.700, 21.200] · 59.0 tokens/s [47.2, 73.0]"``: a prediction row's
    TPOT and speed, each with its interval on absolute speed (the words of the CLI's winner line
    and the app's)."""
    finite = np.isfinite(row["tpot_lo_us"])
    return speed_words(row["tpot_us"], (row["tpot_lo_us"], row["tpot_hi_us"]) if finite else None)


def confidence_lines(df: pd.DataFrame, experts_per_layer: int) -> list[str]:
    """The winner at one K of a :func:`~cope_core.estimate.predict.predict` frame, with its
    interval, how often it wins, the strongest rival and either how much more trace would settle
    it (below :data:`CONFIDENT`) or that more prompts would not change it (the lines
    ``cope predict`` prints and the app shows)."""
    sub = df[df["experts_per_layer"] == experts_per_layer]
    ranked = sub.sort_values("rank")
    w = ranked.iloc[0]
    conf = df.attrs.get("uncertainty", {}).get("per_k", {}).get(int(experts_per_layer))
    if conf is None or not np.isfinite(w["tpot_lo_us"]):
        lines = [f"winner: {w.candidate} {speed_words(w.tpot_us)} (no interval: the "
                 f"bootstrap is off, --draws 0)"]
    else:
        v = Verdict.from_dict(conf["verdict"])
        named = [v.leader] + ([v.rival] if v.tied and v.rival is not None else [])
        rows = sub.set_index("candidate")
        speed = ", ".join((f"{c} " if v.tied else "") + speed_text(rows.loc[c]) for c in named)
        lines = [f"winner: {v.name}{': ' if v.tied else ' '}{speed}; {v.reason}"]
        if not v.tied:
            lines.append(f"  more prompts would not change it: it is faster than every rival "
                         f"in at least {100 * CLEAR:g} % of the draws over these "
                         f"{conf['prompts']} prompts")
        elif conf["contender"] is not None and conf["win_probability"] < CONFIDENT:
            if conf["prompts_for_confidence"] is not None:
                lines.append(f"  about {conf['prompts_for_confidence']} prompts of trace (this "
                             f"one has {conf['prompts']}) would make it {_pct(CONFIDENT)}")
            elif conf["unreachable"] == "tie":
                lines.append(f"  no number of prompts would make it {_pct(CONFIDENT)}: the two "
                             "cost the same on this trace")
            else:
                lines.append(f"  no number of prompts would make it {_pct(CONFIDENT)}: the "
                             f"profile's own spread is wider than the {conf['gap_us'] / 1e3:.3f} "
                             "ms/token gap (re-profile with a longer --min-time)")
    ru = frame_runner_up(sub, w.candidate)
    if ru is not None:
        margin = (ru.tpot_us - w.tpot_us) / w.tpot_us * 100
        lines.append(f"runner-up: {ru.candidate} {speed_words(ru.tpot_us)} (+{margin:.1f}%)")
    elif len(ranked) > 1:
        lines.append("runner-up: none (every other candidate is the same policy here)")
    return lines
