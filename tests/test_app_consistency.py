"""One number per question across the explorer's pages (issue 38): at the same settings the
Overview, Policy Matrix, Landscape and Export show the same winner, TPOT, 95 % interval and win
share for the same cell — the library's prediction at that K alone (`cope predict`'s) — and the
Policy Matrix and Export show the same llama.cpp configuration.

Before, the Landscape read its K from a sweep priced with 200 draws per K and the other pages
priced the K alone with 1000, so the same cell had two intervals and two win shares."""
from __future__ import annotations

import base64
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cope_core import parquet_io, predict
from cope_core.app import whatif
from cope_core.app.apptest import open_app_test
from cope_core.export import EXPORT_FORMATS

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "data" / "examples"
GIB = 20.0
#: the same settings on every page: the example, a budget and an operating point that is not the
#: profile's default (a setting a page dropped would show another answer)
QUERY = {"example": "qwen3-30b-a3b", "vram": f"{GIB:g}", "op": "16@100"}


@pytest.fixture(scope="module")
def library():
    tr = parquet_io.read_trace(EX / "qwen3-30b-a3b-trace.parquet")
    cal = parquet_io.read_trace(EX / "qwen3-30b-a3b-calibration.parquet")
    prof = parquet_io.read_profile(EX / "qwen3-30b-a3b-rtx4090-analytic.parquet")
    assert (16, 100.0) in prof.operating_points()
    k = whatif.k_for_budget(tr.model, GIB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = predict(tr, prof, k, calibration=cal, cpu_threads=16, gpu_share=100.0)
    return k, df


@pytest.fixture(scope="module")
def pages():
    at = open_app_test(ROOT / "app.py", default_timeout=300)
    at.query_params.update(QUERY)
    out = {}
    for page in ("overview", "matrix", "landscape", "export"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception and not at.error, (page, [e.value for e in at.exception],
                                                   [e.value for e in at.error])
        out[page] = {"success": [e.value for e in list(at.success) + list(at.warning)],
                     "markdown": [m.value for m in at.markdown],
                     "metrics": {m.label: m.value for m in at.metric},
                     "charts": [json.loads(c.proto.spec) for c in at.get("plotly_chart")],
                     "frames": [d.value for d in at.dataframe],
                     "tabs": {t.label: [c.value for c in t.code] for t in at.tabs}}
    return out


def _arr(v) -> np.ndarray:
    """Plotly's JSON arrays: lists, or typed arrays ``{"dtype", "bdata"}``."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v)


def _cell_text(t: float, lo: float, hi: float, wins: str) -> str:
    return f"TPOT {t:.3f} ms, 95 % interval [{lo:.3f}, {hi:.3f}] ms<br>{wins}<br>"


def _wins(p: float, eq: object) -> str:
    return (f"the same policy here as {eq}" if isinstance(eq, str) else
            f"fastest in {100 * p:.0f} % of draws")


def test_every_page_names_the_same_winner_with_the_same_numbers(library, pages):
    k, df = library
    sentence = whatif.winner_of(df).sentence()
    assert sentence + "." in pages["overview"]["success"]
    for page in ("matrix", "landscape"):
        assert f"At {GIB:g} GiB (K = {k}): {sentence}." in pages[page]["success"], page
    w = whatif.winner_of(df)
    assert pages["overview"]["metrics"]["TPOT"] == f"{w.tpot_us / 1e3:.3f} ms"
    assert pages["overview"]["metrics"]["Win probability"] == f"{100 * w.win_probability:.0f} %"
    assert any(m.startswith(f"**{w.candidate}** at K = {k} ({GIB:g} GiB): predicted "
                            f"{whatif.speed(w.tpot_us)}") for m in pages["export"]["markdown"])


def test_every_cell_has_one_interval_and_win_share(library, pages):
    k, df = library
    want = {r.candidate: (r.tpot_us / 1e3, r.tpot_lo_us / 1e3, r.tpot_hi_us / 1e3,
                          _wins(r.win_probability, r.equivalent_to))
            for r in df.itertuples(index=False)}
    # Landscape: the bars' interval markers carry every candidate's numbers unrounded
    bars = next(c for c in pages["landscape"]["charts"]
                if c["layout"]["title"]["text"].startswith(f"TPOT per candidate at K = {k}"))
    iv = next(t for t in bars["data"] if t.get("name") == "95 % interval")
    shown = {cid: (float(x), float(lo), float(hi), wins)
             for x, (cid, lo, hi, wins) in zip(_arr(iv["x"]), iv["customdata"])}
    assert shown.keys() == want.keys()
    for cid, (t, lo, hi, wins) in want.items():
        assert shown[cid][:3] == pytest.approx((t, lo, hi), rel=1e-12), cid
        assert shown[cid][3] == wins, cid
    # Policy Matrix: each cell's hover text, made from the same frame
    heat = pages["matrix"]["charts"][0]
    cells = next(t for t in heat["data"] if t["type"] == "scatter")
    texts = dict(zip(cells["customdata"], cells["text"]))
    for cid, (t, lo, hi, wins) in want.items():
        if cid in texts:                       # the 12 matrix cells (layer partition is below)
            assert texts[cid] == _cell_text(t, lo, hi, wins), cid
    # Export: the policy record's interval and win share of every candidate
    json_label = next(f.label for f in EXPORT_FORMATS if f.name == "json")
    policy = json.loads(pages["export"]["tabs"][json_label][-1])
    conf = policy["confidence"]
    for r in df.itertuples(index=False):
        assert conf["tpot_ci_us"][r.candidate] == [r.tpot_lo_us, r.tpot_hi_us], r.candidate
        p = conf["win_probability"][r.candidate]
        assert (p is None and np.isnan(r.win_probability)) or p == r.win_probability
    assert conf["draws"] == df.attrs["uncertainty"]["draws"]


def test_matrix_and_export_show_one_llamacpp_configuration(pages):
    best = pages["matrix"]["frames"][0]
    assert isinstance(best, pd.DataFrame) and "llama-server flags" in best
    flags, ms = best["llama-server flags"].iloc[0], best["TPOT ms"].iloc[0]
    lead = next(m for m in pages["matrix"]["markdown"] if "llama.cpp's best here:" in m)
    assert f" at {ms:.3f} ms/token" in lead
    label = next(f.label for f in EXPORT_FORMATS if f.name == "llama.cpp")
    text = pages["export"]["tabs"][label][-1]
    assert f" {flags}" in text          # the command adds -c to the table's flags
    assert re.search(rf"# predicted the best configuration( at the trace's context)?: {ms:.3f} "
                     "ms/token", text)
