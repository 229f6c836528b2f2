"""What ``cope predict`` and ``cope evaluate`` print: tables, JSON objects, per-K summaries."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..estimate.model_error import z_of
from ..estimate.ranking import frame_runner_up
from ..estimate.speed import tokens_per_s
from ..estimate.uncertainty import confidence_lines


def _num(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def prediction_json(df: pd.DataFrame) -> list[dict]:
    """One object per (K, candidate) of a :func:`~cope_core.estimate.predict.predict` frame."""
    prompts = df.attrs["prompts"]
    out = []
    for row in df.itertuples(index=False):
        lo, hi = _num(row.tpot_lo_us), _num(row.tpot_hi_us)
        out.append({
            "candidate": row.candidate,
            "residency": None if row.candidate == "layer_partition" else row.residency,
            "execution": None if row.candidate == "layer_partition" else row.execution,
            "experts_per_layer": int(row.experts_per_layer), "estimator": row.estimator,
            "tpot_us": row.tpot_us, "tpot_ci_us": None if lo is None else [lo, hi],
            "tpot_draws_ci_us": None if lo is None
            else [_num(row.draws_lo_us), _num(row.draws_hi_us)],
            "win_probability": _num(row.win_probability),
            "equivalent_to": row.equivalent_to,
            "shared_us": row.shared_us, "experts_us": row.experts_us,
            "prefetch_us": row.prefetch_us, "hit_rate": row.hit_rate,
            "prefetches": int(row.prefetches), "rank": int(row.rank),
            "prompts": [{"prompt": int(p), "tpot_us": float(t), "hit_rate": float(h),
                         "prefetches": int(n)}
                        for p, t, h, n in zip(prompts, row.prompt_tpot_us, row.prompt_hit_rate,
                                              row.prompt_prefetches)],
        })
    return out


def _wins(r) -> str:
    if r.equivalent_to:
        return "= " + r.equivalent_to
    return "" if not math.isfinite(r.win_probability) else f"{100 * r.win_probability:.0f} %"


def format_table(df: pd.DataFrame) -> str:
    """Every candidate at one K, fastest first, then the winner with its confidence."""
    k = int(df["experts_per_layer"].iloc[0])
    show = df.sort_values("tpot_us", kind="stable")
    lines = [*interval_notes(df),
             f"{'rank':>4}  {'candidate':<36}{'TPOT ms':>10}{'tok/s':>8}  {'95 % interval':<19}"
             f"{'shared':>9}{'experts':>9}{'prefetch':>9}{'hit rate':>9}{'prefetches':>11}"
             f"  wins"]
    for r in show.itertuples(index=False):
        ci = ("" if not math.isfinite(r.tpot_lo_us)
              else f"[{r.tpot_lo_us / 1e3:.3f}, {r.tpot_hi_us / 1e3:.3f}]")
        lines.append(f"{r.rank:>4}  {r.candidate:<36}{r.tpot_us / 1e3:>10.3f}"
                     f"{tokens_per_s(r.tpot_us):>8.1f}  {ci:<19}"
                     f"{r.shared_us / 1e3:>9.3f}{r.experts_us / 1e3:>9.3f}"
                     f"{r.prefetch_us / 1e3:>9.3f}{r.hit_rate:>9.3f}{r.prefetches:>11}"
                     f"  {_wins(r)}")
    return "\n".join(lines + confidence_lines(df, k))


def interval_notes(df: pd.DataFrame) -> list[str]:
    """What a prediction's interval and win shares are made of (the table's header lines)."""
    k = int(df["experts_per_layer"].iloc[0])
    unc = df.attrs.get("uncertainty", {})
    analytic = str(unc.get("profile_spread", "")).startswith("model uncertainty")
    profile = "profile" in unc.get("sources", [])
    err = unc.get("model_error") or {}
    sigma = float(err.get("sigma_log", 0.0))
    pct = 100 * (math.exp(z_of(float(unc.get("level", 0.95))) * sigma) - 1)
    drawn = "the prompts" + (" and the analytic model's constants" if analytic
                             else " and the profile's spread" if profile else "")
    return [f"K = {k} experts per layer; interval: 95 % on absolute TPOT, the draws of "
            f"{drawn} with the model's measured error (a factor {1 + pct / 100:.2f} either "
            "way, "
            f"{err.get('source', 'data/model-error.json')})",
            f"wins: share of these draws, paired, it is fastest in (an error common to "
            f"every candidate cancels; predicted ratios between candidates measured off by "
            f"{err.get('ratio_median_pct', float('nan')):.0f} % at the median, "
            f"{err.get('ratio_p95_pct', float('nan')):.0f} % at the 95th percentile)"]


def format_sweep(df: pd.DataFrame) -> str:
    """The winner, the runner-up and the winner's win probability at each K."""
    lines = [f"{'K':>4}  {'winner':<36}{'TPOT ms':>10}{'tok/s':>8}  {'runner-up':<36}{'margin':>8}"
             f"{'wins':>7}"]
    for k, sub in df.groupby("experts_per_layer", sort=True):
        w = sub.sort_values("rank").iloc[0]
        ru = frame_runner_up(sub, w.candidate)
        tail = f"  {'-':<36}{'':>8}"
        if ru is not None:
            tail = f"  {ru.candidate:<36}{(ru.tpot_us - w.tpot_us) / w.tpot_us * 100:>7.1f}%"
        wins = "" if not math.isfinite(w.win_probability) else f"{100 * w.win_probability:.0f}%"
        lines.append(f"{k:>4}  {w.candidate:<36}{w.tpot_us / 1e3:>10.3f}"
                     f"{tokens_per_s(w.tpot_us):>8.1f}{tail}{wins:>7}")
    return "\n".join(lines)


