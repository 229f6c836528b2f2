"""llama.cpp's own MoE cache in the explorer: the table of its best configurations, the sentence
that compares them, and TPOT against the cache size (pure functions of a search's results)."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..geometry import ModelGeometry
from ..llamacpp import (
    CACHE_LABEL,
    FIT_NAME,
    CacheRecord,
    cache_note_lines,
    share_text,
    spread_text,
)


def best_table(rec: CacheRecord, g: ModelGeometry, cpu_threads: int) -> pd.DataFrame:
    """One row per kind (each eviction rule's fastest configuration, and no cache)."""
    rows = []
    for b in rec.best:
        rows.append({
            "kind": CACHE_LABEL + (" · " + b.candidate.split("/")[1] if b.cache_mib
                             else " · off (--n-cpu-moe only)"),
            "TPOT ms": round(b.tpot_us / 1e3, 3),
            # the class-LRU rests on inferred rules: its TPOT under every reading of them
            "inferred rules": spread_text(rec, b) or ("none inferred" if b.cache_mib else "—"),
            # spelled for the build assumed (-ot before --n-cpu-moe, no -fit off before --fit)
            "llama-server flags": rec.assumed.spell(
                b.flags(g.dense_layers + g.n_layers, cpu_threads)).text(),
            "build": b.build or "any", "slots": b.slots,
            "hits/token": round(b.hits, 1), "uploads/token": round(b.uploads, 1),
            "CPU misses/token": round(b.cpu_misses, 1)})
    return pd.DataFrame(rows)


def verdict(rec: CacheRecord, g: ModelGeometry | None = None) -> str:
    """The best configuration against layer_partition and the Policy Matrix's winner (the
    answer's lead sentence, :func:`cope_core.export.llamacpp.lead_sentence`, is shown before
    it); then, given the
    geometry, the cache's cliff and the spread of the class-LRU's inferred rules
    (:func:`cope_core.llamacpp.answer.cache_notes.cache_note_lines`)."""
    v = [x for x in rec.versus if x.name != FIT_NAME]
    best = rec.best[0]
    ci = v[0].tpot_ci_us
    head = (f"llama.cpp's best here: {best.candidate} at {best.tpot_us / 1e3:.3f} ms/token"
            + ("" if ci is None else f" [{ci[0] / 1e3:.3f}, {ci[1] / 1e3:.3f}]")
            + " (its fastest decode, at the trace's context: the search behind the command "
              "above)")
    parts = [f"{x.name} {x.tpot_us / 1e3:.3f} ms (the cache faster in "
             f"{share_text(x.cache_faster)} % of draws)" if x.cache_faster is not None
             else f"{x.name} {x.tpot_us / 1e3:.3f} ms" for x in v[1:]]
    notes = cache_note_lines(rec, g) if g is not None else []
    return head + (
        "; against " + ", ".join(parts) if parts else "") + \
        f" · {rec.configurations} configurations searched" + "".join(
            "\n\n" + n[0].upper() + n[1:] + "." for n in notes)


def cache_size_figure(frame: pd.DataFrame, title: str = "") -> go.Figure:
    """TPOT against ``--moe-cache-mib`` per rule and CPU share; the placement alone dashed;
    sizes below the cliff (``below_cliff``: some cached layer cannot hit) crossed, and each
    rule's cliff (``frame.attrs["cliff_mib"]``, when given) a dotted vertical line."""
    fig = go.Figure()
    on = frame[frame["cache_mib"] > 0]
    for (rule, share), sub in on.groupby(["version", "cpu_share"], sort=True):
        sub = sub.sort_values("cache_mib")
        fig.add_trace(go.Scatter(
            x=sub["cache_mib"], y=sub["tpot_us"] / 1e3, mode="lines+markers",
            marker_symbol=["x" if b else "circle" for b in sub["below_cliff"]],
            name=f"{rule}" + (f", share {share:g}" if share else ""),
            customdata=sub[["slots", "hits", "uploads", "cpu_misses"]].to_numpy(),
            hovertemplate="%{x} MiB: %{y:.3f} ms/token<br>%{customdata[0]} slots; per token "
                          "%{customdata[1]:.1f} hits, %{customdata[2]:.1f} uploads, "
                          "%{customdata[3]:.1f} CPU misses<extra></extra>"))
    off = frame[frame["cache_mib"] == 0]
    if len(off):
        fig.add_hline(y=float(off["tpot_us"].iloc[0]) / 1e3, line_dash="dash",
                      annotation_text="no cache", annotation_position="top left")
    for rule, mib in frame.attrs.get("cliff_mib", {}).items():
        if mib:
            fig.add_vline(x=mib, line_dash="dot", annotation_text=f"{rule} can hit from {mib} MiB",
                          annotation_position="top right" if rule == "lru" else "bottom right")
    fig.update_layout(title=title, xaxis_title="--moe-cache-mib", yaxis_title="TPOT (ms/token)",
                      legend_title="eviction, CPU share", height=420)
    return fig
