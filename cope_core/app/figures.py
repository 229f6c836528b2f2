"""Figures of the policy views: TPOT per candidate, TPOT vs VRAM budget, the Policy Matrix
heatmap and execution timelines. Each is a pure function of frames returning a plotly figure.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..geometry import ModelGeometry
from ..matrix import CANDIDATE_IDS, EXECUTIONS, RESIDENCIES, candidate_id
from .whatif import Region, plain, sweep_budgets

#: Colour by execution, line dash and marker by residency, so that 13 lines stay readable.
EXECUTION_COLOURS = dict(zip([e.value for e in EXECUTIONS], ("#1f77b4", "#d62728", "#ff7f0e",
                                                             "#2ca02c")))
RESIDENCY_DASH = dict(zip([r.value for r in RESIDENCIES], ("solid", "dash", "dot")))
RESIDENCY_SYMBOL = dict(zip([r.value for r in RESIDENCIES], ("circle", "square", "diamond")))


def candidate_style(cid: str) -> tuple[str, str, str]:
    """(colour, dash, marker symbol) of a candidate; the layer partition is black."""
    if "/" not in cid:
        return "#111111", "solid", "x"
    res, exe = cid.split("/")
    return EXECUTION_COLOURS[exe], RESIDENCY_DASH[res], RESIDENCY_SYMBOL[res]


#: One colour per candidate (its execution's), the same in every figure.
CANDIDATE_COLOURS = {c: candidate_style(c)[0] for c in CANDIDATE_IDS}
PART_COLOURS = {"shared": "#9aa5b1", "experts": "#2f6fb0", "prefetch": "#e39b2d"}


def _ms(us) -> np.ndarray:
    return np.asarray(us, dtype=float) / 1e3


def _interval(df: pd.DataFrame, y: Callable[[pd.DataFrame, str], np.ndarray] | None = None
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row's 95 % TPOT interval in ms (low, high), or None when the frame has no draws;
    ``y(rows, column)``: the plotted value of a TPOT column instead (e.g. a request's time)."""
    if "tpot_lo_us" not in df or not np.isfinite(df["tpot_lo_us"].to_numpy(float)).all():
        return None
    if y is not None:
        return y(df, "tpot_lo_us"), y(df, "tpot_hi_us")
    return _ms(df["tpot_lo_us"]), _ms(df["tpot_hi_us"])


def _wins(df: pd.DataFrame) -> list[str]:
    """Each row's win probability in words (or the candidate it is the same policy as)."""
    out = []
    for p, eq in zip(df["win_probability"], df["equivalent_to"]):
        out.append(f"the same policy here as {eq}" if isinstance(eq, str) else
                   "" if not np.isfinite(p) else f"fastest in {100 * p:.0f} % of draws")
    return out


def _band(x: np.ndarray, rows: pd.DataFrame, name: str,
          y: Callable[[pd.DataFrame, str], np.ndarray] | None = None) -> list[dict]:
    """The 95 % band of ``rows`` (the winner at each K) along ``x`` as two traces, when they
    have draws (none else)."""
    iv = _interval(rows, y)
    if iv is None:
        return []
    lo, hi = iv
    return [dict(type="scatter", x=x, y=hi, mode="lines", line=dict(width=0), showlegend=False,
                 hoverinfo="skip"),
            dict(type="scatter", x=x, y=lo, mode="lines", line=dict(width=0), fill="tonexty",
                 fillcolor="rgba(17,17,17,0.13)", name=name, hoverinfo="skip")]


def _add_band(fig: go.Figure, x: np.ndarray, rows: pd.DataFrame, name: str) -> None:
    """:func:`_band` added to ``fig``."""
    fig.add_traces(_band(x, rows, name))


def _legend_width(names: Sequence[str]) -> int:
    """Pixels a vertical legend of ``names`` takes right of the plot (plotly's automargin
    would push the margin there and draw the chart a second time: on every operating point)."""
    return 70 + 6 * max((len(str(n)) for n in names), default=0)


