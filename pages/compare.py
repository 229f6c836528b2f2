"""Compare platforms: what would another GPU buy me? The same trace on 2-4 platforms — the spec
table, a custom spec, this dataset's profile — best TPOT against the budget and the winners."""
import streamlit as st

from cope_core.app import compare_view, figures, results, session, whatif
from cope_core.app import dataset as dsm
from cope_core.app.settings import op_label

ds = session.page("Compare platforms",
                  "What would another GPU buy me? The same trace predicted on each platform: "
                  "analytic ones are built from the spec table (or your numbers) for the trace's "
                  "model and marked ANALYTIC; a measured profile is used as it is. Each platform "
                  "is capped at its own VRAM.", predictable=True)
g = ds.trace.model

gib, k, op, est = session.settings_row(ds, [3, 2, 2])
opts = compare_view.options(ds.profile)
names = session.bound(
    "plat", st.multiselect, default=compare_view.default_choice(ds.profile),
    valid=lambda v: isinstance(v, list) and set(v) <= set(opts),
    label="Platforms (2-4)", options=opts, max_selections=compare_view.MAX_PLATFORMS,
    format_func=lambda v: compare_view.label(v, ds.profile))
custom = compare_view.CUSTOM_DEFAULT
if compare_view.CUSTOM in names:
    with st.expander("Custom platform", expanded=True):
        custom = session.bound_numbers("custom", compare_view.CUSTOM_FIELDS,
                                       default=compare_view.CUSTOM_DEFAULT,
                                       helps=compare_view.CUSTOM_HELP,
                                       min_value=compare_view.CUSTOM_MIN)
if len(names) < 2:
    st.info("Choose at least two platforms to compare.")
    st.stop()

with session.user_errors():
    cmp = results.comparison(ds, names, custom, gib, op, est)
first = cmp.at_budget.iloc[0]
best = cmp.at_budget.sort_values("tpot_us").iloc[0]
st.success(f"At {gib:g} GiB, {best.platform} is fastest: {best.winner} at "
           f"{whatif.speed(best.tpot_us)}, {best.speedup:.2f}x {first.platform}.")
st.plotly_chart(figures.compare_figure(cmp.sweep, current_gib=gib,
                                       title=f"Best TPOT against the VRAM budget · {est} · "
                                             f"{dsm.trace_label(ds.trace)}"),
                key="compare_chart")
st.dataframe(compare_view.table(cmp), hide_index=True,
             column_config={"TPOT ms": st.column_config.NumberColumn(format="%.3f"),
                            "tokens/s": st.column_config.NumberColumn(format="%.1f"),
                            "win probability": st.column_config.NumberColumn(format="%.2f"),
                            "speed-up": st.column_config.NumberColumn(format="%.2fx"),
                            "layer partition ms": st.column_config.NumberColumn(format="%.3f")})
st.caption(f"{op_label(*op)} in every platform (the custom one too) · speed-up: "
           f"{first.platform}'s TPOT over each platform's · a platform with less VRAM than "
           "the budget is compared at all of its own. The same comparison without the app: "
           "`cope compare --trace T --calibration C "
           "--platform rtx4090 --platform rtx5090 --profile mine.parquet --vram-gib 16`.")
