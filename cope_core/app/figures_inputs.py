"""Figures of the inputs: trace statistics, profile costs and predicted-vs-measured.
Pure functions of arrays and frames returning plotly figures."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..profile.data import ATOMIC_PER_N
from .figures import candidate_style

_OP_COLOURS = dict(zip(ATOMIC_PER_N, ("#4f81bd", "#c0504d", "#9bbb59", "#8064a2")))
_OP_TEXT = {"gpu_expert": "R: resident experts on GPU", "cpu_expert": "C: experts on CPU",
            "stage": "S: copy weights host→device",
            "staged_gpu_expert": "G: staged experts on GPU"}


# --- traces -------------------------------------------------------------------------------------
def popularity_heatmap(share: np.ndarray, sorted_: bool, title: str = "") -> go.Figure:
    """Layer x expert routing share (fraction of tokens routed to each expert)."""
    fig = go.Figure(go.Heatmap(
        z=share, colorscale="Viridis", colorbar=dict(title="share of tokens"),
        hovertemplate=("layer %{y}, " + ("rank" if sorted_ else "expert") +
                       " %{x}: %{z:.3f}<extra></extra>")))
    fig.update_layout(title=title, xaxis_title="popularity rank" if sorted_ else "expert id",
                      yaxis_title="MoE layer", height=460, margin=dict(l=10, r=10, t=60, b=40))
    return fig


def reuse_figure(reuse: np.ndarray, title: str = "") -> go.Figure:
    """Token-to-token reuse per layer, with its mean."""
    layers = np.arange(reuse.size)
    fig = go.Figure(go.Bar(x=layers, y=reuse, name="reuse", marker_color="#4f81bd",
                           hovertemplate="layer %{x}: %{y:.3f}<extra></extra>"))
    mean = float(np.nanmean(reuse)) if np.isfinite(reuse).any() else float("nan")
    fig.add_hline(y=mean, line_dash="dash", annotation_text=f"mean {mean:.3f}")
    fig.update_layout(title=title, xaxis_title="MoE layer",
                      yaxis_title="share of routed experts also routed by the previous token",
                      yaxis_range=[0, 1], height=360, margin=dict(l=10, r=10, t=60, b=40))
    return fig


def hit_rate_figure(rates: pd.DataFrame, title: str = "") -> go.Figure:
    """Hit rate against K, one line per residency (and the layer-partition GPU share)."""
    fig = go.Figure()
    for res, sub in rates.groupby("residency", sort=False):
        fig.add_trace(go.Scatter(x=sub["experts_per_layer"], y=sub["hit_rate"], mode="lines",
                                 name=res, hovertemplate=res + "<br>K = %{x}: %{y:.3f}"
                                                           "<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="experts per layer K", yaxis_title="hit rate",
                      yaxis_range=[0, 1.02], height=380, margin=dict(l=10, r=10, t=60, b=40))
    return fig


def recall_figure(frame: pd.DataFrame, title: str = "") -> go.Figure:
    """Recall per layer pair for the trace's predictor and the baselines (one line each)."""
    fig = go.Figure()
    for col in [c for c in frame.columns if c != "layer"]:
        fig.add_trace(go.Scatter(x=frame["layer"], y=frame[col], mode="lines+markers", name=col))
    fig.update_layout(title=title, xaxis_title="layer l (predicting l + 1)", yaxis_title="recall",
                      yaxis_range=[0, 1.02], height=360, margin=dict(l=10, r=10, t=60, b=40))
    return fig


