"""Views of the inputs: a trace's routing popularity and predictor recall (the statistics
themselves come from :mod:`cope_core.trace.stats`), a profile's costs against the roofline,
and predictions paired with measurements. Pure functions returning arrays and frames."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from ..estimate import roofline as rl
from ..estimate.evaluate import evaluation_pairs
from ..estimate.evaluate import score as evaluate_score
from ..estimate.metrics import Accuracy
from ..estimate.predict import OptimisticPredictionWarning
from ..geometry import ModelGeometry
from ..matrix import CANDIDATE_IDS, EXECUTIONS, Execution
from ..measurements import Measurements
from ..platforms import PlatformSpec
from ..profile.data import ATOMIC_PER_N, OperatingPoint, Profile
from ..profile.pricing import cost_selected_split
from ..trace.data import Trace
from ..trace.stats import HotSet, TraceStats


# --- traces -------------------------------------------------------------------------------------
def popularity_share(trace: Trace, sort: bool = False) -> np.ndarray:
    """``share[l, e]``: fraction of the trace's tokens that route to expert ``e`` at layer ``l``.

    With ``sort`` each layer's experts are ordered by descending share (column = rank)."""
    share = trace.popularity / float(trace.n_tokens)
    return -np.sort(-share, axis=1) if sort else share


def hot_set_frame(hs: HotSet) -> pd.DataFrame:
    """One row per cache size of :func:`cope_core.trace.stats.hot_set`, shares in percent."""
    return pd.DataFrame({"cache": [f"{f:.0%} of experts" for f in hs.fractions],
                         "experts per layer": list(hs.ks),
                         "routed experts caught (%)": [100 * c for c in hs.caught],
                         "uniform routing (%)": [100 * u for u in hs.uniform],
                         "x uniform": [c / u for c, u in zip(hs.caught, hs.uniform,
                                                             strict=True)]})


def recall_frame(stats: TraceStats) -> pd.DataFrame:
    """Per layer pair ``l -> l + 1`` (column ``layer`` = ``l``): the recall of the trace's own
    predictor (column ``predictor``, left out when the trace has no predictions) and of the
    ``previous token`` and ``popularity`` baselines, from :mod:`cope_core.trace.stats`."""
    cols = {"predictor": stats.recall, "previous token": stats.recall_previous_token,
            "popularity": stats.recall_popularity}
    frame = pd.DataFrame({k: np.asarray(v, dtype=float) for k, v in cols.items()
                          if v is not None})
    frame.insert(0, "layer", np.arange(len(frame)))
    return frame


# --- profiles -----------------------------------------------------------------------------------
_ROOFLINE_OF = {"gpu_expert": "gpu", "staged_gpu_expert": "gpu", "cpu_expert": "cpu",
                "stage": "copy"}


def atomic_frame(op: OperatingPoint, g: ModelGeometry, spec: PlatformSpec | None) -> pd.DataFrame:
    """Per-expert-count atomic costs of one operating point, with the roofline estimate.

    Returns
    -------
    DataFrame
        Columns ``op, n, profile_us, roofline_us`` (roofline NaN without a platform spec).
    """
    rows = []
    for name in ATOMIC_PER_N:
        for n in range(op.top_k + 1):
            roof = np.nan
            if spec is not None:
                kind = _ROOFLINE_OF[name]
                roof = (rl.gpu_experts_us(g, spec, n) if kind == "gpu"
                        else rl.cpu_experts_us(g, spec, n, op.cpu_threads) if kind == "cpu"
                        else rl.copy_experts_us(g, spec, n))
            rows.append({"op": name, "n": n, "profile_us": float(op.atomic[name][n]),
                         "roofline_us": float(roof)})
    return pd.DataFrame(rows)


def single_ops_frame(op: OperatingPoint) -> pd.DataFrame:
    """The single-count atomic costs (A, F, M, P) and the whole-layer costs, as floats (the
    profile holds the first four as 0-d arrays, which Arrow cannot mix with floats: the
    Profiles table logged a traceback per run)."""
    return pd.DataFrame([
        {"quantity": q, "median_us": float(v)} for q, v in (
            ("act_copy (A)", op.act_copy), ("sync (F)", op.sync), ("merge (M)", op.merge),
            ("prefetch (P)", op.prefetch_op), ("cpu_layer", op.cpu_layer),
            ("gpu_layer", op.gpu_layer))])


def schedule_grid(op: OperatingPoint, execution: Execution | str = Execution.COST_SELECTED
                  ) -> np.ndarray:
    """``grid[h, c]``: the schedule cost at ``h`` hits with ``c`` misses on the CPU (NaN where
    the profile has no such row, i.e. ``c > top_k - h`` or a split the strategy never uses)."""
    return op.schedule[EXECUTIONS.index(Execution(execution))].copy()


def chosen_split(op: OperatingPoint) -> np.ndarray:
    """The cost-selected CPU share ``c`` chosen at each hit count."""
    return cost_selected_split(op)[0]


