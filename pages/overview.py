"""Overview: the data in use, the model, the platform and the current winner at a glance."""
import pandas as pd
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import results, session, whatif
from cope_core.app.settings import op_label
from cope_core.matrix import CANDIDATE_IDS

st.title("COPE Explorer")
st.write("Which Mixture-of-Experts offloading policy is fastest on this model and machine? "
         "COPE replays a routing trace against a profile of operator and schedule costs and "
         "predicts the time per output token (TPOT) of every policy in the Policy Matrix.")

with st.expander("Upload your own files (Parquet: cope.trace/1, cope.profile/1, "
                 "cope.measurements/1)", expanded=False):
    c1, c2 = st.columns(2)
    with c1:
        session.upload_slot("trace", "Routing trace", help="evaluated trace (cope.trace/1)")
        session.upload_slot("profile", "Profile", help="operator and schedule costs "
                                                       "(cope.profile/1)")
    with c2:
        session.upload_slot("calibration", "Calibration trace",
                            help="sets the popularity fill (cope.trace/1)")
        session.upload_slot("measurements", "Measurements",
                            help="measured TPOT per candidate (cope.measurements/1)")
    if st.button("Use the example's files again"):
        session.forget_uploads()
        st.rerun()

with session.user_errors():
    ds = session.dataset()
session.banner(ds)
g = ds.trace.model

left, right = st.columns(2)
with left:
    st.subheader(f"Model: {g.name}")
    st.dataframe(pd.DataFrame(dsm.geometry_rows(ds.trace)), hide_index=True, height=300)
    st.markdown(f"**Trace:** {dsm.trace_label(ds.trace)} — {ds.trace.n_prompts} prompts, "
                f"{ds.trace.n_tokens} decode tokens"
                + (", with next-layer predictions" if ds.trace.has_predictions else "")
                + (f". {ds.trace.description}" if ds.trace.description else ""))
    cal = ds.calibration
    st.markdown("**Calibration:** " + (f"{dsm.trace_label(cal)}, {cal.n_tokens} tokens"
                                       if cal is not None else
                                       "none — the fill comes from the evaluated trace "
                                       "(optimistic)"))
    st.markdown("**Measurements:** " + (dsm.measurements_label(ds.measurements) + f", "
                                        f"{len(ds.measurements.table)} rows"
                                        if ds.measurements is not None else "none loaded"))
with right:
    st.subheader("Platform")
    st.markdown(f"**{dsm.profile_label(ds.profile)}**")
    plat = {k: v for k, v in (ds.profile.platform or {}).items() if k != "spec"}
    st.dataframe(pd.DataFrame({"key": list(plat), "value": [str(v) for v in plat.values()]}),
                 hide_index=True)
    ops = pd.DataFrame(ds.profile.operating_points(), columns=["cpu_threads", "gpu_share"])
    st.markdown(f"**Operating points in the profile:** {len(ops)}")
    st.dataframe(ops, hide_index=True)

st.subheader("At a glance")
session.require_predictable(ds)
gib = session.current_vram(ds)
k = whatif.k_for_budget(g, gib)
op = session.current_op(ds.profile)
est = session.current_estimator(ds.profile)
with session.user_errors():
    df = results.predict_at(ds, k, op, est, CANDIDATE_IDS)
w = whatif.winner_of(df)
c1, c2, c3 = st.columns(3)
c1.metric("Predicted winner", w.candidate, help=w.sentence())
c2.metric("TPOT", f"{w.tpot_us / 1e3:.3f} ms")
margin = "—" if w.margin_pct is None else (
    "tie" if w.margin_pct == 0 else f"{w.margin_pct:.1f}%")
c3.metric("Margin over runner-up", margin, help=f"runner-up: {w.runner_up}")
st.markdown(w.sentence() + ".")
st.caption(f"{session.vram_caption(g, gib, k)} · {op_label(*op)} · estimator {est} · "
           f"{dsm.provenance(ds)}. Change these on the Landscape page.")