# --- profiles -----------------------------------------------------------------------------------
def atomic_figure(frame: pd.DataFrame, title: str = "", y_max: float | None = None
                  ) -> go.Figure:
    """Atomic-operator cost against the number of experts: the profile's values (solid) and
    the roofline estimate from the platform's peak numbers (dashed); ``y_max`` fixes the
    axis (0 to it), so that charts side by side share one scale."""
    fig = go.Figure()
    for name, sub in frame.groupby("op", sort=False):
        colour = _OP_COLOURS.get(name)
        fig.add_trace(go.Scatter(x=sub["n"], y=sub["profile_us"], mode="lines+markers",
                                 name=f"{_OP_TEXT.get(name, name)} (profile)",
                                 line=dict(color=colour)))
        if sub["roofline_us"].notna().any():
            fig.add_trace(go.Scatter(x=sub["n"], y=sub["roofline_us"], mode="lines",
                                     name=f"{name} (roofline)",
                                     line=dict(color=colour, dash="dash")))
    fig.update_layout(title=title, xaxis_title="number of experts n", yaxis_title="µs",
                      yaxis_range=None if y_max is None else [0.0, y_max], height=460,
                      margin=dict(l=10, r=10, t=60, b=40),
                      legend=dict(orientation="h", y=-0.3, yanchor="top"))
    return fig