def format_evaluation(result: dict[str, Any]) -> str:
    """One line per estimator: regret and tie-aware top-1 (per cell) beside MAPE, Spearman and
    the paper's strict per-prompt top-1 and top-3."""
    lines = [f"{'estimator':<10}{'MAPE %':>7}{'regret % mean/max':>19}{'top-1 in noise':>16}"
             f"{'Spearman':>10}{'top-1':>10}{'top-3':>10}{'coverage':>10}{'pairs':>7}"]
    for est, r in result.items():
        if r is None:
            continue
        reg = r["regret_pct"]
        noise = f"{r['top1_within_noise'][0]}/{r['top1_within_noise'][1]} cells"
        cov = "-" if r["interval_coverage"] is None else f"{100 * r['interval_coverage']:.0f} %"
        rho = "-" if r["spearman"] is None or not math.isfinite(r["spearman"]) \
            else f"{r['spearman']:.3f}"
        lines.append(f"{est:<10}{r['mape_pct']:>7.2f}{reg['mean']:>11.2f} / {reg['max']:<5.2f}"
                     f"{noise:>16}{rho:>10}{r['top1'][0]:>6}/{r['top1'][1]:<3}"
                     f"{r['top3'][0]:>6}/{r['top3'][1]:<3}{cov:>10}{r['pairs']:>7}")
    lines.append("regret: how much slower the predicted winner measured than the measured "
                 "winner, per cell (K, threads, GPU share); top-1 in noise: the predicted winner "
                 "is among the candidates that measured within noise of the fastest; top-1, "
                 "top-3: per prompt, strict; coverage: measured TPOT inside the predicted 95 % "
                 "interval")
    return "\n".join(lines)


def format_per_k(result: dict[str, Any]) -> str:
    """Per cell: the measured winner (and the candidates tied with it within noise), and per
    estimator its predicted winner, regret and the MAPE of the prompt-mean TPOTs."""
    ests = [e for e, r in result.items() if r is not None]
    lines = ["", "per cell (TPOT averaged over prompts): measured winner [tied within noise]; "
                 "per estimator its predicted winner (= when it agrees, ~ when tied), regret "
                 "and MAPE %"]
    first = result[ests[0]]["per_k"]
    for i, row in enumerate(first):
        where = " ".join(f"{k}={row[k]:g}" for k in ("K", "cpu_threads", "gpu_share") if k in row)
        tied = [c for c in row.get("measured_tied", []) if c != row["measured"]]
        parts = []
        for e in ests:
            r = result[e]["per_k"][i]
            mark = "=" if r["agree"] else ("~ " + r["predicted"] if r.get("within_noise")
                                           else r["predicted"])
            parts.append(f"{e}: {mark} regret {r.get('regret_pct', float('nan')):.1f}% "
                         f"MAPE {r['mape_pct']:.1f}%")
        lines.append(f"  {where}: measured {row['measured']}"
                     + (f" [{', '.join(tied)}]" if tied else "") + " | " + " | ".join(parts))
    agree = {e: sum(r["agree"] for r in result[e]["per_k"]) for e in ests}
    lines.append("  winner agreement: " + ", ".join(f"{e} {agree[e]}/{len(first)}" for e in ests))
    return "\n".join(lines)