def _budget_line(current_gib: float | None) -> list[dict]:
    """The current budget as a dashed vertical line (a layout shape), or none."""
    if current_gib is None:
        return []
    return [dict(type="line", xref="x", yref="paper", x0=current_gib, x1=current_gib, y0=0,
                 y1=1, line=dict(color="#111", dash="dash", width=1.2))]


def tpot_bars(df: pd.DataFrame, title: str = "") -> go.Figure:
    """TPOT per candidate at one K, parts stacked (shared / experts / prefetch), best on top,
    the winner starred and outlined, each total with its 95 % interval when there are draws."""
    s = df.sort_values("rank", ascending=False)          # plotly draws the first row lowest
    win = s["winner"].to_numpy()
    labels = [("★ " if w else "") + c for c, w in zip(s["candidate"], win)]
    fig = go.Figure()
    for part in ("shared", "experts", "prefetch"):
        fig.add_trace(go.Bar(
            x=_ms(s[f"{part}_us"]), y=labels, orientation="h", name=part,
            marker=dict(color=PART_COLOURS[part],
                        line=dict(width=np.where(win, 2.5, 0.0), color="#111")),
            customdata=np.stack([s["candidate"], _ms(s["tpot_us"])], axis=1),
            hovertemplate="%{customdata[0]}<br>" + part + ": %{x:.3f} ms<br>"
                          "TPOT %{customdata[1]:.3f} ms<extra></extra>"))
    tpot = _ms(s["tpot_us"])
    iv = _interval(s)
    if iv is not None:          # the 95 % interval of each candidate's TPOT, on the bar's end
        lo, hi = iv
        fig.add_trace(go.Scatter(
            x=tpot, y=labels, mode="markers", name="95 % interval",
            marker=dict(size=4, color="#111"),
            error_x=dict(type="data", symmetric=False, array=hi - tpot, arrayminus=tpot - lo,
                         color="#111", thickness=1.5, width=5),
            customdata=np.stack([s["candidate"], lo, hi, np.asarray(_wins(s), object)], axis=1),
            hovertemplate="%{customdata[0]}<br>TPOT %{x:.3f} ms, 95 % interval "
                          "[%{customdata[1]:.3f}, %{customdata[2]:.3f}]<br>"
                          "%{customdata[3]}<extra></extra>"))
    end = tpot if hi is None else np.maximum(tpot, hi)
    fig.add_trace(go.Scatter(x=end, y=labels, mode="text", text=[f" {t:.2f}" for t in tpot],
                             textposition="middle right", textfont=dict(size=10),
                             showlegend=False, hoverinfo="skip"))
    # margins that hold the labels and the legend below (else the browser's automargin draws
    # the chart twice)
    fig.update_layout(barmode="stack", title=title, xaxis_title="TPOT (ms per token)",
                      height=max(260, 34 * len(s) + 110), legend=dict(orientation="h", y=-0.18),
                      margin=dict(l=8 + 6 * max(map(len, labels)), r=40, t=60, b=110))
    return fig


def tpot_vs_budget(sweep: pd.DataFrame, g: ModelGeometry, regions: Sequence[Region],
                   current_gib: float | None = None, current_k: int | None = None,
                   title: str = "", log_y: bool = False,
                   uncertain: Sequence[tuple[float, float, int, int]] = ()) -> go.Figure:
    """TPOT of every candidate against the VRAM budget, the winner's regions shaded, the
    winner's 95 % band, the budget ranges where the winner is unsure (``uncertain``, from
    :func:`cope_core.app.whatif.uncertain_ranges`) as a red strip, and the current budget marked
    (:func:`budget_base` marked by :func:`mark_budget`)."""
    fig = budget_base(sweep, g, regions, title, log_y, uncertain)
    if current_gib is not None:
        shape, note = _budget_marker(fig.layout.meta["x_range"], current_gib, current_k)
        fig.update_layout(shapes=[*fig.layout.shapes, shape],
                          annotations=[*fig.layout.annotations, note])
    return fig


