"""What the Predicted vs measured page shows of a ``cope verify`` record: the per-cell table, a
one-line summary and the race of one cell as a figure. Pure functions of the record."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..estimate.noise import median_over_trials
from ..verify import VerifyCell, VerifyRecord
from .figures import candidate_style


def verify_summary(record: VerifyRecord) -> str:
    """The record in one sentence: where the prediction stood and what the race saved."""
    t = record.totals()
    share = 100 * t["candidate_trials"] / max(t["full_candidate_trials"], 1)
    return (f"The prediction stood in {t['agree']} of {t['cells']} cells (its winner measured "
            f"fastest or within noise of the fastest). The race measured "
            f"{t['candidate_trials']} candidate-trials of the {t['full_candidate_trials']} a full "
            f"measurement takes ({share:.0f} %): {t['seconds'] / 60:.1f} min against an "
            f"estimated {t['full_seconds_estimate'] / 60:.1f} min.")


def verify_table(record: VerifyRecord) -> pd.DataFrame:
    """One row per cell: the predicted and the verified winner, how the race ended and what it
    cost."""
    rows = []
    for c in record.cells:
        lo, hi = c.measured_lo_us, c.measured_hi_us
        rows.append({
            "K": c.K, "CPU threads": c.cpu_threads, "predicted": c.predicted_winner,
            "verified": c.verified_winner,
            "prediction": ("verified" if c.verified_winner == c.predicted_winner
                           else "within noise" if c.agrees else "refuted"),
            "verified TPOT ms": c.measured_us / 1e3,
            "95 % interval ms": (f"{lo / 1e3:.3f} – {hi / 1e3:.3f}"
                                 if lo is not None and hi is not None else "–"),
            "stop": c.stop, "rounds": c.rounds, "contenders": len(c.contenders),
            "dropped": ", ".join(f"{d['candidate']} (round {d['round']}, "
                                 f"{d['behind_pct']:+.1f} %)" for d in c.dropped) or "–",
            "candidate-trials": f"{c.candidate_trials} / {c.full_candidate_trials}",
            "seconds": round(c.seconds), "full measurement s (est.)":
                round(c.full_seconds_estimate)})
    return pd.DataFrame(rows)


def race_frame(cell: VerifyCell) -> pd.DataFrame:
    """Each contender's measured TPOT after every round it ran (median over its trials so far
    per prompt, mean over prompts): ``candidate, round, measured_us``."""
    runs = pd.DataFrame(cell.runs, columns=["candidate", "prompt", "trial", "tpot_us"])
    out = []
    for r in range(1, cell.rounds + 1):
        upto = runs[runs["trial"] < r]
        ran = set(runs.loc[runs["trial"] == r - 1, "candidate"])
        tp = median_over_trials(upto[upto["candidate"].isin(ran)])
        for cand, v in tp.groupby("candidate", sort=False)["measured_us"].mean().items():
            out.append({"candidate": cand, "round": r, "measured_us": float(v)})
    return pd.DataFrame(out, columns=["candidate", "round", "measured_us"])


def race_figure(cell: VerifyCell, title: str = "") -> go.Figure:
    """The race of one cell: every contender's measured TPOT round by round, its predicted TPOT
    as a dotted level, a cross where it was dropped."""
    frame = race_frame(cell)
    fig = go.Figure()
    dropped = {d["candidate"]: d for d in cell.dropped}
    for x in cell.contenders:
        cand = x["candidate"]
        colour, dash, symbol = candidate_style(cand)
        sub = frame[frame["candidate"] == cand]
        fig.add_trace(go.Scatter(x=sub["round"], y=sub["measured_us"] / 1e3,
                                 mode="lines+markers", name=cand, legendgroup=cand,
                                 line=dict(color=colour, dash=dash),
                                 marker=dict(symbol=symbol, size=8),
                                 hovertemplate=cand + "<br>round %{x}: %{y:.3f} ms measured"
                                                      "<extra></extra>"))
        fig.add_trace(go.Scatter(x=[1, max(cell.rounds, 1)], y=[x["predicted_us"] / 1e3] * 2,
                                 mode="lines", line=dict(color=colour, dash="dot", width=1),
                                 legendgroup=cand, showlegend=False,
                                 hovertemplate=cand + f"<br>predicted {x['predicted_us'] / 1e3:.3f}"
                                                      " ms<extra></extra>"))
        if cand in dropped and len(sub):
            d = dropped[cand]
            fig.add_trace(go.Scatter(x=[d["round"]], y=[d["measured_us"] / 1e3], mode="markers",
                                     marker=dict(symbol="x", size=14, color=colour),
                                     legendgroup=cand, showlegend=False,
                                     hovertemplate=f"{cand} dropped after round {d['round']} "
                                                   f"({d['behind_pct']:+.1f} %)<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="round (one paired trial of every contender left)",
                      yaxis_title="measured TPOT (ms), predicted dotted", height=420,
                      margin=dict(l=10, r=10, t=60, b=40), xaxis=dict(dtick=1))
    return fig