def schedule_heatmap(grid: np.ndarray, split: np.ndarray, title: str = "",
                     z_max: float | None = None) -> go.Figure:
    """Cost-selected schedule cost at ``h`` hits (rows) and ``c`` CPU misses (columns); the
    split COPE picks at each ``h`` is marked with a star; ``z_max`` fixes the colour scale (0
    to it), so that heatmaps side by side share one."""
    k = grid.shape[0] - 1
    text = [["" if np.isnan(grid[h, c]) else (("★ " if split[h] == c else "")
                                               + f"{grid[h, c]:.0f}")
             for c in range(k + 1)] for h in range(k + 1)]
    fig = go.Figure(go.Heatmap(z=grid, x=list(range(k + 1)), y=list(range(k + 1)), text=text,
                               texttemplate="%{text}", colorscale="Blues",
                               zmin=None if z_max is None else 0.0, zmax=z_max,
                               colorbar=dict(title="µs"),
                               hovertemplate="h = %{y}, c = %{x}: %{z:.1f} µs<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="c: misses computed on the CPU",
                      yaxis_title="h: hits", height=420, margin=dict(l=10, r=10, t=60, b=40))
    return fig


_VERDICT_COLOURS = {"contention": "#c0504d", "faster": "#4f81bd", "as composed": "#7f7f7f"}


def contention_figure(df: pd.DataFrame, title: str = "") -> go.Figure:
    """Each schedule's excess over the composition of its isolated ops (% of the composition),
    one bar per (execution, h, c, u) of a :func:`~cope_core.estimate.contention.contention`
    frame, coloured by its verdict; the hover gives the measured, composed and serial costs."""
    labels = [f"{e} h{h} c{c} u{u}" for e, h, c, u in
              zip(df["execution"], df["hits"], df["cpu"], df["staged"])]
    fig = go.Figure()
    for verdict, colour in _VERDICT_COLOURS.items():
        sel = (df["verdict"] == verdict).to_numpy()
        if not sel.any():
            continue
        sub = df[sel]
        fig.add_trace(go.Bar(
            x=np.asarray(labels)[sel], y=sub["excess_pct"], name=verdict, marker_color=colour,
            customdata=np.stack([sub["measured_us"] / 1e3, sub["composed_us"] / 1e3,
                                 sub["serial_us"] / 1e3], axis=-1),
            hovertemplate="%{x}: %{y:+.1f} %<br>measured %{customdata[0]:.3f} ms, composed "
                          "%{customdata[1]:.3f} ms, serial %{customdata[2]:.3f} ms"
                          "<extra></extra>"))
    fig.add_hline(y=0.0, line_color="#444")
    fig.update_layout(title=title, yaxis_title="measured over composed (%)",
                      xaxis=dict(categoryorder="array", categoryarray=labels, tickangle=-45),
                      height=420, margin=dict(l=10, r=10, t=60, b=40),
                      legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom"))
    return fig


def shared_figure(frames: dict[str, pd.DataFrame], title: str = "") -> go.Figure:
    """Shared per-token cost against context, one line per profile."""
    fig = go.Figure()
    for label, f in frames.items():
        fig.add_trace(go.Scatter(x=f["context"], y=f["shared_us"] / 1e3, mode="lines+markers",
                                 name=label))
    fig.update_layout(title=title, xaxis_title="context (tokens in the KV cache)",
                      yaxis_title="shared cost (ms per token)", xaxis_type="log", height=360,
                      margin=dict(l=10, r=10, t=60, b=40), legend=dict(orientation="h", y=-0.3))
    return fig


# --- predicted vs measured ----------------------------------------------------------------------
def pvm_scatter(pairs: dict[str, pd.DataFrame], title: str = "") -> go.Figure:
    """Predicted against measured TPOT, one panel per estimator, with the identity line, a
    ±10% band and each prediction's 95 % interval when the pairs carry one."""
    n = max(len(pairs), 1)
    fig = make_subplots(rows=1, cols=n, subplot_titles=list(pairs) or [""], shared_yaxes=True)
    hi = max([max(p["predicted_us"].max(), p["measured_us"].max()) for p in pairs.values()]
             + [1.0]) / 1e3 * 1.05
    lo = min([min(p["predicted_us"].min(), p["measured_us"].min()) for p in pairs.values()]
             + [hi]) / 1e3 * 0.95
    xs = np.array([lo, hi])
    for i, p in enumerate(pairs.values(), start=1):
        fig.add_trace(go.Scatter(x=np.r_[xs, xs[::-1]], y=np.r_[xs * 1.1, xs[::-1] * 0.9],
                                 fill="toself", fillcolor="rgba(120,120,120,0.15)",
                                 line=dict(width=0), name="±10%", showlegend=i == 1,
                                 hoverinfo="skip"), row=1, col=i)
        fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", line=dict(color="#111", dash="dash"),
                                 name="identity", showlegend=i == 1, hoverinfo="skip"),
                      row=1, col=i)
        for cand, sub in p.groupby("candidate", sort=False):
            err = None
            lo = sub["predicted_lo_us"].to_numpy(float) if "predicted_lo_us" in sub else None
            if lo is not None and np.isfinite(lo).all():
                y = sub["predicted_us"].to_numpy(float)
                err = dict(type="data", symmetric=False, thickness=1, width=0,
                           array=(sub["predicted_hi_us"].to_numpy(float) - y) / 1e3,
                           arrayminus=(y - lo) / 1e3,
                           color=candidate_style(cand)[0])
            fig.add_trace(go.Scatter(
                x=sub["measured_us"] / 1e3, y=sub["predicted_us"] / 1e3, mode="markers",
                name=cand, legendgroup=cand, showlegend=i == 1, error_y=err,
                marker=dict(color=candidate_style(cand)[0], symbol=candidate_style(cand)[2],
                            size=9),
                customdata=np.stack([sub["prompt"], sub["K"]], axis=1),
                hovertemplate=cand + "<br>prompt %{customdata[0]}, K = %{customdata[1]}<br>"
                              "measured %{x:.3f} ms, predicted %{y:.3f} ms<extra></extra>"),
                row=1, col=i)
        fig.update_xaxes(title_text="measured TPOT (ms)", range=[lo, hi], row=1, col=i)
    fig.update_yaxes(title_text="predicted TPOT (ms)", range=[lo, hi], row=1, col=1)
    fig.update_layout(title=title, height=460, margin=dict(l=10, r=10, t=80, b=40))
    return fig


def drilldown_figure(frame: pd.DataFrame, title: str = "") -> go.Figure:
    """One prompt: measured TPOT and each estimator's prediction per candidate."""
    label = [f"{c} (K={k})" for c, k in zip(frame["candidate"], frame["K"])]
    fig = go.Figure(go.Bar(x=label, y=frame["measured_us"] / 1e3, name="measured",
                           marker_color="#111"))
    for col in [c for c in frame.columns if c.endswith("_us") and c != "measured_us"]:
        fig.add_trace(go.Bar(x=label, y=frame[col] / 1e3, name=col[:-3]))
    fig.update_layout(barmode="group", title=title, yaxis_title="TPOT (ms per token)",
                      height=420, margin=dict(l=10, r=10, t=60, b=120))
    return fig