def budget_base(sweep: pd.DataFrame, g: ModelGeometry, regions: Sequence[Region],
                title: str = "", log_y: bool = False,
                uncertain: Sequence[tuple[float, float, int, int]] = ()) -> go.Figure:
    """:func:`tpot_vs_budget` without the current budget: what does not move with the slider,
    drawn once (the explorer keeps :func:`budget_spec`, this figure's ``to_dict()``, for every
    session)."""
    return go.Figure(budget_spec(sweep, g, regions, title, log_y, uncertain))


def budget_spec(sweep: pd.DataFrame, g: ModelGeometry, regions: Sequence[Region],
                title: str = "", log_y: bool = False,
                uncertain: Sequence[tuple[float, float, int, int]] = (),
                request: tuple[np.ndarray, int] | None = None) -> dict:
    """:func:`budget_base` as the plain dict plotly's validation would make of it, built without
    validating each trace (tens of ms per operating point): ``data`` and ``layout``. ``request``
    ``(ttft_s, G)``: plot each candidate's request time instead of its TPOT, ``ttft_s[K]`` (the
    time to the first token at each K) plus ``G`` tokens at its TPOT."""
    sweep = plain(sweep)
    x_all = sweep_budgets(sweep, g)
    y: Callable[[pd.DataFrame, str], np.ndarray] | None = None
    unit, axis = "ms/token", "TPOT (ms per token)"
    if request is not None:
        ttft, gen = request

        def y(rows: pd.DataFrame, col: str) -> np.ndarray:
            return (ttft[rows["experts_per_layer"].to_numpy(int)]
                    + gen * rows[col].to_numpy(float) / 1e6)
        unit, axis = "s", f"request time (s): first token + {gen:,} tokens"
    data: list[dict] = []
    win = sweep[sweep["winner"]].sort_values("experts_per_layer")
    band = _band(x_all[sweep.index.get_indexer(win.index)], win, "winner's 95 % band", y)
    data += band
    for cand, sub in sweep.groupby("candidate", sort=False):
        pos = sweep.index.get_indexer(sub.index.to_numpy())
        colour, dash, _ = candidate_style(cand)
        data.append(dict(
            type="scatter", x=x_all[pos], y=_ms(sub["tpot_us"]) if y is None
            else y(sub, "tpot_us"), mode="lines", name=cand,
            line=dict(color=colour, dash=dash, width=2.2 if "/" in cand else 2.6),
            customdata=sub["experts_per_layer"].to_numpy(),
            hovertemplate=cand + "<br>%{x:.2f} GiB (K = %{customdata})<br>"
                                 "%{y:.3f} " + unit + "<extra></extra>"))
    x_lo, x_hi = float(x_all.min()), float(x_all.max())
    shapes, notes = [], []
    for r in regions:
        x1 = r.gib_to if r.gib_to is not None else x_hi
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=r.gib_from, x1=x1, y0=0,
                           y1=1, fillcolor=CANDIDATE_COLOURS.get(r.candidate), opacity=0.10,
                           line=dict(width=0), layer="below"))
        if x1 - r.gib_from > (x_hi - x_lo) * 0.08:
            notes.append(dict(x=r.gib_from, xref="x", y=1, yref="paper", text=r.candidate,
                              showarrow=False, xanchor="left", yanchor="top",
                              font=dict(size=10)))
    for a, b, _, _ in uncertain:
        # a red strip along the axis: plotly shapes cannot be hatched
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=a, x1=b, y0=0, y1=0.05,
                           fillcolor="#c0392b", opacity=0.55, line=dict(width=0),
                           layer="above"))
    if uncertain:
        notes.append(dict(x=uncertain[0][0], xref="x", y=0.07, yref="paper", showarrow=False,
                          xanchor="left", yanchor="bottom", font=dict(size=10, color="#c0392b"),
                          text="unsure: tied, no candidate faster than every rival in "
                               "97.5 % of the paired draws"))
    # the margins the legend and the tick labels take (the browser's automargin would push
    # them there and draw the chart a second time, on every operating point)
    return {"data": data, "layout": dict(
        shapes=shapes, annotations=notes, meta={"x_range": [x_lo, x_hi]},
        title=dict(text=title), xaxis=dict(title=dict(text="VRAM budget (GiB)")),
        yaxis=dict(title=dict(text=axis), type="log" if log_y else "linear"),
        height=480, margin=dict(l=75, b=70, t=60, r=_legend_width(
            [*sweep["candidate"].unique(), *(b["name"] for b in band[1:])])))}


