"""The execution timeline as a Gantt chart (a pure function of
:mod:`cope_core.app.timeline`'s timelines)."""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from .timeline import CPU, D2H, H2D, LANES, Timeline

_KIND_COLOURS = {"CPU compute": "#c0504d", "GPU compute": "#4f81bd", "copy": "#9bbb59",
                 "sync / merge": "#7f7f7f"}


def _kind(seg) -> str:
    if seg.lane == CPU:
        return "CPU compute"
    if seg.lane in (H2D, D2H):
        return "copy"
    if seg.label.startswith(("sync", "merge")):
        return "sync / merge"
    return "GPU compute"


def timeline_figure(timelines: Sequence[Timeline], title: str = "") -> go.Figure:
    """Gantt chart of one or more strategies: a row per (strategy, lane), bars at their start
    and end; a dashed line marks the profile's measured whole-layer cost of each strategy."""
    rows = [f"{tl.name} · {lane}" for tl in timelines for lane in LANES]
    bars: dict[str, dict[str, list]] = {k: {"x": [], "base": [], "y": [], "text": []}
                                        for k in _KIND_COLOURS}
    for tl in timelines:
        for s in tl.segments:
            if s.duration_us <= 0:
                continue
            b = bars[_kind(s)]
            b["x"].append(s.duration_us)
            b["base"].append(s.start_us)
            b["y"].append(f"{tl.name} · {s.lane}")
            b["text"].append(s.label)
    fig = go.Figure()
    for kind, b in bars.items():
        fig.add_trace(go.Bar(x=b["x"], base=b["base"], y=b["y"], text=b["text"],
                             orientation="h", name=kind, marker_color=_KIND_COLOURS[kind],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate="%{text}<br>%{base:.2f} → %{x:.2f} µs long"
                                           "<extra></extra>"))
    for tl in timelines:
        ends = [f"{tl.name} · {LANES[0]}", f"{tl.name} · {LANES[-1]}"]
        fig.add_trace(go.Scatter(x=[tl.total_us] * 2, y=ends, mode="lines",
                                 line=dict(color="#111", width=2),
                                 name=f"{tl.name}: composed end {tl.total_us:.1f} µs",
                                 hoverinfo="name"))
        if tl.measured_us is not None:
            fig.add_trace(go.Scatter(x=[tl.measured_us] * 2, y=ends, mode="lines",
                                     line=dict(color="#d62728", width=2, dash="dash"),
                                     name=f"{tl.name}: profiled schedule {tl.measured_us:.1f} µs",
                                     hoverinfo="name"))
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1])
    fig.update_layout(barmode="overlay", title=title, xaxis_title="µs from the start of the layer",
                      height=140 + 32 * len(rows), margin=dict(l=10, r=10, t=60, b=40),
                      legend=dict(orientation="h", y=-0.25))
    return fig


#: Line colours of the platforms on the Compare page (up to four).
