"""The Streamlit explorer's logic, kept out of the pages so it can be tested without a browser.

Pure modules (no Streamlit import): :mod:`.settings` (URL codecs), :mod:`.dataset` (shipped
examples, provenance labels), :mod:`.whatif` (VRAM budgets, sweeps, break-even budgets),
:mod:`.timeline` (execution strategies drawn from atomic costs), :mod:`.inputs` (trace and
profile views, predicted-vs-measured pairs), :mod:`.figures` and :mod:`.figures_inputs`
(plotly figures as functions of frames), :mod:`.compare_view` (the Compare page's platforms and
table). Only :mod:`.session` (cached loaders, uploads, URL-bound widgets), :mod:`.results`
(predictions cached split at the replay, :mod:`cope_core.export` policies and
:mod:`cope_core.trace.stats` statistics) and :mod:`.apptest` (Streamlit's ``AppTest`` told that
the app navigates) import Streamlit.
"""