def mark_budget(base: dict, current_gib: float | None,
                current_k: int | None = None) -> go.Figure:
    """The budget chart ``base`` (:func:`budget_spec`, or a :func:`budget_base` figure's
    ``to_dict()``; not modified) with the current budget as a dashed line and its label. The
    figure is assembled without validating it (``budget_base`` validates the same dict, and the
    tests draw it): a slider move costs a few milliseconds here instead of drawing every trace
    anew."""
    layout = dict(base["layout"])
    if current_gib is not None:
        shape, note = _budget_marker(layout["meta"]["x_range"], current_gib, current_k)
        layout.update(shapes=[*layout.get("shapes", ()), shape],
                      annotations=[*layout.get("annotations", ()), note])
    return go.Figure({"data": base["data"], "layout": layout}, _validate=False)


def _budget_marker(x_range: Sequence[float], current_gib: float,
                   current_k: int | None) -> tuple[dict, dict]:
    """The current budget on the budget chart: a dashed line and its label, within the axis."""
    x = min(max(current_gib, x_range[0]), x_range[1])
    return (dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1,
                 line=dict(color="#111", dash="dash", width=1.5)),
            dict(x=x, xref="x", y=0, yref="paper", showarrow=False, xanchor="left",
                 yanchor="bottom", text=f"{current_gib:g} GiB" + (
                     f" → K = {current_k}" if current_k is not None else "")))


def best_vs_budget(sweep: pd.DataFrame, g: ModelGeometry, current_gib: float | None = None,
                   title: str = "") -> go.Figure:
    """The small answer chart: the best predicted TPOT at every budget (markers coloured by the
    winning candidate, its 95 % band) and the layer-partition baseline, the budget marked."""
    sweep = plain(sweep)
    x_all = sweep_budgets(sweep, g)
    win = sweep[sweep["winner"]].sort_values("experts_per_layer")
    xw = x_all[sweep.index.get_indexer(win.index)]
    fig = go.Figure()
    _add_band(fig, xw, win, "95 % band")
    fig.add_trace(go.Scatter(
        x=xw, y=_ms(win["tpot_us"]), mode="lines+markers", name="best candidate",
        line=dict(color="#555", width=1.5),
        marker=dict(size=6, color=[CANDIDATE_COLOURS.get(c, "#111") for c in win["candidate"]]),
        customdata=np.stack([win["candidate"], win["experts_per_layer"]], axis=1),
        hovertemplate="%{customdata[0]}<br>%{x:.2f} GiB (K = %{customdata[1]})<br>"
                      "%{y:.3f} ms/token<extra></extra>"))
    lp = sweep[sweep["candidate"] == "layer_partition"].sort_values("experts_per_layer")
    if len(lp):
        fig.add_trace(go.Scatter(x=x_all[sweep.index.get_indexer(lp.index)],
                                 y=_ms(lp["tpot_us"]), mode="lines", name="layer_partition",
                                 line=dict(color="#111", dash="dot", width=1.5),
                                 hovertemplate="layer_partition<br>%{x:.2f} GiB<br>"
                                               "%{y:.3f} ms/token<extra></extra>"))
    fig.update_layout(title=title, shapes=_budget_line(current_gib),
                      xaxis_title="VRAM budget (GiB)",
                      yaxis_title="TPOT (ms per token)", height=330,
                      margin=dict(l=10, r=10, t=50, b=40), legend=dict(orientation="h", y=-0.3))
    return fig