def shared_frame(op: OperatingPoint) -> pd.DataFrame:
    """Shared per-token cost at the profiled contexts."""
    return pd.DataFrame({"context": op.shared_context.astype(int), "shared_us": op.shared_us})


# --- predicted vs measured ----------------------------------------------------------------------
def measured_pairs(trace: Trace, profile: Profile, calibration: Trace | None,
                   measurements: Measurements, estimator: str) -> pd.DataFrame:
    """One estimator's predictions joined with measured TPOT at every measured cell
    (:func:`cope_core.estimate.evaluate.evaluation_pairs`, as ``cope evaluate``).

    Returns
    -------
    DataFrame
        ``prompt, candidate, predicted_us, measured_us, K, cpu_threads, gpu_share``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimisticPredictionWarning)  # the banner says it
        return evaluation_pairs(trace, profile, measurements, calibration,
                                estimators=[estimator])[estimator]


def metrics_table(scores: dict[str, Accuracy]) -> pd.DataFrame:
    """One row per estimator: MAPE, Spearman rho, top-1 and top-3 agreement, pairs."""
    rows = [{"estimator": est, "MAPE %": a.mape_pct, "Spearman ρ": a.spearman,
             "top-1": f"{a.top1[0]}/{a.top1[1]}", "top-3": f"{a.top3[0]}/{a.top3[1]}",
             "pairs": a.pairs} for est, a in scores.items()]
    return pd.DataFrame(rows)


def noise_table(evals: dict[str, Any]) -> pd.DataFrame:
    """One row per estimator, as ``cope evaluate`` prints it: MAPE, regret, top-1 within the
    measurement noise and strict, Spearman, top-3, interval coverage."""
    rows = []
    for est, ev in evals.items():
        a, n = ev.accuracy, ev.noise
        rows.append({"estimator": est, "MAPE %": a.mape_pct,
                     "regret % mean": None if n is None else n.regret_mean_pct,
                     "regret % max": None if n is None else n.regret_max_pct,
                     "top-1 in noise (cells)": "" if n is None else
                     f"{n.top1_within_noise[0]}/{n.top1_within_noise[1]}",
                     "top-1 strict (cells)": "" if n is None else
                     f"{n.top1_cells[0]}/{n.top1_cells[1]}",
                     "top-1 (prompts)": f"{a.top1[0]}/{a.top1[1]}",
                     "Spearman ρ": a.spearman, "top-3": f"{a.top3[0]}/{a.top3[1]}",
                     "interval coverage": None if n is None or n.interval_coverage is None
                     else n.interval_coverage, "pairs": a.pairs})
    return pd.DataFrame(rows)


def cell_table(evals: dict[str, Any]) -> pd.DataFrame:
    """One row per measured cell (K, operating point): the measured winner with its 95 %
    interval and the candidates tied with it, and each estimator's pick with its regret
    ("=" when it is the measured winner, "~" when it is within the noise)."""
    rows: dict[tuple, dict] = {}
    for est, ev in evals.items():
        for r in ev.per_k:
            key = (r["K"], r["cpu_threads"], r["gpu_share"])
            row = rows.setdefault(key, {
                "K": r["K"], "cpu_threads": r["cpu_threads"], "gpu_share": r["gpu_share"],
                "measured winner": r["measured"],
                "measured ms (95 %)": _ci_text(r.get("measured_tpot_ci_us")),
                "tied within noise": ", ".join(c for c in r.get("measured_tied", [])
                                               if c != r["measured"])})
            mark = "= " if r["agree"] else "~ " if r.get("within_noise") else ""
            regret = r.get("regret_pct")
            row[est] = mark + r["predicted"] + ("" if regret is None or r["agree"]
                                                else f" (+{regret:.1f} %)")
    return pd.DataFrame(list(rows.values()))


def _ci_text(ci) -> str:
    if not ci or ci[0] is None:
        return ""
    return f"[{ci[0] / 1e3:.3f}, {ci[1] / 1e3:.3f}]"


def score(pairs: dict[str, pd.DataFrame]) -> dict[str, Accuracy]:
    """The accuracy of each estimator's pairs (:func:`cope_core.estimate.evaluate.score`)."""
    return {est: ev.accuracy for est, ev in evaluate_score(pairs).items()}


def prompt_drilldown(pairs: dict[str, pd.DataFrame], prompt: int) -> pd.DataFrame:
    """One prompt's measured TPOT and each estimator's prediction, per candidate and K."""
    keys = ["K", "cpu_threads", "gpu_share", "candidate"]
    out = None
    for est, p in pairs.items():
        sub = p[p["prompt"] == prompt]
        cols = sub[keys + ["measured_us", "predicted_us"]].rename(
            columns={"predicted_us": f"{est}_us"})
        out = cols if out is None else out.merge(cols.drop(columns="measured_us"), on=keys)
    if out is None:
        return pd.DataFrame(columns=keys + ["measured_us"])
    order = {c: i for i, c in enumerate(CANDIDATE_IDS)}
    return (out.assign(_o=out["candidate"].map(order)).sort_values(["K", "cpu_threads",
            "gpu_share", "_o"]).drop(columns="_o").reset_index(drop=True))
