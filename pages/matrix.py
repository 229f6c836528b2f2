"""Policy Matrix: the 3 x 4 grid plus layer partition, coloured by predicted TPOT; a cell opens
a timeline of its execution strategy for a chosen hit count."""
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import (
    figures,
    figures_timeline,
    llamacpp_view,
    policies,
    results,
    session,
    whatif,
    your_machine,
)
from cope_core.app.timeline import execution_timeline, layer_partition_timelines
from cope_core.export import lead_sentence
from cope_core.llamacpp import CACHE_LABEL, Verdict
from cope_core.matrix import CANDIDATE_IDS, EXECUTIONS, LAYER_PARTITION, get_candidate, matrix_table

ds = session.page("Policy Matrix", predictable=True)
table = matrix_table()

gib, k, op, est = session.settings_row(ds, [2, 2, 2])

with session.user_errors():     # the K's rows of the sweep every page shares (and a restarted
    # server keeps on disk for a shipped example): the same numbers as pricing K alone
    df = results.sweep_at(results.sweep_view(ds, op, est, CANDIDATE_IDS), k)
lp = df[df["candidate"] == LAYER_PARTITION].iloc[0]
fig = figures.matrix_heatmap(df, table, title=f"Predicted TPOT at K = {k} · {est} · "
                                               f"{dsm.provenance(ds)}")
event = st.plotly_chart(fig, on_select="rerun", selection_mode="points", key="matrix_chart")
w = whatif.winner_of(df)
(st.success if w.sure else st.warning)(f"At {gib:g} GiB (K = {k}): {w.sentence()}.",
                                       icon="")   # no emoji search (pages/overview.py)
points = (event or {}).get("selection", {}).get("points", []) if event else []
clicked = next((p.get("customdata") for p in points if p.get("customdata") in CANDIDATE_IDS),
               None)
if clicked and st.session_state.get("_matrix_clicked") != clicked:
    st.session_state["_matrix_clicked"] = clicked
    session.rebind("cell", clicked)         # the cell chooser below follows the click

st.subheader(CACHE_LABEL)
if est != "cope":
    st.caption(f"The {CACHE_LABEL} rows are priced by COPE's schedule rows: choose the cope "
               "estimator.")
else:
    with session.user_errors():
        policy = policies.policy_for(ds, gib, op, "best", your_machine.llamacpp_build(),
                                     your_machine.request(), your_machine.host_ram())
    rec, answer = policy.llamacpp_cache, policy.llamacpp_answer
    if lead := lead_sentence(answer):      # the answer's verdict, as every surface says it
        assert answer is not None
        (st.success if answer.verdict is Verdict.FASTER else st.info)(lead, icon="")
    if answer is not None:
        st.code(answer.recommended.command(), language="bash", wrap_lines=True)
    st.markdown(llamacpp_view.verdict(rec, ds.trace.model))
    st.dataframe(llamacpp_view.best_table(rec, ds.trace.model, op[0]), hide_index=True)
    st.caption("llama.cpp's own GPU cache of host experts (b11480+), searched over every "
               "--n-cpu-moe that fits × the largest --moe-cache-mib the rest holds × both "
               "eviction rules × the CPU shares its tuner tries; the cache starts empty at "
               "server start and is kept across prompts (docs/design.md#llamacpp-moe-cache).")

base = table["baseline"]["description"]
st.markdown(f"**Baseline `layer_partition`** "
            f"({', '.join(get_candidate(LAYER_PARTITION).prior_systems)}): "
            f"{whatif.speed(lp.tpot_us)} (rank {int(lp['rank'])} of {len(df)}). "
            f"{base[:1].upper()}{base[1:]}.")
with st.expander("What the rows and columns mean; what is outside the matrix"):
    for r in table["residencies"]:
        st.markdown(f"- **{r['id']}** — {r['description']}")
    for e in table["executions"]:
        st.markdown(f"- **{e['id']}** — {e['description']}")
    st.markdown("Cells marked *new (COPE)* had no prior system; the cross-layer row was only "
                "classified, not instantiated, in the paper. **Out of scope** (not candidates):")
    for o in table["out_of_scope"]:
        st.markdown(f"- {o}")

st.subheader("Timeline of one layer")
top_k = ds.trace.model.top_k
t1, t2, t3 = st.columns(3)
with t1:
    cell = session.bound("cell", st.selectbox, default="fixed/ready_first",
                         valid=lambda v: v in CANDIDATE_IDS, label="Cell",
                         options=list(CANDIDATE_IDS))
with t2:
    hits = session.bound("hits", st.slider, default=top_k // 2,
                         valid=lambda v: isinstance(v, int) and 0 <= v <= top_k,
                         coerce=int, label="Hits h (resident experts among the top-k)",
                         min_value=0, max_value=top_k)
with t3:
    others = ["none"] + [e.value for e in EXECUTIONS]
    cmp = session.bound("cmp", st.selectbox, default="wait_then_gpu",
                        valid=lambda v: v in others, label="Compare with", options=others)
opp = ds.profile.resolve(*op)
cand = get_candidate(cell)
if cand.is_layer_partition:
    lines = list(layer_partition_timelines(opp))
else:
    lines = [execution_timeline(opp, cand.execution, hits)]
if cmp != "none" and (cand.is_layer_partition or cmp != cand.execution.value):
    lines.append(execution_timeline(opp, cmp, hits))
st.plotly_chart(figures_timeline.timeline_figure(lines, title=(
    f"h = {hits} hits, m = {top_k - hits} misses · atomic costs at {op[0]} threads · "
    f"{dsm.profile_label(ds.profile).split(' (')[0]}")), key="timeline_chart")
for tl in lines:
    st.markdown(f"- **{tl.name}**: composed from atomic costs {tl.total_us:.1f} µs "
                f"(c = {tl.cpu} on the CPU, u = {tl.staged} staged); profiled whole-layer "
                f"schedule {tl.measured_us:.1f} µs")
st.caption("Bars are placed as the atomic-op simulation composes them: overlapped operations "
           "start together, serial ones follow. The red dashed line is the profile's measured "
           "(or analytic) cost of the whole layer, which COPE uses.")
