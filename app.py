"""COPE Explorer: which MoE offloading policy is fastest on this model and machine?

Run with ``streamlit run app.py`` (or ``cope app``). Pages live in ``pages/`` and are thin;
their logic is in ``cope_core.app``. ``st.navigation`` below decides which pages exist.
"""
import streamlit as st

from cope_core.app import rerun_log, results, session

st.set_page_config(page_title="COPE Explorer", page_icon=":material/explore:", layout="wide")
PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/home:", default=True),
    st.Page("pages/matrix.py", title="Policy Matrix", icon=":material/grid_view:",
            url_path="matrix"),
    st.Page("pages/landscape.py", title="Landscape", icon=":material/show_chart:",
            url_path="landscape"),
    st.Page("pages/measured.py", title="Predicted vs measured", icon=":material/target:",
            url_path="measured"),
    st.Page("pages/traces.py", title="Traces", icon=":material/route:", url_path="traces"),
    st.Page("pages/profiles.py", title="Profiles", icon=":material/timer:",
            url_path="profiles"),
    st.Page("pages/compare.py", title="Compare platforms", icon=":material/compare_arrows:",
            url_path="compare"),
    st.Page("pages/export.py", title="Export", icon=":material/download:", url_path="export"),
]
with rerun_log.measured("app") as run:      # what this run costs the server (benchmarks)
    results.reset_run_state()
    session.settings()          # the first run of a session reads the settings from the URL
    page = st.navigation(PAGES)
    run["page"] = page.title
    session.sidebar()
    session.sync_url()
    page.run()
