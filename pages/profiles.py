"""Profiles: atomic-operator costs against the roofline estimate, cost-selected schedule costs
(h x c), a measured profile's schedules against the composition of their isolated ops, shared
cost against context; a second profile side by side."""
import numpy as np
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import figures_inputs, inputs, results, session
from cope_core.errors import CopeInputError
from cope_core.estimate.contention import contention, prefetch_hiding
from cope_core.estimate.costs import hrm_spec
from cope_core.platforms import GPUS

ds = session.page("Profiles")
c1, c2 = st.columns(2)
with c1:
    op = session.op_widget(ds.profile)

options = ["none"] + [f"analytic:{gpu}" for gpu in sorted(GPUS)] + ["upload"]
compare = session.bound("compare", c2.selectbox, default="none", valid=lambda v: v in options,
                        label="Compare with", options=options,
                        format_func=lambda v: {"none": "no second profile",
                                               "upload": "an uploaded profile"}.get(v)
                        or f"ANALYTIC what-if: {v.split(':')[-1]} for this model")
profiles = [("current", ds.profile)]
if compare.startswith("analytic:"):
    profiles.append((compare, results.analytic_what_if(ds.profile.model.to_dict(),
                                                       compare.split(":")[1])))
elif compare == "upload":
    f = st.file_uploader("Second profile (cope.profile/2 or /1)", type=["parquet"],
                         key="_up_second", max_upload_size=session.MAX_UPLOAD_MB)
    if f is not None:
        try:
            profiles.append((f"upload {f.name}", session.read_upload(f.name, f.getvalue(),
                                                                     "profile")[0]))
        except CopeInputError as exc:
            st.error(str(exc))

# every profile's costs first: the charts side by side share one scale
shown = []
for label, prof in profiles:
    with session.user_errors():
        threads, share = op if (op in prof.operating_points()) else prof.choose()
        opp = prof.resolve(threads, share)
    spec, _ = hrm_spec(prof)     # a malformed spec only leaves the roofline out
    shown.append((label, prof, threads, share, opp, spec,
                  inputs.atomic_frame(opp, prof.model, spec), inputs.schedule_grid(opp)))
y_max = 1.05 * max(float(np.nanmax(f[["profile_us", "roofline_us"]].to_numpy()))
                   for *_, f, _ in shown)
z_max = max(float(np.nanmax(grid)) for *_, grid in shown)
cols = st.columns(len(profiles))
for col, (label, prof, threads, share, opp, spec, frame, grid) in zip(cols, shown):
    with col:
        st.markdown(f"**{label}: {dsm.profile_label(prof)}**")
        st.caption(f"{prof.model.name} · {threads} CPU threads · GPU share {share:g}%"
                   + ("" if spec else " · no platform spec: roofline not drawn"))
        st.plotly_chart(figures_inputs.atomic_figure(
            frame, title="Atomic operators against the roofline",
            y_max=y_max if len(shown) > 1 else None), key=f"atomic_{label}")
        st.dataframe(inputs.single_ops_frame(opp), hide_index=True)
        st.plotly_chart(figures_inputs.schedule_heatmap(
            grid, inputs.chosen_split(opp), z_max=z_max if len(shown) > 1 else None,
            title="cost_selected schedule (µs); ★ = split COPE picks"), key=f"sched_{label}")
        if prof.analytic:
            st.caption("Analytic: its schedules are composed from its operators by construction, "
                       "so there is no contention to show.")
        else:
            st.plotly_chart(figures_inputs.contention_figure(
                contention(prof, threads, share),
                title="Schedules against their isolated operators (as cope contention)"),
                key=f"contention_{label}")
            st.dataframe(prefetch_hiding(prof, threads, share), hide_index=True, column_config={
                "beside_layer_us": st.column_config.NumberColumn(
                    "a prefetch beside a resident layer, µs", format="%.0f"),
                "beside_cpu_us": st.column_config.NumberColumn(
                    "beside every routed expert on the CPU, µs", format="%.0f"),
                "isolated_us": st.column_config.NumberColumn("the copy alone, µs", format="%.0f"),
                "hidden_pct": st.column_config.NumberColumn("hidden, %", format="%.1f")})
            st.caption("Composed: what the atomic simulation charges (isolated operators, the "
                       "maximum where the execution overlaps them). Above 0: contention the "
                       "composition misses; below: overlap it does not see. Colour: beyond the "
                       "interquartile ranges or not. The table: what one prefetch adds beside a "
                       "resident layer (COPE's price at a staging execution) and beside every "
                       "routed expert on the CPU (its price for parallel at no hits) against "
                       "the copy timed alone (atomic's).")
st.plotly_chart(figures_inputs.shared_figure(
    {label: inputs.shared_frame(p.resolve(*(op if op in p.operating_points() else p.choose())))
     for label, p in profiles}, title="Shared per-token cost against context"),
    key="shared_chart")
