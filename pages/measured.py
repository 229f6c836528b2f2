"""Predicted vs measured: each estimator's predictions against measured TPOT, the accuracy
metrics and a per-prompt drill-down."""
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import figures_inputs, inputs, results, session

ds = session.page("Predicted vs measured", before=lambda: session.upload_slot(
    "measurements", "Measurements (cope.measurements/1)",
    help="written by `cope measure`; replaces the example's measurements"))
if ds.measurements is None:
    st.info("No measurements loaded. Upload a `cope.measurements/1` file above (made by "
            "`cope measure` on the target) for the same model as the trace; predictions are "
            "then made at every measured K and operating point and compared, per estimator.")
    st.stop()
if ds.measurement_problem:
    st.error(ds.measurement_problem)
    st.stop()
session.require_predictable(ds)
st.caption(f"{dsm.measurements_label(ds.measurements)} · {len(ds.measurements.table)} rows · "
           f"{dsm.file_names(ds.measurements.notes)}")

with session.user_errors():
    evals = results.evaluation(ds)
pairs = {est: ev.pairs for est, ev in evals.items()}
st.plotly_chart(figures_inputs.pvm_scatter(pairs, title=f"Predicted vs measured TPOT · "
                                                        f"{dsm.provenance(ds)}"),
                key="pvm_chart")
st.dataframe(inputs.noise_table(evals), hide_index=True,
             column_config={"MAPE %": st.column_config.NumberColumn(format="%.2f"),
                            "regret % mean": st.column_config.NumberColumn(format="%.2f"),
                            "regret % max": st.column_config.NumberColumn(format="%.2f"),
                            "Spearman ρ": st.column_config.NumberColumn(format="%.3f"),
                            "interval coverage": st.column_config.NumberColumn(format="%.2f")})
st.caption("As `cope evaluate`: regret is how much slower the predicted winner measured than "
           "the measured winner, per cell (K, operating point); top-1 in noise counts cells whose "
           "predicted winner measured within noise of the fastest (paired bootstrap), strict "
           "top-1 those where it is the measured winner; per prompt: MAPE over (prompt, "
           "candidate), Spearman ρ of the candidate order, top-1 and top-3 per prompt; interval "
           "coverage: measured TPOT inside the predicted 95 % interval.")

st.subheader("Per cell")
st.dataframe(inputs.cell_table(evals), hide_index=True)
st.caption("Measured winner with its 95 % interval (bootstrap over prompts and trials) and the "
           "candidates tied with it; per estimator its pick: = the measured winner, ~ within "
           "the noise, otherwise its regret.")

st.subheader("One prompt")
prompts = sorted(int(p) for p in next(iter(pairs.values()))["prompt"].unique())
prompt = session.bound("prompt", st.selectbox, default=prompts[0],
                       valid=lambda v: v in prompts, coerce=int, label="Prompt", options=prompts)
drill = inputs.prompt_drilldown(pairs, prompt)
st.plotly_chart(figures_inputs.drilldown_figure(drill, title=f"Prompt {prompt}"),
                key="drill_chart")
st.dataframe(drill, hide_index=True)
