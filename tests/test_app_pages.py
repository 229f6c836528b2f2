"""Every page of the explorer through Streamlit's AppTest: its widgets change what it shows
(checked against the library's numbers and the figures' data), uploads replace the data, and a
bad upload gives one error line while the previous data stays in use."""
from __future__ import annotations

import base64
import io
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from tiny import tiny_profile, tiny_trace

from cope_core import parquet_io, predict
from cope_core.app import whatif
from cope_core.app.apptest import open_unbroken
from cope_core.app.timeline import execution_timeline
from cope_core.errors import CopeInputError
from cope_core.export import EXPORT_FORMATS, FORMATS, build_policy, policy_json, render
from cope_core.export.llamacpp import lead_line
from cope_core.geometry import get_model
from cope_core.llamacpp import LlamaSettings, Request
from cope_core.matrix import CANDIDATE_IDS
from cope_core.parquet_io import Measurements
from cope_core.trace.data import fill_order
from cope_core.trace.stats import trace_stats

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "data" / "examples"
TRACE, CALIB = EX / "qwen3-30b-a3b-trace.parquet", EX / "qwen3-30b-a3b-calibration.parquet"
PROFILE = EX / "qwen3-30b-a3b-rtx4090-analytic.parquet"
EXPORT_FORMATS_BY_NAME = {f.name: f for f in EXPORT_FORMATS}


@pytest.fixture(scope="module")
def qwen():
    return (parquet_io.read_trace(TRACE), parquet_io.read_trace(CALIB),
            parquet_io.read_profile(PROFILE))


def open_app(page: str | None = None, **query: str) -> AppTest:
    """The app at ``page`` (None: the Overview) opened from a link with ``query``, raising
    nothing."""
    return open_unbroken(ROOT / "app.py", page, **query)