def matrix_heatmap(df: pd.DataFrame | None, table: dict, title: str = "") -> go.Figure:
    """The 3 x 4 Policy Matrix, each cell coloured by predicted TPOT (ms) and labelled with
    its prior systems (or "new"); cells without a prediction stay blank."""
    cands = {c["id"]: c for c in table["candidates"]}
    tpot = {} if df is None else dict(zip(df["candidate"], _ms(df["tpot_us"])))
    ci = {}
    if df is not None:
        iv = _interval(df)
        if iv is not None:
            lo, hi = iv
            ci = {c: f", 95 % interval [{a:.3f}, {b:.3f}] ms<br>{w}"
                  for c, a, b, w in zip(df["candidate"], lo, hi, _wins(df))}
    winner = None
    if df is not None and len(df):
        winner = df.loc[df["rank"].idxmin(), "candidate"]
    xs = [e.value for e in EXECUTIONS]
    ys = [r.value for r in RESIDENCIES]
    z, text, ids = [], [], []
    for r in RESIDENCIES:
        zr, tr, ir = [], [], []
        for e in EXECUTIONS:
            cid = candidate_id(r, e)
            c = cands[cid]
            who = "new (COPE)" if c["new"] else "<br>".join(c["prior_systems"])
            if not c["in_paper"]:
                who += "<br><i>not instantiated in the paper</i>"
            v = tpot.get(cid, np.nan)
            val = "" if np.isnan(v) else f"<br><b>{v:.2f} ms</b>"
            star = "★ " if cid == winner else ""
            zr.append(v)
            tr.append(f"{star}{who}{val}")
            ir.append([cid, ci.get(cid, "")])
        z.append(zr)
        text.append(tr)
        ids.append(ir)
    fig = go.Figure(go.Heatmap(
        z=z, x=xs, y=ys, text=text, texttemplate="%{text}", textfont=dict(size=13),
        customdata=ids,
        colorscale="RdYlGn_r", colorbar=dict(title="TPOT ms"), xgap=3, ygap=3,
        hovertemplate="%{customdata[0]}<br>TPOT %{z:.3f} ms%{customdata[1]}<extra></extra>"))
    # invisible markers on the cell centres make cells selectable by a click in the app
    fig.add_trace(go.Scatter(
        x=[e for _ in ys for e in xs], y=[r for r in ys for _ in xs],
        customdata=[cid for row in ids for cid, _ in row], mode="markers",
        text=[("" if np.isnan(tpot.get(cid, np.nan)) else f"TPOT {tpot[cid]:.3f} ms{extra}<br>")
              for row in ids for cid, extra in row],
        marker=dict(size=60, symbol="square", opacity=0.0), showlegend=False,
        hovertemplate="%{customdata}<br>%{text}click to draw its timeline<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title, height=470, margin=dict(l=10, r=10, t=60, b=40),
                      xaxis_title="execution", yaxis_title="residency")
    return fig


PLATFORM_COLOURS = ("#1b4f72", "#b03a2e", "#1e8449", "#7d3c98")


def compare_figure(sweep: pd.DataFrame, current_gib: float | None = None,
                   title: str = "") -> go.Figure:
    """Best predicted TPOT against the VRAM budget, one line per platform (ending at its own
    memory), each point coloured by the candidate that wins there."""
    fig = go.Figure()
    for i, (plat, sub) in enumerate(sweep.groupby("platform", sort=False)):
        colour = PLATFORM_COLOURS[i % len(PLATFORM_COLOURS)]
        fig.add_trace(go.Scatter(
            x=sub["budget_gib"], y=_ms(sub["tpot_us"]), mode="lines+markers", name=plat,
            line=dict(color=colour, width=2),
            marker=dict(size=6, color=[CANDIDATE_COLOURS.get(c, "#111") for c in sub["winner"]],
                        line=dict(color=colour, width=1)),
            customdata=np.stack([sub["winner"], sub["experts_per_layer"]], axis=1),
            hovertemplate=plat + "<br>%{x:.2f} GiB (K = %{customdata[1]})<br>"
                          "%{customdata[0]} wins at %{y:.3f} ms/token<extra></extra>"))
    fig.update_layout(title=title, shapes=_budget_line(current_gib),
                      xaxis_title="VRAM budget (GiB)",
                      yaxis_title="best TPOT (ms per token)", height=460,
                      margin=dict(l=10, r=10, t=60, b=40), legend=dict(orientation="h", y=-0.2))
    return fig
