"""Traces: whether a hot set exists, routing popularity (layer x expert), token-to-token reuse,
hit rate against K per residency, and the next-layer predictor's recall; all statistics are
those of cope_core.trace.stats."""
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import figures_inputs, inputs, results, session, whatif
from cope_core.matrix import CANDIDATE_IDS
from cope_core.trace import stats as trace_stats

ds = session.page("Traces")
choices = ["evaluated trace"] + (["calibration trace"] if ds.calibration is not None else [])
c1, c2 = st.columns(2)
with c1:
    which = st.radio("Trace", choices, horizontal=True, key="trace_choice")
with c2:
    sort = session.bound("sort", st.toggle, default=False, valid=lambda v: isinstance(v, bool),
                         label="Sort experts by popularity within each layer")
tr = ds.calibration if which == "calibration trace" else ds.trace
st.markdown(f"**{dsm.trace_label(tr)}** · {tr.n_prompts} prompts · {tr.n_tokens} tokens · "
            f"{tr.model.n_layers} MoE layers · top-{tr.model.top_k} of {tr.model.n_experts}")

st.subheader("Is there a hot set?")
cal = ds.calibration if which == "evaluated trace" else None
hs = trace_stats.hot_set(tr, cal)
(st.success if hs.kind == "pays" else st.warning)(hs.verdict)
st.dataframe(inputs.hot_set_frame(hs), hide_index=True)

share = inputs.popularity_share(tr, sort=sort)
skew = trace_stats.skew(tr)
st.plotly_chart(figures_inputs.popularity_heatmap(share, sort, title=(
    f"Routing popularity · {dsm.trace_label(tr)} · the top 10% of experts take "
    f"{skew.mean() * 100:.1f}% of routing on average")), key="popularity_chart")

reuse = trace_stats.reuse(tr)
st.plotly_chart(figures_inputs.reuse_figure(reuse, title="Token-to-token reuse per layer"),
                key="reuse_chart")

st.subheader("Hit rate against K")
if ds.problems:
    st.info("Hit rates need predictions: " + " ".join(ds.problems))
else:
    op = session.current_op(ds.profile)
    est = session.current_estimator(ds.profile)
    with session.user_errors():
        sw = results.sweep(ds, op, est, CANDIDATE_IDS)
    rates = whatif.hit_rates(sw)
    st.plotly_chart(figures_inputs.hit_rate_figure(rates, title=(
        "Hit rate of the evaluated trace per residency (fill from "
        + ("the calibration trace)" if ds.calibration is not None else "the trace itself)"))),
        key="hitrate_chart")

st.subheader("Next-layer predictor")
if not ds.trace.has_predictions:
    st.info("The evaluated trace has no next-layer predictions (its `predicted` column is "
            "empty), so mutable residencies never prefetch.")
else:
    st.markdown(f"Predictor: `{ds.trace.predictor}`")
    with session.user_errors():
        stats = results.trace_statistics(ds)
    frame = inputs.recall_frame(stats)
    st.plotly_chart(figures_inputs.recall_figure(frame, title=(
        f"Top-{ds.trace.model.top_k} recall of layer l+1's experts, predicted at layer l")),
        key="recall_chart")
    st.dataframe(frame.drop(columns="layer").mean().rename("mean recall").to_frame().T,
                 hide_index=True)