def rerun(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _arr(v):
    """Plotly's JSON arrays: lists, or typed arrays ``{"dtype", "bdata"[, "shape"]}``."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        if "shape" in v:
            a = a.reshape([int(x) for x in str(v["shape"]).split(",")])
        return a
    return np.asarray(v)


def charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def title(fig: dict) -> str:
    return fig["layout"]["title"]["text"]


def upload(at: AppTest, slot: str, name: str, data: bytes) -> AppTest:
    """Put a file into a slot's uploader (its key carries a generation number)."""
    box = next(u for u in at.file_uploader if u.key.startswith(f"_up_{slot}_"))
    box.set_value((name, data, "application/octet-stream"))
    return rerun(at)


def parquet_bytes(tmp_path: Path, write, obj, name: str) -> bytes:
    path = tmp_path / name
    write(obj, path)
    return path.read_bytes()


def expected(trace, cal, prof, k, **kw) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return predict(trace, prof, k, calibration=cal, **kw)


# --- Overview -------------------------------------------------------------------------------------
def test_overview_answers_first(qwen):
    tr, cal, prof = qwen
    at = open_app()
    assert at.subheader[0].value == "Model: qwen3-30b-a3b"
    df = expected(tr, cal, prof, whatif.k_for_budget(tr.model, 24.0))   # default: 24 GiB card
    w = whatif.winner_of(df)
    lp = df[df["candidate"] == "layer_partition"].iloc[0]
    metrics = [m.value for m in at.metric]
    # the answer, equal to the library's predict: winner, TPOT, win probability, runner-up
    assert metrics[0] == w.named          # "A", or "tied: A or B" as the CLI's winner line
    assert metrics[1] == f"{w.tpot_us / 1e3:.3f} ms"
    assert metrics[2] == f"{100 * w.win_probability:.0f} %"
    assert metrics[3] == ("tie" if w.margin_pct == 0 else f"+{w.margin_pct:.1f} %")
    said = [m.value for m in at.success] + [m.value for m in at.warning]
    assert w.sentence() + "." in said and "of the paired draws" in w.sentence()
    assert any(f"**{lp.tpot_us / 1e3:.3f} ms/token**" in m.value for m in at.markdown)
    # the small chart: the best TPOT at every K is the sweep's winner
    fig = next(c for c in charts(at) if title(c).startswith("Best TPOT"))
    best = next(t for t in fig["data"] if t.get("name") == "best candidate")
    sweep = expected(tr, cal, prof, list(range(tr.model.n_experts + 1)), draws=0)
    want = sweep[sweep["winner"]].sort_values("experts_per_layer")["tpot_us"] / 1e3
    np.testing.assert_allclose(_arr(best["y"]), want.to_numpy(), rtol=1e-9)
    # the tables are below, in expanders; the platform's label says which calibration it uses
    labels = [e.label for e in at.expander]
    assert any(lab.startswith("Platform: ANALYTIC profile (rtx4090: published peak numbers")
               for lab in labels), labels
    assert any(lab.startswith("Model: qwen3-30b-a3b") for lab in labels)
    assert any("SYNTHETIC trace" in m.value for m in at.markdown)
    ops = at.dataframe[2].value
    # every CPU-thread count at the four GPU shares of an analytic profile
    assert list(zip(ops["cpu_threads"], ops["gpu_share"])) == \
        [(t, s) for t in (1, 2, 4, 8, 16, 32) for s in (20.0, 50.0, 80.0, 100.0)]

    at.sidebar.selectbox(key="_w_example").set_value("deepseek-v2-lite")
    rerun(at)
    assert at.subheader[0].value == "Model: deepseek-v2-lite"
    assert at.query_params["example"] == "deepseek-v2-lite"
    ds_tr = parquet_io.read_trace(EX / "deepseek-v2-lite-trace.parquet")
    ds_df = expected(ds_tr, parquet_io.read_trace(EX / "deepseek-v2-lite-calibration.parquet"),
                     parquet_io.read_profile(EX / "deepseek-v2-lite-a100-analytic.parquet"),
                     whatif.k_for_budget(ds_tr.model,
                                         whatif.default_budget(ds_tr.model, {"gpu": "a100-80gb"})))
    assert at.metric[1].value == f"{whatif.winner_of(ds_df).tpot_us / 1e3:.3f} ms"


def test_bad_upload_shows_one_error_line_and_keeps_the_data(tmp_path):
    at = open_app()
    before = [m.value for m in at.metric]
    upload(at, "trace", "bad.parquet", b"this is not parquet")
    assert len(at.error) == 1
    msg = at.error[0].value
    assert msg.startswith("upload bad.parquet: not a readable Parquet file")
    assert "\n" not in msg
    assert at.subheader[0].value == "Model: qwen3-30b-a3b"          # previous data in use
    assert [m.value for m in at.metric] == before
    # a valid file of the wrong kind: the reader's schema message
    trace_bytes = parquet_bytes(tmp_path, parquet_io.write_trace, tiny_trace(), "t.parquet")
    upload(at, "profile", "t.parquet", trace_bytes)
    assert any(e.value == "upload t.parquet: field 'schema': this is a cope.trace/1 file, "
                          "expected cope.profile/2 or cope.profile/1" for e in at.error)
    assert at.subheader[0].value == "Model: qwen3-30b-a3b"


def test_uploads_replace_the_data(tmp_path):
    tr, prof = tiny_trace(), tiny_profile()
    at = open_app()
    upload(at, "trace", "tiny-trace.parquet",
           parquet_bytes(tmp_path, parquet_io.write_trace, tr, "a.parquet"))
    # the example's profile does not fit the tiny model: said once, nothing is predicted
    assert at.subheader[0].value == "Model: tiny"
    assert any("load a profile for the trace's model" in e.value for e in at.error)
    assert not at.metric
    assert any("calibration trace not used" in w.value for w in at.warning)
    upload(at, "profile", "tiny-profile.parquet",
           parquet_bytes(tmp_path, parquet_io.write_profile, prof, "b.parquet"))
    assert not at.error
    k = whatif.k_for_budget(tr.model, whatif.default_budget(tr.model, prof.platform))
    w = whatif.winner_of(expected(tr, None, prof, k))
    assert [m.value for m in at.metric][:2] == [w.candidate, f"{w.tpot_us / 1e3:.3f} ms"]
    assert any("optimistic" in x.value for x in at.warning)   # no calibration for it
    at.button[0].click()                                        # back to the example's files
    rerun(at)
    assert at.subheader[0].value == "Model: qwen3-30b-a3b"
    assert all(u.value is None for u in at.file_uploader)      # emptied, and stays so
    rerun(at)
    assert at.subheader[0].value == "Model: qwen3-30b-a3b"


def test_without_shipped_examples_uploads_still_work(tmp_path, monkeypatch):
    from cope_core.app import sources
    monkeypatch.setattr(sources, "EXAMPLES_DIR", tmp_path / "empty")
    at = open_app()
    assert "No shipped examples found" in at.sidebar.warning[0].value
    assert at.error[0].value.startswith("no trace and no profile loaded")
    upload(at, "trace", "t.parquet",
           parquet_bytes(tmp_path, parquet_io.write_trace, tiny_trace(), "t.parquet"))
    upload(at, "profile", "p.parquet",
           parquet_bytes(tmp_path, parquet_io.write_profile, tiny_profile(), "p.parquet"))
    assert not at.error and at.subheader[0].value == "Model: tiny"
    at.switch_page("pages/landscape.py")
    rerun(at)
    assert len([t for t in charts(at)[1]["data"] if t.get("name") in CANDIDATE_IDS]) == 13
    assert at.slider(key="_w_vram").max == whatif.budget_range(tiny_trace().model)[1]


# --- Policy Matrix --------------------------------------------------------------------------------
def test_matrix_cells_and_timeline(qwen):
    tr, cal, prof = qwen
    at = open_app("matrix", vram="20")
    k = whatif.k_for_budget(tr.model, 20.0)
    df = expected(tr, cal, prof, k).set_index("candidate")
    heat = charts(at)[0]
    z = _arr(heat["data"][0]["z"]).astype(float).reshape(3, 4)
    assert z[1, 3] == pytest.approx(df.loc["mutable_per_layer/cost_selected", "tpot_us"] / 1e3)
    assert z[0, 2] == pytest.approx(df.loc["fixed/ready_first", "tpot_us"] / 1e3)
    assert f"K = {k}" in title(heat)

    op = prof.resolve(32, 100.0)
    def ends():
        tl = charts(at)[1]
        return [_arr(t["x"])[0] for t in tl["data"] if t.get("name", "").count("composed end")]
    assert ends() == pytest.approx([execution_timeline(op, "ready_first", 4).total_us,
                                    execution_timeline(op, "wait_then_gpu", 4).total_us])
    at.slider(key="_w_hits").set_value(7)
    rerun(at)
    assert ends() == pytest.approx([execution_timeline(op, "ready_first", 7).total_us,
                                    execution_timeline(op, "wait_then_gpu", 7).total_us])
    assert at.query_params["hits"] == "7"
    at.selectbox(key="_w_cell").set_value("layer_partition")
    at.selectbox(key="_w_cmp").set_value("none")
    rerun(at)
    names = [t.get("name", "") for t in charts(at)[1]["data"]]
    assert sum("composed end" in n for n in names) == 2
    assert any(n.startswith("layer_partition · CPU layer") for n in names)


def test_matrix_page_shows_llamacpps_own_cache_as_the_library_searches_it(qwen):
    from cope_core.llamacpp import CACHE_LABEL, llamacpp_record
    tr, cal, prof = qwen
    at = open_app("matrix", vram="20")
    k = whatif.k_for_budget(tr.model, 20.0)
    w = whatif.winner_of(expected(tr, cal, prof, k)).candidate
    req = Request()                     # the sidebar's default request: -c holds it
    rec = llamacpp_record(tr, prof, cal, experts_per_layer=k, vram_gib=20.0, matrix_winner=w,
                          cpu_threads=32, gpu_share=100.0, llama=LlamaSettings(n_ctx=req.tokens),
                          request=req)
    assert rec is not None and any(h.value == CACHE_LABEL for h in at.subheader)
    table = at.dataframe[0].value
    assert list(table["TPOT ms"]) == [round(b.tpot_us / 1e3, 3) for b in rec.best]
    assert f"--moe-cache-mib {rec.best[0].cache_mib}" in table["llama-server flags"][0] \
        or rec.best[0].cache_mib == 0
    assert any(m.value.startswith("llama.cpp's best here") for m in at.markdown)


def test_matrix_and_export_pages_show_the_same_llamacpp_numbers(qwen):
    """One record at one budget (issue 37: the pages said 8.241 ms with 1059 MiB and 8.255 ms
    with 1039 MiB, the Export page searching at K's bytes instead of the budget)."""
    matrix = open_app("matrix", vram="20")
    verdict = next(m.value for m in matrix.markdown if m.value.startswith("llama.cpp's best"))
    ms = verdict.split(" at ")[1].split(" ms/token")[0]
    flags = matrix.dataframe[0].value["llama-server flags"][0]
    export = open_app("export", vram="20")
    text = _shown(export)["llama.cpp"]
    assert re.search(rf"# predicted the best configuration( at the trace's context)?: {ms} "
                     "ms/token", text)
    assert f" {flags}" in text          # the command adds -c to the table's flags


# --- Landscape ------------------------------------------------------------------------------------
def test_landscape_sweeps_the_llamacpp_cache_size(qwen):
    from cope_core.geometry import GIB
    from cope_core.llamacpp import search_cache
    tr, _, prof = qwen
    at = open_app("landscape", vram="20", ncmoe="40", cachesweep="1")
    fig = charts(at)[-1]
    assert "--n-cpu-moe 40" in title(fig)
    lines = {t["name"]: (_arr(t["x"]), _arr(t["y"])) for t in fig["data"]}
    x, y = lines["classlru, share 0.5"]
    df = search_cache(tr, prof, tr.model.expert_budget_bytes(20 * GIB), n_cpu=[40],
                cache_mib=[int(v) for v in x], cpu_threads=32, gpu_share=100.0).frame
    want = df[(df.version == "classlru") & (df.cpu_share == 0.5)].sort_values("cache_mib")
    assert y == pytest.approx(want.tpot_us.to_numpy() / 1e3)
    assert len(x) == 12 and "lru" in lines
    at.number_input(key="_w_ncmoe").set_value(48)
    rerun(at)
    assert "--n-cpu-moe 48" in title(charts(at)[-1]) and at.query_params["ncmoe"] == "48"

def _bars(at) -> dict[str, float]:
    fig = charts(at)[0]
    parts = [t for t in fig["data"] if t.get("type") == "bar"]
    labels = [y.lstrip("★ ") for y in parts[0]["y"]]
    total = sum(_arr(p["x"]) for p in parts)
    return dict(zip(labels, total))


def test_landscape_slider_estimator_filters_and_sweep(qwen):
    tr, cal, prof = qwen
    at = open_app("landscape", vram="20", est="atomic")
    assert at.slider(key="_w_vram").value == 20.0
    assert at.radio(key="_w_est").value == "atomic"
    k = whatif.k_for_budget(tr.model, 20.0)
    df = expected(tr, cal, prof, k, estimator="atomic")
    bars = _bars(at)
    for cand, tpot in zip(df.candidate, df.tpot_us):
        assert bars[cand] == pytest.approx(tpot / 1e3)

    sweep = charts(at)[1]
    assert len([t for t in sweep["data"] if t.get("name") in CANDIDATE_IDS]) == 13
    full = expected(tr, cal, prof, range(129), estimator="atomic")
    words = whatif.break_even_sentences(whatif.winner_regions(full, tr.model))
    shown = [m.value for m in at.markdown if m.value.startswith("- ")]
    assert shown == [f"- {w}" for w in words]

    at.slider(key="_w_vram").set_value(30.0)
    rerun(at)
    k2 = whatif.k_for_budget(tr.model, 30.0)
    assert k2 != k and f"K = {k2}" in title(charts(at)[0])
    df2 = expected(tr, cal, prof, k2, estimator="atomic")
    assert _bars(at)["fixed/parallel"] == pytest.approx(
        df2.set_index("candidate").loc["fixed/parallel", "tpot_us"] / 1e3)
    assert at.query_params["vram"] == "30"
    assert at.success[0].value.startswith(f"At 30 GiB (K = {k2}): "
                                          f"{whatif.winner_of(df2).candidate} wins")

    at.multiselect(key="_w_res").set_value(["fixed"])
    at.checkbox(key="_w_lp").uncheck()
    rerun(at)
    assert sorted(_bars(at)) == ["fixed/cost_selected", "fixed/parallel", "fixed/ready_first",
                                 "fixed/wait_then_gpu"]
    assert at.query_params["res"] == "fixed" and at.query_params["lp"] == "0"
    at.multiselect(key="_w_exe").set_value([])
    rerun(at)
    assert not charts(at) and "No candidate selected" in at.info[0].value


# --- Predicted vs measured ------------------------------------------------------------------------
def _qwen_measurements(k: int) -> Measurements:
    rows = [{"candidate": c, "prompt": p, "trial": t, "tpot_us": 10000.0 + 500 * i + 100 * p
             + 10 * t, "K": k, "cpu_threads": 32, "gpu_share": 100.0}
            for i, c in enumerate(CANDIDATE_IDS) for p in (0, 1) for t in (0, 1)]
    df = pd.DataFrame(rows).astype({"prompt": "int32", "trial": "int32", "K": "int32",
                                    "cpu_threads": "int16", "gpu_share": "float32"})
    return Measurements(table=df, model=get_model("qwen3-30b-a3b"),
                        platform={"gpu": "hand-made", "accelerator": "emulated"},
                        notes="hand-made numbers for a test")


def test_measured_page_empty_state_upload_metrics_and_drilldown(qwen, tmp_path):
    tr, cal, prof = qwen
    at = open_app("measured")
    assert "No measurements loaded" in at.info[0].value and not charts(at)
    upload(at, "measurements", "junk.parquet", b"PAR1 nonsense")
    assert at.error[0].value.startswith("upload junk.parquet: not a readable Parquet file")
    assert "No measurements loaded" in at.info[0].value

    data = parquet_bytes(tmp_path, parquet_io.write_measurements, _qwen_measurements(40),
                         "m.parquet")
    upload(at, "measurements", "m.parquet", data)
    assert not at.error
    table = at.dataframe[0].value
    assert table["estimator"].tolist() == ["cope", "atomic", "hrm"]
    ref = expected(tr, cal, prof, 40, cpu_threads=32, gpu_share=100.0)
    err = [abs(v - (10000.0 + 500 * i + 100 * p + 5)) / (10000.0 + 500 * i + 100 * p + 5)
           for i, tp in enumerate(ref.prompt_tpot_us) for p, v in zip((0, 1), tp)]
    assert table.loc[0, "MAPE %"] == pytest.approx(100 * np.mean(err))
    assert table.loc[0, "pairs"] == 26
    scatter = charts(at)[0]
    points = [t for t in scatter["data"] if t.get("mode") == "markers"]
    assert sum(len(_arr(t["x"])) for t in points) == 3 * 26
    # the noise-aware scores and the per-cell table are cope evaluate's
    from cope_core.estimate.evaluate import evaluate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evals = evaluate(tr, prof, _qwen_measurements(40), cal)
    for i, est in enumerate(("cope", "atomic", "hrm")):
        n = evals[est].noise
        assert table.loc[i, "regret % mean"] == pytest.approx(n.regret_mean_pct)
        assert table.loc[i, "top-1 in noise (cells)"] == \
            f"{n.top1_within_noise[0]}/{n.top1_within_noise[1]}"
    cells = at.dataframe[1].value
    row = evals["cope"].per_k[0]
    assert cells.loc[0, "measured winner"] == row["measured"]
    lo, hi = row["measured_tpot_ci_us"]
    assert cells.loc[0, "measured ms (95 %)"] == f"[{lo / 1e3:.3f}, {hi / 1e3:.3f}]"
    assert row["predicted"] in cells.loc[0, "cope"]
    drill = at.dataframe[2].value
    assert drill["measured_us"].tolist() == [10000.0 + 500 * i + 5 for i in range(13)]
    at.selectbox(key="_w_prompt").set_value(1)
    rerun(at)
    assert at.dataframe[2].value["measured_us"].tolist() == [10105.0 + 500 * i
                                                             for i in range(13)]
    assert at.dataframe[2].value["cope_us"].tolist() == pytest.approx(
        [tp[1] for tp in ref.prompt_tpot_us])


def test_measured_page_offers_the_examples_with_measurements_and_shows_their_verify_run():
    from cope_core.verify import read_verify
    at = open_app("measured")
    assert "No measurements loaded" in at.info[0].value
    name = "deepseek-v2-lite · 4 MoE layers"
    at.button(key=f"switch_{name}").click()
    rerun(at)
    assert not at.info or "No measurements loaded" not in at.info[0].value
    assert at.query_params["example"] == [name] or at.query_params["example"] == name
    record = read_verify(EX / "deepseek-v2-lite-4l-cpu-emulated-verify.json")
    table = at.dataframe[-1].value
    assert table["verified"].tolist() == [c.verified_winner for c in record.cells]
    assert table["predicted"].tolist() == [c.predicted_winner for c in record.cells]
    assert table["rounds"].tolist() == [c.rounds for c in record.cells]
    t = record.totals()
    assert any(f"The prediction stood in {t['agree']} of {t['cells']} cells" in m.value
               for m in at.markdown)
    # the measurement quality line comes from estimate.quality, as cope evaluate prints it
    assert any(c.value.startswith("Measurement quality: noise floor") for c in at.caption)
    race = [f for f in charts(at) if title(f).startswith("The race at")]
    assert len(race) == 1
    first = record.cells[0]
    lines = [tr for tr in race[0]["data"] if tr.get("mode") == "lines+markers"]
    assert [tr["name"] for tr in lines] == [c["candidate"] for c in first.contenders]
    # a bad verify upload is one error line; the example's record stays in use
    box = next(u for u in at.file_uploader if u.key == "_up_verify")
    box.set_value(("bad.json", b'{"schema": "cope.policy/1"}', "application/json"))
    rerun(at)
    assert any(e.value.startswith("upload bad.json: field 'schema'") for e in at.error)
    assert at.dataframe[-1].value["verified"].tolist() == table["verified"].tolist()


def _shipped_examples():
    from cope_core.app.dataset import scan_examples
    return scan_examples(EX)


def test_the_shipped_examples_are_all_there():
    # guards the per-example smoke test below against passing vacuously
    exs = _shipped_examples()
    assert len(exs) >= 6
    assert [e.name for e in exs if e.measurements] == ["deepseek-v2-lite · 4 MoE layers"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [e.name for e in _shipped_examples()])
def test_every_page_of_a_shipped_example_opens(name):
    at = open_app(example=name)
    assert not at.error, (name, [e.value for e in at.error])
    assert at.title[0].value == "COPE Explorer"
    for page in ("matrix", "landscape", "traces", "profiles", "export"):
        at = open_app(page, example=name)
        assert not at.error, (name, page, [e.value for e in at.error])
        assert charts(at) or page == "export", (name, page)


def test_the_measured_example_scores_as_evaluate(capsys):
    from cope_core.cli.main import main

    ex, = [e for e in _shipped_examples() if e.measurements]
    at = open_app("measured", example=ex.name)
    assert not at.error and not at.info
    caption = " ".join(c.value for c in at.caption)
    assert "SYNTHETIC trace" in caption and "MEASURED" in caption.upper()
    table = at.dataframe[0].value.set_index("estimator")
    assert main(["evaluate", "--trace", ex.traces[0], "--calibration", ex.calibrations[0],
                 "--profile", ex.profiles[0], "--measurements", ex.measurements[0],
                 "--json"]) == 0
    ref = json.loads(capsys.readouterr().out)
    for est in ("cope", "atomic", "hrm"):
        assert table.loc[est, "MAPE %"] == pytest.approx(ref[est]["mape_pct"])
        assert table.loc[est, "pairs"] == ref[est]["pairs"]


# --- Traces ---------------------------------------------------------------------------------------
def test_traces_page_popularity_sort_and_hit_rates(qwen):
    tr, cal, _ = qwen
    at = open_app("traces")
    figs = charts(at)
    z = _arr(figs[0]["data"][0]["z"]).reshape(tr.model.n_layers, tr.model.n_experts)
    np.testing.assert_allclose(z, tr.popularity / tr.n_tokens)
    hit = next(f for f in figs if "Hit rate" in title(f))
    assert len(hit["data"]) == 4
    fixed = next(t for t in hit["data"] if t["name"] == "fixed")
    from cope_core.replay.engine import replay
    rc = replay(tr, fill_order(cal), "fixed", [0, 64, 128])
    want = rc.hits().sum(axis=1) / (tr.n_tokens * tr.model.n_layers * tr.model.top_k)
    np.testing.assert_allclose(_arr(fixed["y"])[[0, 64, 128]], want)

    at.toggle(key="_w_sort").set_value(True)
    at.radio(key="trace_choice").set_value("calibration trace")
    rerun(at)
    z = _arr(charts(at)[0]["data"][0]["z"]).reshape(tr.model.n_layers, tr.model.n_experts)
    np.testing.assert_allclose(z, -np.sort(-cal.popularity, axis=1) / cal.n_tokens)


def test_traces_page_shows_the_trace_stats_module_numbers(qwen):
    tr, cal, _ = qwen
    ref = trace_stats(tr, cal)
    at = open_app("traces")
    figs = charts(at)
    assert f"take {np.mean(ref.skew) * 100:.1f}% of routing" in title(figs[0])
    reuse = next(f for f in figs if "reuse" in title(f))
    np.testing.assert_allclose(_arr(reuse["data"][0]["y"]), ref.reuse)
    recall = next(f for f in figs if "recall" in title(f))
    lines = {t["name"]: _arr(t["y"]) for t in recall["data"]}
    assert list(lines) == ["predictor", "previous token", "popularity"]
    for name, col in zip(lines, (ref.recall, ref.recall_previous_token, ref.recall_popularity)):
        assert len(col) == tr.model.n_layers - 1
        np.testing.assert_allclose(lines[name], col)
    hot = at.dataframe[0].value
    assert hot["experts per layer"].tolist() == list(ref.hot_set.ks) == [13, 32, 64]
    np.testing.assert_allclose(hot["routed experts caught (%)"],
                               100 * np.array(ref.hot_set.caught))
    said = [m.value for m in [*at.success, *at.warning] if "cache" in m.value]
    assert said == [ref.hot_set.verdict]
    table = at.dataframe[1].value
    assert table.columns.tolist() == ["predictor", "previous token", "popularity"]
    np.testing.assert_allclose(table.iloc[0].to_numpy(float),
                               [ref.to_dict()["mean"][m] for m in
                                ("recall", "recall_previous_token", "recall_popularity")])
    # the calibration trace's own statistics when it is the one shown
    at.radio(key="trace_choice").set_value("calibration trace")
    rerun(at)
    reuse = next(f for f in charts(at) if "reuse" in title(f))
    np.testing.assert_allclose(_arr(reuse["data"][0]["y"]), trace_stats(cal).reuse)


# --- Profiles -------------------------------------------------------------------------------------
def test_profiles_page_operating_point_and_comparison(qwen):
    _, _, prof = qwen
    at = open_app("profiles")
    figs = charts(at)
    assert len(figs) == 3
    atomic = figs[0]
    cpu = next(t for t in atomic["data"] if t["name"].startswith("C: experts on CPU"))
    np.testing.assert_allclose(_arr(cpu["y"]), prof.resolve(32, 100.0).atomic["cpu_expert"])
    at.selectbox(key="_w_op").set_value("4@100")
    rerun(at)
    cpu = next(t for t in charts(at)[0]["data"] if t["name"].startswith("C: experts on CPU"))
    np.testing.assert_allclose(_arr(cpu["y"]), prof.resolve(4, 100.0).atomic["cpu_expert"])
    at.selectbox(key="_w_compare").set_value("analytic:h100")
    rerun(at)
    figs = charts(at)
    assert len(figs) == 5                         # two columns of two, and the shared costs
    assert [t["name"] for t in figs[-1]["data"]] == ["current", "analytic:h100"]
    assert any("ANALYTIC profile (h100" in m.value for m in at.markdown)


GRID = ROOT / "data" / "platforms" / "cpu-emulated-grid"


def open_grid(page: str) -> AppTest:
    """``page`` on the shipped controlled grid's example at its 4 GB/s setting."""
    if not (GRID / "report.json").exists():
        pytest.skip("no shipped grid")
    at = open_app(page, example="mixtral-8x7b · 2 MoE layers",
                  profile="profile-link-4-slow-2.parquet")
    assert not at.error, [e.value for e in at.error]
    return at


def test_profiles_page_shows_a_measured_profiles_contention():
    from cope_core.estimate.contention import contention
    grid = GRID
    at = open_grid("profiles")
    fig = next(f for f in charts(at) if "isolated operators" in title(f))
    prof = parquet_io.read_profile(grid / "profile-link-4-slow-2.parquet")
    t, s = prof.choose()
    want = contention(prof, t, s)
    got = {x: y for tr in fig["data"] for x, y in zip(tr["x"], _arr(tr["y"]))}
    np.testing.assert_allclose([got[f"{r.execution} h{r.hits} c{r.cpu} u{r.staged}"]
                                for r in want.itertuples()], want["excess_pct"])
    hid = next(d.value for d in at.dataframe if "hidden_pct" in d.value.columns)
    assert hid["residency"].tolist() == ["mutable_per_layer", "mutable_cross_layer"]


# --- Export ---------------------------------------------------------------------------------------
@pytest.fixture
def downloads(monkeypatch) -> dict[str, bytes]:
    """The bytes every download button of a run hands to Streamlit, by file name."""
    from streamlit.runtime.media_file_manager import MediaFileManager
    seen: dict[str, bytes] = {}
    add = MediaFileManager.add

    def record(self, data, mimetype, coordinates, file_name=None, is_for_static_download=False):
        seen[file_name] = data
        return add(self, data, mimetype, coordinates, file_name, is_for_static_download)

    monkeypatch.setattr(MediaFileManager, "add", record)
    return seen


def _policy(tr, cal, prof, gib, candidate):
    """The Export page's policy: at the page's VRAM budget (K follows), as the Policy Matrix's,
    with the sidebar's default request (llama.cpp's -c holds it)."""
    req = Request()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_policy(tr, prof, cal, vram_gib=gib, cpu_threads=32, candidate=candidate,
                            llama=LlamaSettings(n_ctx=req.tokens), request=req)


def _shown(at) -> dict[str, str]:
    """The rendered text of each format whose tab shows one (a strict error shows none): the
    tab's last code block (a shell export leads with its command, the whole text folded below)."""
    tabs = {t.label: t for t in at.tabs}
    labels = {f.name: f.label for f in EXPORT_FORMATS}
    return {f: tabs[labels[f]].code[-1].value for f in FORMATS if len(tabs[labels[f]].code)}


def _without_time(text: str) -> dict:
    out = json.loads(text)
    out["provenance"].pop("created")
    return out


def test_export_page_renders_every_runtime_format(qwen, downloads):
    import torch
    tr, cal, prof = qwen
    at = open_app("export", vram="20")
    k = whatif.k_for_budget(tr.model, 20.0)
    w = whatif.winner_of(expected(tr, cal, prof, k))
    assert any(m.value.startswith(f"**{w.candidate}** at K = {k}") for m in at.markdown)
    pol = _policy(tr, cal, prof, 20.0, "best")
    assert pol.candidate == w.candidate
    stem = f"qwen3-30b-a3b-{w.candidate.replace('/', '-')}-K{k}"
    shown = _shown(at)
    # legacy KTransformers runs Qwen3-MoE only through balance_serve, with no GPU experts layer:
    # the page shows the library's one-line refusal instead of rules
    with pytest.raises(CopeInputError) as refusal:
        render(pol, "ktransformers")
    assert list(shown) == [f for f in FORMATS if f != "ktransformers"]
    assert _without_time(shown["json"]) == _without_time(policy_json(pol))
    lib = {f: render(pol, f, **EXPORT_FORMATS_BY_NAME[f].side_options(stem))
           for f in FORMATS if f not in ("json", "ktransformers")}   # in the page's order
    tabs = {t.label: t for t in at.tabs}
    for fmt, r in lib.items():
        assert shown[fmt] == r.text.rstrip("\n")      # st.code drops the final newline
        lead = tabs[EXPORT_FORMATS_BY_NAME[fmt].label].code[0].value   # the tab opens with it
        if EXPORT_FORMATS_BY_NAME[fmt].language == "bash":
            assert lead == next(ln for ln in r.text.splitlines()
                                if ln.strip() and not ln.startswith("#")), fmt
    assert downloads[stem + ".llama.cpp.sh"] == lib["llama.cpp"].text.encode()
    assert downloads[stem + ".vllm.sh"] == lib["vllm"].text.encode()
    assert downloads[stem + ".sglang-kt.sh"] == lib["sglang-kt"].text.encode()
    assert _without_time(downloads[stem + ".policy.json"].decode()) == \
        _without_time(policy_json(pol))
    assert f"--init-expert-location {stem}.pt" in shown["sglang-kt"]
    # each side file is downloaded under the name its record gives, the one the flags name
    # (cope export -o STEM.sh writes the same name: tests/test_export_formats.py)
    sides = [f for f in EXPORT_FORMATS if f.side_file and f.name in lib]
    assert [f.name for f in sides] == ["exllamav3", "sglang-kt"]
    for f in sides:
        (path, data), = lib[f.name].files
        assert path == stem + f.side_file.suffix == f.side_options(stem)[f.side_file.option]
        assert downloads[path] == data and path in shown[f.name]
    assert f"EXL3_MOE_CPU_SPLIT_STATS={stem}.json " in shown["exllamav3"]
    # what a record leads with and its caption, in its tab: how sure llama.cpp's command is for
    # the request and its time to first token (the library's lead_line), COPE's own caption
    lead = EXPORT_FORMATS_BY_NAME["llama.cpp"].lead(pol)
    assert lead and lead == lead_line(pol) and "first token in" in lead
    llama_tab = tabs[EXPORT_FORMATS_BY_NAME["llama.cpp"].label]
    assert [m.value for m in llama_tab.markdown] == [lead]
    assert all(not f.lead for f in EXPORT_FORMATS if f.name != "llama.cpp")
    own = [f for f in EXPORT_FORMATS if f.own_record]
    assert [f.name for f in own] == ["json"] and [t.label for t in at.tabs][-1] == own[0].label
    assert [c.value for c in tabs[own[0].label].caption] == [own[0].caption]
    # exact or not, as the renderer says, with its summary (nearest policy and the TPOT gap)
    assert not at.error and [x.value for x in at.info] == [refusal.value.detail]
    assert [x.value for x in at.warning] == [r.summary for r in lib.values() if not r.exact]
    labels = {f.name: f.label for f in EXPORT_FORMATS}
    assert [x.value for x in at.success] == [f"{labels[f]} runs exactly {w.candidate}."
                                             for f, r in lib.items() if r.exact]
    assert any("layer_partition is predicted at" in x.value for x in at.warning)

    # the expert-location file: {"logical_count": [1, dense + L, E]}, ones exactly at each
    # layer's K fill experts
    t = torch.load(io.BytesIO(downloads[stem + ".pt"]), weights_only=True)["logical_count"][0]
    g = tr.model
    assert t.dtype == torch.float32 and tuple(t.shape) == (g.dense_layers + g.n_layers,
                                                           g.n_experts)
    want = np.zeros((g.n_layers, g.n_experts), np.float32)
    np.put_along_axis(want, fill_order(cal)[:, :k].astype(np.int64), 1.0, axis=1)
    np.testing.assert_array_equal(t.numpy()[g.dense_layers:], want)

    at.selectbox(key="_w_cand").set_value("fixed/ready_first")
    rerun(at)
    assert at.query_params["cand"] == "fixed/ready_first"
    pol = _policy(tr, cal, prof, 20.0, "fixed/ready_first")
    shown = _shown(at)
    assert _without_time(shown["json"]) == _without_time(policy_json(pol))
    for fmt in ("llama.cpp", "vllm"):
        assert shown[fmt] == render(pol, fmt).text.rstrip("\n")
    sg = render(pol, "sglang-kt", pt_path=f"qwen3-30b-a3b-fixed-ready_first-K{k}.pt")
    assert shown["sglang-kt"] == sg.text.rstrip("\n") and not sg.exact
    assert sg.summary in [x.value for x in at.warning]
    assert "fixed/parallel is predicted at" in sg.summary


def test_export_page_strict_makes_an_inexpressible_candidate_an_error(qwen):
    tr, cal, prof = qwen
    at = open_app("export", vram="20", cand="fixed/ready_first", strict="1")
    assert at.toggle(key="_w_strict").value is True
    pol = _policy(tr, cal, prof, 20.0, "fixed/ready_first")
    messages = []
    for fmt in [f for f in FORMATS if f not in ("json", "ktransformers")]:   # the page's order
        with pytest.raises(CopeInputError) as exc:
            render(pol, fmt, strict=True)
        messages.append(str(exc.value))
    assert [e.value for e in at.error] == messages          # one line each, nothing rendered
    assert len(at.info) == 1 and "balance_serve" in at.info[0].value   # KTransformers: n/a
    assert all("\n" not in m for m in messages)
    assert list(_shown(at)) == ["json"] and not at.warning
    # layer_partition runs exactly on llama.cpp, ik_llama.cpp, exllamav3 and SGLang-KT; vLLM never;
    # legacy KTransformers cannot run this Qwen3-MoE placement at all (strict or not)
    at.selectbox(key="_w_cand").set_value("layer_partition")
    rerun(at)
    assert [e.value.split(":")[1].strip() for e in at.error] == ["vLLM cannot express "
                                                                 "layer_partition", "FreeToken "
                                                                 "cannot express layer_partition"]
    assert len(at.info) == 1 and "balance_serve" in at.info[0].value
    assert list(_shown(at)) == ["json", "llama.cpp", "ik_llama.cpp", "exllamav3", "sglang-kt",
                                "fastllm"]
    at.toggle(key="_w_strict").set_value(False)
    rerun(at)
    assert not at.error and list(_shown(at)) == [f for f in FORMATS if f != "ktransformers"]
    assert at.query_params["strict"] == "0"


def test_export_page_policy_follows_the_chosen_gpu_share(tmp_path):
    tr, prof = tiny_trace(), tiny_profile(operating_points=((4, 50.0), (4, 100.0)))
    at = open_app()
    upload(at, "trace", "t.parquet",
           parquet_bytes(tmp_path, parquet_io.write_trace, tr, "t.parquet"))
    upload(at, "profile", "p.parquet",
           parquet_bytes(tmp_path, parquet_io.write_profile, prof, "p.parquet"))
    at.switch_page("pages/export.py")
    rerun(at)
    # one tab per format record, in the records' order but the JSON record last
    assert [t.label for t in at.tabs] == [f.label for f in EXPORT_FORMATS if f.name != "json"] \
        + [f.label for f in EXPORT_FORMATS if f.name == "json"]
    policy = json.loads(_shown(at)["json"])
    assert policy["operating_point"]["gpu_share"] == 100.0
    at.selectbox(key="_w_op").set_value("4@50")
    rerun(at)
    policy = json.loads(_shown(at)["json"])
    assert policy["operating_point"]["gpu_share"] == 50.0


# --- cope app -------------------------------------------------------------------------------------
def test_cope_app_runs_streamlit_on_this_app(capsys):
    from cope_core.cli.main import main
    assert main(["app", "--print-command", "--port", "8600", "--headless"]) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[1:4] == ["-m", "streamlit", "run"]
    assert Path(cmd[4]) == ROOT / "app.py"
    assert cmd[5:] == ["--server.port", "8600", "--server.headless", "true"]
    # the file watcher and the developer's toolbar only with --dev (.streamlit/config.toml)
    assert main(["app", "--print-command", "--dev"]) == 0
    assert capsys.readouterr().out.split()[5:] == ["--server.fileWatcherType", "auto",
                                                   "--client.toolbarMode", "developer"]
    assert main(["app", "--port", "70000"]) == 2
    assert "expected a port in 1..65535" in capsys.readouterr().err
    assert main(["app", "--examples", str(ROOT / "no-such-folder")]) == 2


# --- Compare platforms ----------------------------------------------------------------------------
def test_compare_page_equals_the_library(qwen):
    from cope_core.app import compare_view
    from cope_core.estimate.compare import compare
    tr, cal, prof = qwen
    at = open_app("compare", plat="this,rtx5090+pcie5+epyc-7763", vram="16")
    assert at.multiselect(key="_w_plat").value == ["this", "rtx5090+pcie5+epyc-7763"]
    table = at.dataframe[0].value
    op = (32, 100.0)                 # the example profile's default operating point
    plats = compare_view.build(["this", "rtx5090+pcie5+epyc-7763"], prof, (), op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = compare(tr, plats, 16.0, cal, cpu_threads=op[0], gpu_share=op[1])
    assert table["platform"].tolist() == ref.at_budget["platform"].tolist()
    assert table["winner"].tolist() == ref.at_budget["winner"].tolist()
    np.testing.assert_allclose(table["TPOT ms"], ref.at_budget["tpot_us"] / 1e3)
    np.testing.assert_allclose(table["speed-up"], ref.at_budget["speedup"])
    fig = charts(at)[0]
    assert [t["name"] for t in fig["data"]] == ref.at_budget["platform"].tolist()
    np.testing.assert_allclose(_arr(fig["data"][1]["y"]),
                               ref.sweep[ref.sweep["platform"] == "rtx5090+pcie5+epyc-7763"]
                               ["tpot_us"] / 1e3)
    # a custom platform: its numbers go into the spec
    at.multiselect(key="_w_plat").set_value(["this", "custom"])
    rerun(at)
    at.number_input(key="_w_custom_gpu_tflops").set_value(400.0)
    rerun(at)
    spec, vram = compare_view.custom_spec((400.0, 1008.0, 24.0, 31.5, 150.0))
    assert spec.gpu_flops == 400e12 and vram == 24.0
    table = at.dataframe[0].value
    assert table["platform"].tolist() == ["this profile (analytic, rtx4090)", "custom platform"]
    assert table["kind"].tolist() == ["ANALYTIC", "ANALYTIC"]
    assert at.query_params["plat"] in ("this,custom", ["this,custom"])
    assert at.query_params["custom"] in ("400,1008,24,31.5,150", ["400,1008,24,31.5,150"])
    # fewer than two: said, nothing computed
    at.multiselect(key="_w_plat").set_value(["this"])
    rerun(at)
    assert any("at least two platforms" in i.value for i in at.info) and not at.dataframe


def test_a_shared_link_carries_the_custom_platform(qwen):
    """The custom platform's numbers come back from the URL (a link from when it had its own
    CPU threads, six numbers, is read without them: the operating point's threads price every
    platform); nonsense there falls back to the defaults (too few numbers, or one below the
    inputs' minimum)."""
    from cope_core.app import compare_view
    from cope_core.estimate.compare import compare
    tr, cal, prof = qwen
    at = open_app("compare", plat="this,custom", vram="16", custom="400,2000,48,64,8,200")
    assert [at.number_input(key=f"_w_custom_{f}").value for f in compare_view.CUSTOM_FIELDS] \
        == [400.0, 2000.0, 48.0, 64.0, 200.0]
    assert at.query_params["custom"] in ("400,2000,48,64,200", ["400,2000,48,64,200"])
    spec, vram = compare_view.custom_spec((400.0, 2000.0, 48.0, 64.0, 200.0), 32)
    assert (spec.gpu_flops, spec.link_bandwidth, vram) == (400e12, 64e9, 48.0)
    assert spec.cpu_cores == 32 and spec.cpu_bandwidth == 200e9
    plats = compare_view.build(["this", "custom"], prof, (400.0, 2000.0, 48.0, 64.0, 200.0),
                               (32, 100.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = compare(tr, plats, 16.0, cal, cpu_threads=32, gpu_share=100.0)
    np.testing.assert_allclose(at.dataframe[0].value["TPOT ms"], ref.at_budget["tpot_us"] / 1e3)
    for junk in ("400,2000", "400,2000,48,64,8,0.001", "400,x,48,64,8,200"):
        at = open_app("compare", plat="this,custom", custom=junk)
        assert [at.number_input(key=f"_w_custom_{f}").value
                for f in compare_view.CUSTOM_FIELDS] == list(compare_view.CUSTOM_DEFAULT), junk
        assert not at.exception, junk


def test_the_grid_is_browsable_one_profile_per_setting():
    grid = GRID
    at = open_grid("measured")
    assert at.selectbox(key="_w_profile").options == [
        "profile-link-1-slow-1.parquet", "profile-link-4-slow-2.parquet",
        "profile-link-unpaced-slow-4.parquet"]
    cells = at.dataframe[1].value
    report = json.loads((grid / "report.json").read_text())["cells"]
    want = [c for c in report if c["link_gbps"] == 4.0]
    assert cells["measured winner"].tolist() == [c["measured"] for c in want]
    # another setting's profile brings its own measurements
    at.selectbox(key="_w_profile").set_value("profile-link-unpaced-slow-4.parquet")
    rerun(at)
    assert not at.error
    want = [c for c in report if c["link_gbps"] is None]
    assert at.dataframe[1].value["measured winner"].tolist() == [c["measured"] for c in want]


def test_a_model_file_upload_reprices_the_example_and_a_bad_one_is_one_error(qwen):
    """The Overview's model upload: the header of the published Q4_K_M GGUF prices the example's
    routing at its stored bytes (analytic profile re-priced); a bad file is one error line."""
    from cope_core.models import read_gguf
    from cope_core.profile.analytic import analytic_for_model
    tr, cal, prof = qwen
    header = ROOT / "data" / "models" / "qwen3-30b-a3b-Q4_K_M.header.gguf"
    at = open_app()
    before = [m.value for m in at.metric]
    upload(at, "model", "bad.gguf", b"not a model at all")
    assert len(at.error) == 1 and "\n" not in at.error[0].value
    assert at.error[0].value.startswith("upload bad.gguf: ")
    assert [m.value for m in at.metric] == before                   # previous data in use
    upload(at, "model", header.name, header.read_bytes())
    assert not at.error
    g = read_gguf(header).geometry
    assert at.subheader[0].value == f"Model: {g.name}"
    q4 = analytic_for_model(prof, g)
    k = whatif.k_for_budget(g, whatif.default_budget(g, q4.platform))
    w = whatif.winner_of(expected(tr.with_model(g), cal.with_model(g), q4, k))
    assert [m.value for m in at.metric][:2] == [w.candidate, f"{w.tpot_us / 1e3:.3f} ms"]


def test_the_llamacpp_build_is_chosen_in_the_sidebar_and_kept_in_the_url():
    """A build without the MoE cache (b7407: --fit, --n-cpu-moe): the Export page's llama.cpp
    answer is that build's (no cache flag, the build named), the choice survives a page change
    through the URL, and an unknown value in a link falls back to the newest build."""
    at = open_app("export", llamacpp="b7407")
    box = next(s for s in at.sidebar.selectbox if s.label == "llama.cpp build")
    assert box.value == "b7407" and at.query_params["llamacpp"] == "b7407"
    tab = next(t for t in at.tabs if t.label == EXPORT_FORMATS_BY_NAME["llama.cpp"].label)
    text = "\n".join(c.value for c in tab.code)
    first = tab.code[0].value
    assert first.startswith("llama-server") and "--moe-cache-mib" not in first
    assert "for llama.cpp b7407" in text
    at.switch_page("pages/matrix.py").run()
    assert not at.exception and at.query_params["llamacpp"] == "b7407"
    assert next(s for s in at.sidebar.selectbox if s.label == "llama.cpp build").value == "b7407"
    at = open_app("export", llamacpp="b10500")                 # not a build the sidebar offers
    assert next(s for s in at.sidebar.selectbox if s.label == "llama.cpp build").value == "latest"
