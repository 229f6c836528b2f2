"""Predicted vs measured: each estimator's predictions against measured TPOT, the accuracy
metrics, how far the measurements can be trusted, a per-prompt drill-down and, when a
``cope verify`` record is loaded, the race that checked the pick."""
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import figures_inputs, inputs, results, session, verify_view
from cope_core.estimate.quality import check_lines

ds = session.page("Predicted vs measured", before=lambda: session.upload_slot(
    "measurements", "Measurements (cope.measurements/1)",
    help="written by `cope measure`; replaces the example's measurements"))
if ds.measurements is None:
    st.info("No measurements loaded. Upload a `cope.measurements/1` file above (made by "
            "`cope measure` on the target) for the same model as the trace; predictions are "
            "then made at every measured K and operating point and compared, per estimator.")
    measured = session.examples_with_measurements()
    if measured:
        st.write("These shipped examples have measurements:")
        for name in measured:
            if st.button(f"Switch to {name}", key=f"switch_{name}"):
                session.switch_example(name)
                st.rerun()
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

summary, *flags = check_lines(results.measurement_quality(ds))
st.caption(summary[0].upper() + summary[1:])
for line in flags:
    st.warning(line.strip())

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

st.subheader("Verified on this machine")
session.verify_upload()
record, origin = session.verify_record(ds)
if record is None:
    st.caption("No `cope verify` record loaded. `cope verify` predicts, then measures only the "
               "contenders — the predicted winner and every candidate that could still win — in "
               "rounds of paired trials, dropping each one a paired test puts behind the leader; "
               "`-o FILE` writes the record this section shows.")
else:
    st.caption(f"{origin} · {record.model.name} · {record.platform.get('accelerator', '?')} "
               f"accelerator · {record.created}")
    st.write(verify_view.verify_summary(record))
    st.dataframe(verify_view.verify_table(record), hide_index=True,
                 column_config={"verified TPOT ms": st.column_config.NumberColumn(
                     format="%.3f")})
    labels = [f"K={c.K}, {c.cpu_threads} threads" for c in record.cells]
    pick = session.bound("verify_cell", st.selectbox, default=labels[0],
                         valid=lambda v: v in labels, label="Race of the cell", options=labels)
    cell = record.cells[labels.index(pick)]
    st.plotly_chart(verify_view.race_figure(cell, title=f"The race at {pick}: "
                                                        f"{cell.stop} after {cell.rounds} rounds"),
                    key="race_chart")
