"""Landscape: what-if VRAM budgets. TPOT of every candidate at the chosen budget, and TPOT
against the budget across every K with the winner's regions and break-even budgets."""
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import figures, llamacpp_view, results, session, whatif, your_machine
from cope_core.llamacpp import CACHE_LABEL
from cope_core.matrix import EXECUTIONS, RESIDENCIES

ds = session.page("Landscape: what-if VRAM budgets", predictable=True)
g = ds.trace.model

gib, k, op, est = session.settings_row(ds, [3, 2, 2])
res_ids = [r.value for r in RESIDENCIES]
exe_ids = [e.value for e in EXECUTIONS]
c4, c5, c6 = st.columns([3, 3, 1])
with c4:
    res = session.bound("res", st.multiselect, default=res_ids,
                        valid=lambda v: isinstance(v, list) and set(v) <= set(res_ids),
                        label="Residencies", options=res_ids)
with c5:
    exe = session.bound("exe", st.multiselect, default=exe_ids,
                        valid=lambda v: isinstance(v, list) and set(v) <= set(exe_ids),
                        label="Executions", options=exe_ids)
with c6:
    lp = session.bound("lp", st.checkbox, default=True, valid=lambda v: isinstance(v, bool),
                       label="layer partition")
cands = whatif.candidate_ids(res, exe, lp)
if not cands:
    st.info("No candidate selected: choose at least one residency and execution, or the "
            "layer-partition baseline.")
    st.stop()

# every figure is drawn once per (dataset, settings) for every session: `key` is what it shows;
# the budget's K is read from the sweep, which the page shows anyway (one price for every K)
key = (ds.key, op, est, tuple(cands))
with session.user_errors():
    view = results.sweep_view(ds, op, est, cands)
df = results.sweep_at(view, k)
w = whatif.winner_of(df)
(st.success if w.sure else st.warning)(f"At {gib:g} GiB (K = {k}): {w.sentence()}.")
title = f"TPOT per candidate at K = {k} · {est} · {dsm.provenance(ds)}"
st.plotly_chart(results.figure("bars", key + (k, title),
                               lambda: figures.tpot_bars(df, title=title)), key="bars_chart")

st.subheader("Against the VRAM budget")
c7, _ = st.columns([3, 4])
with c7:
    measure = session.bound("yaxis", st.radio, default="tpot",
                            valid=lambda v: v in ("tpot", "request"), label="y axis",
                            options=["tpot", "request"], horizontal=True,
                            format_func=lambda v: {"tpot": "TPOT (ms per token)",
                                                   "request": "request time (s)"}[v],
                            help="Request time: the sidebar's prompt and answer, the time to the "
                                 "first token (the prompt as llama.cpp runs it with the layer "
                                 "partition of K's bytes, the default -ub) plus the answer at "
                                 "each candidate's TPOT.")
req = your_machine.request()
ttft = None if measure != "request" or req is None else results.ttft_curve(
    ds, req, op[0], your_machine.llamacpp_build())
if measure == "request" and ttft is None:
    st.caption("Request time needs a prompt (the sidebar's is 0) and a machine's peaks: a "
               "measured profile holds decode costs only. Choose your machine in the sidebar "
               "to price one. TPOT is shown.")
title = f"Every K = 0 … {g.n_experts} · {est} · {dsm.provenance(ds)}"
if ttft is not None and req is not None:
    title += f" · {req.describe()}"
shown = None if ttft is None or req is None else (ttft, req.gen_tokens)
drawn = key + (title, None if shown is None else (req, your_machine.llamacpp_build()))
base = results.figure("budget", drawn, lambda: figures.budget_spec(
    view.frame, g, view.regions, title=title, uncertain=view.unsure, request=shown))
st.plotly_chart(figures.mark_budget(base, gib, k), key="sweep_chart")
if view.unsure:
    st.caption("Unsure budgets (red strip): " + "; ".join(
        f"K = {a}" + ("" if a == b else f" … {b}") + f" ({lo:.2f}-{hi:.2f} GiB)"
        for lo, hi, a, b in view.unsure) + " — there the winner is fastest in fewer than "
        f"{100 * whatif.SURE:.0f} % of the draws; the band is the winner's 95 % interval.")
st.markdown("**Break-even budgets**")
for sentence in whatif.break_even_sentences(view.regions):
    st.markdown(f"- {sentence}")
st.dataframe(whatif.break_even_budgets(view.regions), hide_index=True)

st.subheader(f"{CACHE_LABEL}: TPOT against the cache size")


@session.fragment("landscape: cache sweep")
def cache_sweep(gib: float, op: tuple[int, float], est: str) -> None:
    """The cache-size sweep: its toggle and host-layer count rerun only this part."""
    on = session.bound("cachesweep", st.toggle, default=False,
                       valid=lambda v: isinstance(v, bool),
                       label="Sweep --moe-cache-mib (about a second per budget)")
    if not on:
        st.caption("llama.cpp's own GPU cache of host experts at 12 sizes up to the largest "
                   "the budget holds beside the chosen host layers, under both eviction rules "
                   "and every CPU share its tuner tries.")
        return
    if est != "cope":
        st.caption("Priced by COPE's schedule rows: choose the cope estimator.")
        return
    c7, _ = st.columns([2, 5])
    with c7:
        n_cpu = session.bound("ncmoe", st.number_input, default=g.n_layers,
                              valid=lambda v: isinstance(v, int) and 0 < v <= g.n_layers,
                              coerce=int, label="MoE layers on the host (--n-cpu-moe less the "
                              "dense blocks)", min_value=1, max_value=g.n_layers, step=1)
    with session.user_errors():
        sizes = results.cache_sizes(ds, gib, op, n_cpu)
    st.plotly_chart(llamacpp_view.cache_size_figure(
        sizes, title=f"--n-cpu-moe {g.dense_layers + n_cpu} at {gib:g} GiB · "
                     f"{dsm.provenance(ds)}"), key="cache_size_chart")


cache_sweep(gib, op, est)
