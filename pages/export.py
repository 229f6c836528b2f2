"""Export: the chosen or best candidate as a cope.policy/1 JSON file and in the form each runtime
takes (one tab per record of `cope_core.export.EXPORT_FORMATS`), by the same functions as
`cope export`."""
import streamlit as st

from cope_core.app import dataset as dsm
from cope_core.app import export_view, policies, results, session, whatif, your_machine
from cope_core.errors import CopeInputError, UnsupportedByRuntime
from cope_core.export import EXPORT_FORMATS, render
from cope_core.matrix import CANDIDATE_IDS

ds = session.page("Export a policy", predictable=True)
c1, c2, c3, c4 = st.columns([3, 2, 2, 1])
with c1:
    gib, k = session.vram_widget(ds)
with c2:
    op = session.op_widget(ds.profile)
with c3:
    options = ["best"] + list(CANDIDATE_IDS)
    cand = session.bound("cand", st.selectbox, default="best", valid=lambda v: v in options,
                         label="Candidate", options=options,
                         format_func=lambda v: "best (COPE's predicted winner)" if v == "best"
                         else v)
with c4:
    strict = session.bound("strict", st.toggle, default=False,
                           valid=lambda v: isinstance(v, bool), label="Strict",
                           help="A runtime that cannot run exactly the chosen candidate is an "
                                "error instead of the nearest policy it can run (`cope export "
                                "--strict`).")
with session.user_errors():
    df = results.predict_at(ds, k, op, "cope", CANDIDATE_IDS)
    policy = policies.policy_for(ds, gib, op, cand, your_machine.llamacpp_build(),
                                     your_machine.request(), your_machine.host_ram())
chosen = policy.candidate
row = df[df["candidate"] == chosen].iloc[0]
st.markdown(f"**{chosen}** at K = {k} ({gib:g} GiB): predicted {whatif.speed(row.tpot_us)} "
            f"by COPE, rank {int(row['rank'])} of {len(df)} · {dsm.provenance(ds)}")

stem = f"{policy.model.name}-{chosen.replace('/', '-')}-K{policy.experts_per_layer}"
model_file = export_view.uploaded_model_file(ds.origin)
shown = export_view.tab_order(EXPORT_FORMATS)     # a runtime's command first, the JSON last
for spec, tab in zip(shown, st.tabs([f.label for f in shown])):
    fmt, label, suffix, language = spec.name, spec.label, spec.file_suffix, spec.language
    with tab:
        try:
            out = render(policy, fmt, strict=strict, **spec.side_options(stem))
        except UnsupportedByRuntime as exc:   # not this model, whatever the candidate
            st.info(exc.detail)
            continue
        except CopeInputError as exc:   # strict, and this runtime cannot run the candidate
            st.error(str(exc))
            continue
        text = export_view.with_model_file(out.text, model_file)
        command, others = export_view.lead_command(
            text, language, out.command and export_view.with_model_file(out.command, model_file))
        if spec.lead and (lead := spec.lead(policy)):
            st.markdown(lead)              # e.g. every llama.cpp answer leads with the default
        st.code(command, language=language, wrap_lines=True)    # the copy button is its own
        if spec.caption:                   # COPE's own record: no runtime to run it
            st.caption(spec.caption)
        elif out.exact:
            st.success(f"{label} runs exactly {chosen}.")
        else:
            st.warning(out.summary)
        st.download_button(f"Download {stem + suffix}", data=text, file_name=stem + suffix,
                           mime=spec.mime, key=f"download_{fmt}")
        for path, data in out.files:
            st.download_button(f"Download {path} (the file the flags name)", data=data,
                               file_name=path, mime="application/octet-stream",
                               key=f"download_{fmt}_file")
        if command != text.rstrip("\n"):       # the notes (and any other commands), folded
            with st.expander("The whole file: what COPE predicts, why, and "
                             + (f"{others} other command{'s' * (others > 1)}" if others
                                else "the notes")):
                st.code(text, language=language)
