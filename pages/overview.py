"""Overview: the answer first — the predicted winner at the example's budget, how sure it is,
the runner-up and the layer-partition baseline, TPOT against the budget — then the data, the
model and the platform."""
import pandas as pd
import streamlit as st

from cope_core.app import (
    cards_view,
    figures,
    policies,
    results,
    session,
    whatif,
    your_machine,
)
from cope_core.app import dataset as dsm
from cope_core.app.settings import op_label
from cope_core.matrix import CANDIDATE_IDS, LAYER_PARTITION


def _uploads() -> None:
    with st.expander("Upload your own files (Parquet: cope.trace/1, cope.profile/2, "
                     "cope.measurements/1)", expanded=False):
        c1, c2 = st.columns(2)
        with c1:
            session.upload_slot("trace", "Routing trace", help="evaluated trace (cope.trace/1)")
            session.upload_slot("profile", "Profile", help="operator and schedule costs "
                                                           "(cope.profile/2 or /1)")
        with c2:
            session.upload_slot("calibration", "Calibration trace",
                                help="sets the popularity fill (cope.trace/1)")
            session.upload_slot("measurements", "Measurements",
                                help="measured TPOT per candidate (cope.measurements/1)")
        session.upload_slot("model", "Model file: a GGUF (its first megabytes are enough) or a "
                                     "config.json", help="prices the trace's routing as this "
                                                         "model, e.g. the quantised file you run; "
                                                         "an analytic profile is re-priced for it")
        if st.button("Use the example's files again"):
            session.forget_uploads()
            st.rerun()


ds = session.page("COPE Explorer",
                  "Which Mixture-of-Experts offloading policy is fastest on this model and "
                  "machine? COPE replays a routing trace against a profile of operator and "
                  "schedule costs and predicts the time per output token (TPOT) of every policy "
                  "in the Policy Matrix.", before=_uploads)
g = ds.trace.model
st.subheader(f"Model: {g.name}")
session.require_predictable(ds)
gib = session.current_vram(ds)
k = whatif.k_for_budget(g, gib)
op = session.current_op(ds.profile)
est = session.current_estimator(ds.profile)
with session.user_errors():     # the chart below shows every K: the budget's is its row
    view = results.sweep_view(ds, op, est, CANDIDATE_IDS)
df = results.sweep_at(view, k)
w = whatif.winner_of(df)
lp = df[df["candidate"] == LAYER_PARTITION].iloc[0]

c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
c1.metric("Predicted winner", w.named, help=w.sentence())
c2.metric("TPOT", f"{w.tpot_us / 1e3:.3f} ms",
          help="95 % interval with the model's measured error "
               + (w.interval_text() + " ms" if w.tpot_lo_us else "n/a"))
c3.metric("Win probability",
          "—" if w.win_probability is None else f"{100 * w.win_probability:.0f} %",
          help="share of the draws (prompts and the profile's spread) in which it is fastest")
margin = "—" if w.margin_pct is None else (
    "tie" if w.margin_pct == 0 else f"+{w.margin_pct:.1f} %")
c4.metric("Runner-up", margin, help=f"runner-up: {w.runner_up}")
# the units in the labels: a value of a few characters is never cut off in a narrow column
c5, c6, c7, _ = st.columns([3, 2, 2, 2])
c5.metric("Speed (tokens/s)", f"{whatif.tokens_per_s(w.tpot_us):.1f}",
          help="decode tokens per second of the winner: 1000 / TPOT in ms")
req = your_machine.request()
first = None
if req is not None and est == "cope" and ds.profile.analytic:
    with session.user_errors():
        answer = policies.policy_for(ds, gib, op, "best", your_machine.llamacpp_build(),
                                     req, your_machine.host_ram()).llamacpp_answer
        first = None if answer is None else answer.recommended.request
for col, (label, value, why) in zip((c6, c7), whatif.request_metrics(
        first, req, est, whatif.unpriced_of(ds.trace.model, ds.profile.platform))):
    col.metric(label, value, help=why)
cards_view.show(ds.key, g, your_machine.choice(), your_machine.llamacpp_build(),
                float(ds.trace.context.mean()))
# icon="": none. Without it Streamlit looks for a leading emoji in any non-ASCII text and loads
# its emoji table for that (about 0.3 s of a server's first page)
(st.success if w.sure else st.warning)(w.sentence() + ".", icon="")
slower = (lp.tpot_us / w.tpot_us - 1) * 100
st.markdown(f"For scale: the layer-partition baseline (whole MoE layers on CPU or GPU, as "
            f"llama.cpp's `--n-cpu-moe`) takes **{lp.tpot_us / 1e3:.3f} ms/token** "
            f"({whatif.tokens_per_s(lp.tpot_us):.1f} tokens/s)"
            + ("" if w.candidate == LAYER_PARTITION else f", {slower:.1f} % slower") + ".")
st.caption(f"{session.vram_caption(g, gib, k)} · {op_label(*op)} · estimator {est} · "
           f"{dsm.provenance(ds)}. Change these on the Landscape page.")

st.plotly_chart(figures.best_vs_budget(view.frame, g, current_gib=gib,
                                       title="Best TPOT and the layer-partition baseline "
                                             "against the VRAM budget"),
                key="overview_budget_chart")

with st.expander(f"Model: {g.name} — geometry"):
    st.dataframe(pd.DataFrame(dsm.geometry_rows(ds.trace)), hide_index=True)
with st.expander(f"Platform: {dsm.profile_label(ds.profile)}"):
    plat = {k: v for k, v in (ds.profile.platform or {}).items() if k != "spec"}
    st.dataframe(pd.DataFrame({"key": list(plat), "value": [dsm.file_names(str(v))
                                                          for v in plat.values()]}),
                 hide_index=True)
    ops = pd.DataFrame(ds.profile.operating_points(), columns=["cpu_threads", "gpu_share"])
    st.markdown(f"**Operating points in the profile:** {len(ops)}")
    st.dataframe(ops, hide_index=True)
with st.expander("Data: trace, calibration, measurements"):
    st.markdown(f"**Trace:** {dsm.trace_label(ds.trace)} — {ds.trace.n_prompts} prompts, "
                f"{ds.trace.n_tokens} decode tokens"
                + (", with next-layer predictions" if ds.trace.has_predictions else "")
                + (f". {dsm.file_names(ds.trace.description)}" if ds.trace.description else ""))
    cal = ds.calibration
    st.markdown("**Calibration:** " + (f"{dsm.trace_label(cal)}, {cal.n_tokens} tokens"
                                       if cal is not None else
                                       "none — the fill comes from the evaluated trace "
                                       "(optimistic)"))
    st.markdown("**Measurements:** " + (dsm.measurements_label(ds.measurements) + f", "
                                        f"{len(ds.measurements.table)} rows"
                                        if ds.measurements is not None else "none loaded"))
