"""The ``cope`` command line: every bad input ends in one error line and exit status 2, and the
good paths (matrix, synth -> profile -> predict, evaluate) print what docs/design.md#interfaces
promises."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tiny import put, raw, tiny_geometry, tiny_measurements, tiny_profile, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.estimate import predict
from cope_core.geometry import GIB, ModelGeometry, get_model
from cope_core.matrix import CANDIDATE_IDS
from cope_core.parquet_io import Measurements

NEW = {"fixed/ready_first", "mutable_per_layer/parallel", "mutable_cross_layer/parallel",
       "mutable_cross_layer/ready_first"}
JSON_KEYS = {"candidate", "residency", "execution", "tpot_us", "prompts"}
PROMPT_KEYS = {"prompt", "tpot_us", "hit_rate", "prefetches"}


# --- helpers ------------------------------------------------------------------------------------
def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> str:
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("cope: error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def edit_rows(path: Path, fn) -> Path:
    """Rewrite ``path`` after ``fn`` edited its rows (a list of dicts), keeping types and meta."""
    table, meta = raw(path)
    rows = table.to_pylist()
    new = fn(rows)
    rows = new if isinstance(new, list) else rows
    return put(path, pa.Table.from_pylist(rows, schema=table.schema), meta)


def edit_meta(path: Path, fn) -> Path:
    table, meta = raw(path)
    fn(meta)  # edits in place
    return put(path, table, meta)


def set_row(i, **values):
    def fn(rows):
        rows[i].update(values)
    return fn


def predict_args(f, *extra):
    return ["predict", "--trace", f["trace"], "--profile", f["profile"], "-K", "2", "--json",
            *extra]


# --- bad trace files ----------------------------------------------------------------------------
def _garbage(p):
    p.write_bytes(b"PAR1 this is not a parquet file at all \x00\x01\x02")


def _text(p):
    p.write_text("prompt,token,layer\n0,0,0\n")


def _truncated(p):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _truncated_tail(p):
    data = p.read_bytes()
    p.write_bytes(data[:-10])


def _empty_file(p):
    p.write_bytes(b"")


def _schema_version(p):
    edit_meta(p, lambda m: m.update(schema="cope.trace/2"))


def _no_metadata(p):
    table, _ = raw(p)
    put(p, table, None)


def _meta_not_json(p):
    table, _ = raw(p)
    pq.write_table(table.replace_schema_metadata({b"cope": b"{oops"}), p)


def _meta_no_model(p):
    edit_meta(p, lambda m: m.pop("model"))


def _meta_model_missing_key(p):
    edit_meta(p, lambda m: m["model"].pop("top_k"))


def _meta_model_extra_key(p):
    edit_meta(p, lambda m: m["model"].update(n_routers=1))


def _meta_no_source(p):
    edit_meta(p, lambda m: m.pop("source"))


def _routed_out_of_range(p):
    edit_rows(p, set_row(4, routed=[3, 6]))


def _routed_negative(p):
    edit_rows(p, set_row(0, routed=[-1, 2]))


def _routed_duplicated(p):
    edit_rows(p, set_row(7, routed=[4, 4]))


def _routed_too_short(p):
    edit_rows(p, set_row(7, routed=[4]))


def _predicted_out_of_range(p):
    edit_rows(p, set_row(3, predicted=[1, 17]))


def _predicted_duplicated(p):
    edit_rows(p, set_row(3, predicted=[2, 2]))


def _predicted_at_last_layer(p):
    edit_rows(p, set_row(2, predicted=[1]))


def _missing_middle_layer(p):
    edit_rows(p, lambda rows: rows.pop(4))


def _missing_last_row(p):
    edit_rows(p, lambda rows: rows.pop())


def _duplicated_layer_row(p):
    edit_rows(p, lambda rows: rows.insert(5, dict(rows[4])))


def _layer_out_of_range(p):
    edit_rows(p, set_row(2, layer=3))


def _duplicated_prompt(p):
    # prompt 7's rows renamed to prompt 3: token numbering restarts inside one prompt
    def fn(rows):
        for r in rows[9:]:
            r["prompt"] = 3
    edit_rows(p, fn)


def _empty_trace(p):
    table, meta = raw(p)
    put(p, table.slice(0, 0), meta)


def _missing_column(p):
    table, meta = raw(p)
    put(p, table.drop_columns(["routed"]), meta)


def _float_layer(p):
    table, meta = raw(p)
    i = table.column_names.index("layer")
    put(p, table.set_column(i, "layer", table.column("layer").cast(pa.float64())), meta)


def _null_context(p):
    table, meta = raw(p)
    ctx = table.column("context").to_pylist()
    ctx[3] = None
    i = table.column_names.index("context")
    put(p, table.set_column(i, "context", pa.array(ctx, pa.int32())), meta)


def _context_differs(p):
    edit_rows(p, set_row(1, context=99))


def _token_gap(p):
    def fn(rows):
        for r in rows[6:9]:
            r["token"] = 3
    edit_rows(p, fn)


def _profile_as_trace(p):
    parquet_io.write_profile(tiny_profile(), p, overwrite=True)


def _measurements_as_trace(p):
    parquet_io.write_measurements(tiny_measurements(), p, overwrite=True)


def _directory(p):
    p.unlink()
    p.mkdir()


def _missing(p):
    p.unlink()


TRACE_CASES = {
    "not parquet (garbage bytes)": (_garbage, "not a readable Parquet"),
    "not parquet (csv text)": (_text, "not a readable Parquet"),
    "truncated half": (_truncated, "not a readable Parquet"),
    "truncated tail": (_truncated_tail, "not a readable Parquet"),
    "empty file": (_empty_file, "Parquet"),
    "wrong schema version": (_schema_version, "cope.trace/2"),
    "no cope metadata": (_no_metadata, "cope"),
    "metadata not JSON": (_meta_not_json, "JSON"),
    "metadata without model": (_meta_no_model, "model"),
    "geometry missing key": (_meta_model_missing_key, "top_k"),
    "geometry extra key": (_meta_model_extra_key, "n_routers"),
    "metadata without source": (_meta_no_source, "source"),
    "routed id out of range": (_routed_out_of_range, "routed"),
    "routed id negative": (_routed_negative, "routed"),
    "routed ids duplicated": (_routed_duplicated, "routed"),
    "routed wrong length": (_routed_too_short, "routed"),
    "predicted id out of range": (_predicted_out_of_range, "predicted"),
    "predicted ids duplicated": (_predicted_duplicated, "predicted"),
    "predicted at last layer": (_predicted_at_last_layer, "predicted"),
    "missing middle layer row": (_missing_middle_layer, "layer"),
    "missing last layer row": (_missing_last_row, "layer"),
    "duplicated layer row": (_duplicated_layer_row, "layer"),
    "layer out of range": (_layer_out_of_range, "layer"),
    "duplicated prompt": (_duplicated_prompt, "token"),
    "empty trace": (_empty_trace, "no rows"),
    "missing column": (_missing_column, "routed"),
    "float layer column": (_float_layer, "layer"),
    "null context": (_null_context, "context"),
    "context differs between layers": (_context_differs, "context"),
    "token gap": (_token_gap, "token"),
    "profile passed as trace": (_profile_as_trace, "cope.profile/1"),
    "measurements passed as trace": (_measurements_as_trace, "cope.measurements/1"),
    "a directory": (_directory, "folder holds no .parquet files"),
    "missing file": (_missing, "not found"),
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_bad_trace(capsys, files, case):
    corrupt, needle = TRACE_CASES[case]
    corrupt(files["trace"])
    code, out, err = run(capsys, *predict_args(files))
    assert_one_line_error(code, out, err, str(files["trace"]), needle)
    assert out == ""


@pytest.mark.parametrize("case", ["truncated half", "routed ids duplicated", "empty trace",
                                  "profile passed as trace", "no cope metadata"])
def test_bad_calibration(capsys, files, case):
    cal = files["dir"] / "cal.parquet"
    parquet_io.write_trace(tiny_trace(), cal)
    corrupt, needle = TRACE_CASES[case]
    corrupt(cal)
    code, out, err = run(capsys, *predict_args(files, "--calibration", cal))
    assert_one_line_error(code, out, err, str(cal), needle)


@pytest.mark.parametrize("case", ["not parquet (garbage bytes)", "missing middle layer row",
                                  "profile passed as trace"])
def test_bad_trace_for_analytic_profile(capsys, files, case):
    corrupt, needle = TRACE_CASES[case]
    corrupt(files["trace"])
    dest = files["dir"] / "new.parquet"
    code, out, err = run(capsys, "profile", "--analytic", "--gpu", "rtx4090",
                         "--trace", files["trace"], "-o", dest)
    assert_one_line_error(code, out, err, str(files["trace"]), needle)
    assert not dest.exists()


def test_calibration_with_other_geometry(capsys, files):
    g = tiny_geometry()
    other = ModelGeometry(**(g.to_dict() | {"n_experts": 7}))
    tr = tiny_trace()
    cal = files["dir"] / "cal.parquet"
    parquet_io.write_trace(type(tr)(model=other, prompt_ids=tr.prompt_ids,
                                    prompt_start=tr.prompt_start, context=tr.context,
                                    routed=tr.routed, predicted=tr.predicted), cal)
    code, out, err = run(capsys, *predict_args(files, "--calibration", cal))
    assert_one_line_error(code, out, err, str(cal), "n_experts")


# --- bad profile files --------------------------------------------------------------------------
def _profile_rows(fn):
    return lambda p: edit_rows(p, fn)


def _cost(value, col="median_us"):
    def fn(rows):
        i = next(i for i, r in enumerate(rows) if r["kind"] == "schedule")
        rows[i][col] = value
    return _profile_rows(fn)


def _drop_schedule(name, h):
    def fn(rows):
        i = next(i for i, r in enumerate(rows)
                 if r["kind"] == "schedule" and r["name"] == name and r["hits"] == h)
        rows.pop(i)
    return _profile_rows(fn)


def _drop_kind(kind):
    return _profile_rows(lambda rows: [r for r in rows if r["kind"] != kind])


def _dup_row(rows):
    rows.append(dict(rows[3], median_us=123.0))


def _trace_as_profile(p):
    parquet_io.write_trace(tiny_trace(), p, overwrite=True)


def _profile_schema_version(p):
    edit_meta(p, lambda m: m.update(schema="cope.profile/9"))


def _profile_no_platform(p):
    edit_meta(p, lambda m: m.pop("platform"))


PROFILE_CASES = {
    "not parquet (garbage bytes)": (_garbage, "not a readable Parquet"),
    "truncated": (_truncated, "not a readable Parquet"),
    "wrong schema version": (_profile_schema_version, "cope.profile/9"),
    "no cope metadata": (_no_metadata, "cope"),
    "metadata without model": (_meta_no_model, "model"),
    "metadata without platform": (_profile_no_platform, "platform"),
    "NaN median": (_cost(float("nan")), "median_us"),
    "negative median": (_cost(-1.0), "median_us"),
    "infinite median": (_cost(float("inf")), "median_us"),
    "negative p25": (_cost(-1.0, "p25_us"), "p25_us"),
    "missing parallel schedule row h=0": (_drop_schedule("parallel", 0), "missing"),
    "missing cost_selected schedule row h=1": (_drop_schedule("cost_selected", 1), "missing"),
    "missing ready_first schedule row h=2": (_drop_schedule("ready_first", 2), "missing"),
    "no shared rows": (_drop_kind("shared"), "shared"),
    "no layer rows": (_drop_kind("layer"), "missing"),
    "no prefetch rows": (_drop_kind("prefetch"), "missing"),
    "no atomic rows": (_drop_kind("atomic"), "missing"),
    "duplicated key": (_profile_rows(_dup_row), "repeats"),
    "unknown kind": (_profile_rows(set_row(0, kind="magic")), "magic"),
    "trace passed as profile": (_trace_as_profile, "cope.trace/1"),
    "empty profile": (_empty_trace, "no rows"),
    "missing file": (_missing, "not found"),
}


@pytest.mark.parametrize("case", list(PROFILE_CASES))
def test_bad_profile(capsys, files, case):
    corrupt, needle = PROFILE_CASES[case]
    corrupt(files["profile"])
    code, out, err = run(capsys, *predict_args(files))
    assert_one_line_error(code, out, err, str(files["profile"]), needle)
    assert out == ""


def test_profile_for_another_expert_shape(capsys, files):
    g = ModelGeometry(**(tiny_geometry().to_dict() | {"hidden": 128}))
    parquet_io.write_profile(tiny_profile(geometry=g), files["profile"], overwrite=True)
    code, out, err = run(capsys, *predict_args(files))
    assert_one_line_error(code, out, err, str(files["profile"]), "hidden")


def test_profile_for_another_top_k(capsys, files):
    g = ModelGeometry(**(tiny_geometry().to_dict() | {"top_k": 3}))
    parquet_io.write_profile(tiny_profile(geometry=g), files["profile"], overwrite=True)
    code, out, err = run(capsys, *predict_args(files))
    assert_one_line_error(code, out, err, str(files["profile"]), "top_k")


def test_operating_point_not_in_profile(capsys, files):
    code, out, err = run(capsys, *predict_args(files, "--threads", "3"))
    assert_one_line_error(code, out, err, str(files["profile"]), "cpu_threads")


def test_hrm_with_unusable_profile_spec(capsys, files):
    # the tiny profile's platform.spec is not a PlatformSpec: HRM must say so, not crash
    code, out, err = run(capsys, *predict_args(files, "--estimator", "hrm"))
    assert_one_line_error(code, out, err, str(files["profile"]))


# --- bad arguments ------------------------------------------------------------------------------
@pytest.mark.parametrize("k", ["7", "-1", "0,2,9", "100"])
def test_k_out_of_range(capsys, files, k):
    code, out, err = run(capsys, "predict", "--trace", files["trace"], "--profile",
                         files["profile"], "-K", k)
    assert_one_line_error(code, out, err, "experts_per_layer", "0..6")


def test_unknown_candidate(capsys, files):
    code, out, err = run(capsys, *predict_args(files, "--candidates", "fixed/parallel,fixed/magic"))
    assert_one_line_error(code, out, err, "fixed/magic")


def test_bad_spec_file(capsys, files):
    spec = files["dir"] / "spec.json"
    spec.write_text("{not json")
    code, out, err = run(capsys, *predict_args(files, "--estimator", "hrm", "--spec", spec))
    assert_one_line_error(code, out, err, str(spec))


def test_unparseable_k_is_a_usage_error(capsys, files):
    # status 2 and no traceback, whichever way the usage error is reported
    try:
        code = main(["predict", "--trace", str(files["trace"]), "--profile",
                     str(files["profile"]), "-K", "two"])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    assert "error:" in err.splitlines()[-1] and "'two'" in err


@pytest.mark.parametrize("k", ["1.5", "two"])
def test_unparseable_k_one_line(capsys, files, k):
    code, out, err = run(capsys, "predict", "--trace", files["trace"], "--profile",
                         files["profile"], "-K", k)
    assert_one_line_error(code, out, err, k)


def test_vram_gib_nan(capsys, files):
    code, out, err = run(capsys, "predict", "--trace", files["trace"], "--profile",
                         files["profile"], "--vram-gib", "nan")
    assert_one_line_error(code, out, err, "nan")


@pytest.mark.parametrize("gib", ["inf", "1e308"])
def test_vram_gib_infinite(capsys, files, gib):
    code, out, err = run(capsys, "predict", "--trace", files["trace"], "--profile",
                         files["profile"], "--vram-gib", gib, "--json")
    if code == 0:
        assert {d["experts_per_layer"] for d in json.loads(out)} == {6}
    else:
        assert_one_line_error(code, out, err)


@pytest.mark.parametrize("args", [["--gib", "nan"], ["--experts-per-layer", "3",
                                                      "--workspace-gib", "nan"]])
def test_vram_command_nan(capsys, args):
    code, out, err = run(capsys, "vram", "--model", "olmoe-1b-7b", *args)
    assert_one_line_error(code, out, err)


@pytest.mark.parametrize("cmd", [("predict", "--vram-gib"), ("vram", "--gib")])
@pytest.mark.parametrize("gib", ["-5", "0"])
def test_a_budget_below_k0s_need_is_a_one_line_error(capsys, files, cmd, gib):
    g = parquet_io.read_trace(files["trace"]).model if cmd[0] == "predict" else \
        get_model("qwen3-30b-a3b")
    args = (["predict", "--trace", files["trace"], "--profile", files["profile"]]
            if cmd[0] == "predict" else ["vram", "--model", "qwen3-30b-a3b"])
    code, out, err = run(capsys, *args, cmd[1], gib)
    assert_one_line_error(code, out, err)
    need = math.ceil(g.vram_for_experts_per_layer(0) / GIB * 100) / 100
    assert f"{gib} GiB is below the {need:.2f} GiB that K = 0" in err


# --- bad measurements for evaluate ------------------------------------------------------------
def _meas_rows(fn):
    return lambda p: edit_rows(p, fn)


MEAS_CASES = {
    "garbage": (_garbage, "not a readable Parquet"),
    "trace passed as measurements": (_trace_as_profile, "cope.trace/1"),
    "NaN tpot": (_meas_rows(set_row(0, tpot_us=float("nan"))), "tpot_us"),
    "negative tpot": (_meas_rows(set_row(0, tpot_us=-5.0)), "tpot_us"),
    "unknown candidate": (_meas_rows(set_row(1, candidate="fixed/teleport")), "teleport"),
    "K out of range": (_meas_rows(set_row(2, K=9)), "K"),
}


@pytest.mark.parametrize("case", list(MEAS_CASES))
def test_bad_measurements(capsys, files, case):
    corrupt, needle = MEAS_CASES[case]
    corrupt(files["measurements"])
    code, out, err = run(capsys, "evaluate", "--trace", files["trace"], "--profile",
                         files["profile"], "--measurements", files["measurements"], "--json")
    assert_one_line_error(code, out, err, str(files["measurements"]), needle)


def test_measurements_of_another_model(capsys, files):
    g = ModelGeometry(**(tiny_geometry().to_dict() | {"n_layers": 4}))
    parquet_io.write_measurements(tiny_measurements(g), files["measurements"], overwrite=True)
    code, out, err = run(capsys, "evaluate", "--trace", files["trace"], "--profile",
                         files["profile"], "--measurements", files["measurements"])
    assert_one_line_error(code, out, err, str(files["measurements"]), "geometry")


def test_evaluate_with_unusable_profile_spec_needs_spec(capsys, files):
    # the tiny profile (tests/tiny.py) carries a platform.spec that is not a PlatformSpec: evaluate
    # refuses it (naming the profile) unless --spec replaces it
    args = ["evaluate", "--trace", files["trace"], "--profile", files["profile"],
            "--measurements", files["measurements"], "--json"]
    code, out, err = run(capsys, *args)
    assert_one_line_error(code, out, err, str(files["profile"]), "spec")
    code, out, err = run(capsys, *args, "--spec", "h100")
    assert code == 0, err
    assert set(json.loads(out)) == {"cope", "atomic", "hrm", "measurement_quality"}


def test_evaluate_measurements_at_another_gpu_share(capsys, files):
    # the same thread count at two GPU shares with different costs: measurements taken at 50 %
    # are scored against the 50 % prediction, and a share the profile lacks is refused
    prof = tiny_profile(lambda row: 2.0 if row["gpu_share"] == 50.0 else 1.0,
                        operating_points=((8, 100.0), (8, 50.0)))
    parquet_io.write_profile(prof, files["profile"], overwrite=True)
    tr = parquet_io.read_trace(files["trace"])
    df = predict(tr, parquet_io.read_profile(files["profile"]), 2, cpu_threads=8, gpu_share=50.0)
    assert df.attrs["gpu_share"] == 50.0
    m = tiny_measurements()
    m.table["gpu_share"] = np.float32(50.0)
    parquet_io.write_measurements(m, files["measurements"], overwrite=True)
    args = ["evaluate", "--trace", files["trace"], "--profile", files["profile"],
            "--measurements", files["measurements"], "--spec", "h100", "--json"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    got = json.loads(out)["cope"]["mape_pct"]
    pred = {c: v for c, v in zip(df["candidate"], df["prompt_tpot_us"])}
    meas = m.table.groupby(["candidate", "prompt"])["tpot_us"].mean()
    ids = list(tr.prompt_ids)
    errs = [abs(pred[c][ids.index(p)] - v) / v for (c, p), v in meas.items()]
    assert got == pytest.approx(100 * np.mean(errs))
    # --gpu-share picks the measurements of one share, and names the ones there are
    code, out, err = run(capsys, *args, "--gpu-share", "50")
    assert code == 0 and json.loads(out)["cope"]["mape_pct"] == pytest.approx(got)
    code, out, err = run(capsys, *args, "--gpu-share", "100")
    assert_one_line_error(code, out, err, str(files["measurements"]), "gpu_share")
    assert "[50.0]" in err
    m.table["gpu_share"] = np.float32(75.0)
    parquet_io.write_measurements(m, files["measurements"], overwrite=True)
    code, out, err = run(capsys, *args)
    assert_one_line_error(code, out, err, str(files["profile"]), "gpu_share")


# --- a real process -----------------------------------------------------------------------------
def _cope_exe() -> list[str]:
    exe = shutil.which("cope") or str(Path(sys.executable).with_name("cope"))
    assert os.path.exists(exe), "the cope console script is not installed"
    return [exe]


def test_console_script_bad_input_exits_2(files):
    _truncated(files["trace"])
    proc = subprocess.run(_cope_exe() + ["predict", "--trace", str(files["trace"]), "--profile",
                                         str(files["profile"]), "-K", "2", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cope: error:"), proc.stderr
    assert str(files["trace"]) in lines[0]


# --- matrix -------------------------------------------------------------------------------------
def test_matrix_json(capsys):
    code, out, err = run(capsys, "matrix", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    cands = data["candidates"]
    assert [c["id"] for c in cands] == list(CANDIDATE_IDS)
    assert len(cands) == 13
    assert {c["id"] for c in cands if c["new"]} == NEW
    assert sum(c["in_paper"] for c in cands) == 9
    by_id = {c["id"]: c for c in cands}
    assert by_id["layer_partition"]["residency"] is None
    assert by_id["mutable_cross_layer/ready_first"] == {
        "id": "mutable_cross_layer/ready_first", "residency": "mutable_cross_layer",
        "execution": "ready_first", "prior_systems": [], "new": True, "in_paper": False}
    assert by_id["mutable_per_layer/cost_selected"]["prior_systems"] == ["HybriMoE", "DALI"]
    assert data["baseline"]["id"] == "layer_partition"


def test_matrix_text(capsys):
    code, out, err = run(capsys, "matrix")
    assert code == 0
    for cid in CANDIDATE_IDS:
        assert cid in out
    assert "Fiddler" in out and "MoE-Infinity" in out


# --- synth -> profile -> predict ----------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """mixtral-8x7b cut to 4 layers (E=8, top-2): trace, calibration and rtx4090 profile."""
    d = tmp_path_factory.mktemp("pipeline")
    t, c, p = d / "t.parquet", d / "cal.parquet", d / "p.parquet"
    common = ["--model", "mixtral-8x7b", "--layers", "4", "--prompts", "3", "--tokens", "6"]
    assert main(["synth", *common, "--seed", "1", "-o", str(t)]) == 0
    assert main(["synth", *common, "--seed", "2", "-o", str(c)]) == 0
    assert main(["profile", "--analytic", "--gpu", "rtx4090", "--trace", str(t), "-o", str(p)]) == 0
    return {"trace": t, "cal": c, "profile": p, "dir": d}


def test_synth_and_profile_outputs(pipeline):
    tr = parquet_io.read_trace(pipeline["trace"])
    assert tr.source == "synthetic" and tr.model.n_layers == 4 and tr.model.name == "mixtral-8x7b"
    assert tr.n_prompts == 3 and tr.tokens_per_prompt.tolist() == [6, 6, 6]
    prof = parquet_io.read_profile(pipeline["profile"])
    assert prof.analytic is True
    assert parquet_io.read_metadata(pipeline["profile"])["analytic"] is True
    assert prof.model.same_shape(tr.model)
    assert prof.platform["gpu"] == "rtx4090" and prof.platform["spec"]["gpu_bandwidth"] == 1008e9


def _predict_json(capsys, pipeline, *extra):
    code, out, err = run(capsys, "predict", "--trace", pipeline["trace"], "--profile",
                         pipeline["profile"], "--calibration", pipeline["cal"], *extra, "--json")
    assert code == 0, err
    return json.loads(out), err


def test_predict_json_matches_design_and_library(capsys, pipeline):
    data, err = _predict_json(capsys, pipeline, "-K", "3")
    assert err == ""  # calibration given: no warning
    assert isinstance(data, list)
    cache = [d for d in data if d.get("runtime") == "llama.cpp"]   # llama.cpp's own cache
    assert {d["candidate"] for d in cache} <= {"llamacpp_cache/lru", "llamacpp_cache/classlru"}
    data = [d for d in data if d not in cache]
    assert len(data) == 13
    assert [d["candidate"] for d in data] == list(CANDIDATE_IDS)
    tr = parquet_io.read_trace(pipeline["trace"])
    df = predict(tr, parquet_io.read_profile(pipeline["profile"]), 3,
                 calibration=parquet_io.read_trace(pipeline["cal"])).set_index("candidate")
    for d in data:
        assert JSON_KEYS <= set(d)
        cid = d["candidate"]
        if cid == "layer_partition":
            assert d["residency"] is None and d["execution"] is None
        else:
            assert f"{d['residency']}/{d['execution']}" == cid
        assert d["tpot_us"] == df.loc[cid, "tpot_us"]
        assert len(d["prompts"]) == tr.n_prompts
        assert [p["prompt"] for p in d["prompts"]] == tr.prompt_ids.tolist()
        for p, t, h, n in zip(d["prompts"], df.loc[cid, "prompt_tpot_us"],
                              df.loc[cid, "prompt_hit_rate"], df.loc[cid, "prompt_prefetches"]):
            assert set(p) == PROMPT_KEYS
            assert p["tpot_us"] == t and p["hit_rate"] == h and p["prefetches"] == n
            assert isinstance(p["prefetches"], int) and 0 <= p["hit_rate"] <= 1
        assert d["tpot_us"] == pytest.approx(np.mean([p["tpot_us"] for p in d["prompts"]]),
                                             rel=1e-12)


def test_predict_k_list_and_all(capsys, pipeline):
    data, _ = _predict_json(capsys, pipeline, "-K", "0,2,8")
    assert len(data) == 3 * 13
    assert sorted({d["experts_per_layer"] for d in data}) == [0, 2, 8]
    data, _ = _predict_json(capsys, pipeline, "--experts-per-layer", "all")
    E = parquet_io.read_trace(pipeline["trace"]).model.n_experts
    assert sorted({d["experts_per_layer"] for d in data}) == list(range(E + 1))
    assert len(data) == (E + 1) * 13
    full = [d for d in data if d["experts_per_layer"] == E and d["candidate"] != "layer_partition"]
    assert all(p["hit_rate"] == 1.0 for d in full for p in d["prompts"])


@pytest.mark.parametrize("gib", [6.0, 8.0, 12.5, 1000.0])
def test_predict_vram_gib(capsys, pipeline, gib):
    g = parquet_io.read_trace(pipeline["trace"]).model
    want = g.experts_per_layer_for_vram(gib * GIB)
    data, _ = _predict_json(capsys, pipeline, "--vram-gib", str(gib))
    assert {d["experts_per_layer"] for d in data} == {want}
    assert len([d for d in data if "runtime" not in d]) == 13


def test_vram_gib_picks_interior_k(pipeline):
    # the budgets above must exercise a K strictly between 0 and E, not only the clamps
    g = parquet_io.read_trace(pipeline["trace"]).model
    ks = {g.experts_per_layer_for_vram(x * GIB) for x in (6.0, 8.0, 12.5)}
    assert any(0 < k < g.n_experts for k in ks)


def test_predict_table_names_winner_and_runner_up(capsys, pipeline):
    code, out, err = run(capsys, "predict", "--trace", pipeline["trace"], "--profile",
                         pipeline["profile"], "--calibration", pipeline["cal"], "-K", "3")
    assert code == 0, err
    df = predict(parquet_io.read_trace(pipeline["trace"]),
                 parquet_io.read_profile(pipeline["profile"]), 3,
                 calibration=parquet_io.read_trace(pipeline["cal"]))
    ranked = df.sort_values("rank")
    w = ranked.iloc[0]
    # the runner-up is the fastest other *policy*: rows equivalent to the winner are passed over
    ru = next(r for _, r in ranked.iloc[1:].iterrows()
              if (r.equivalent_to or r.candidate) != w.candidate)
    margin = (ru.tpot_us - w.tpot_us) / w.tpot_us * 100
    last = [line for line in out.splitlines() if line.startswith("winner:")]
    assert len(last) == 1
    # a clear winner (faster than every rival in >= 97.5 % of the paired draws) is named alone
    v = df.attrs["uncertainty"]["per_k"][3]["verdict"]
    assert not v["tied"] and v["leader"] == w.candidate
    assert last[0] == (f"winner: {w.candidate} {w.tpot_us / 1e3:.3f} ms/token "
                       f"[{w.tpot_lo_us / 1e3:.3f}, {w.tpot_hi_us / 1e3:.3f}] · "
                       f"{1e6 / w.tpot_us:.1f} tokens/s [{1e6 / w.tpot_hi_us:.1f}, "
                       f"{1e6 / w.tpot_lo_us:.1f}]; {w.candidate} is "
                       f"fastest in {100 * w.win_probability:.0f} % of the paired draws, faster "
                       f"than {v['rival']} in {100 * v['beats_rival']:.0f} %")
    runner = [line for line in out.splitlines() if line.startswith("runner-up:")]
    assert runner == [f"runner-up: {ru.candidate} {ru.tpot_us / 1e3:.3f} ms/token · "
                      f"{1e6 / ru.tpot_us:.1f} tokens/s (+{margin:.1f}%)"]
    assert "ANALYTIC" in out
    for cid in CANDIDATE_IDS:
        assert cid in out


def test_predict_sweep_table(capsys, pipeline):
    code, out, err = run(capsys, "predict", "--trace", pipeline["trace"], "--profile",
                         pipeline["profile"], "--calibration", pipeline["cal"], "-K", "1,5")
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["5"])]
    assert [r[0] for r in rows] == ["1", "5"]
    df = predict(parquet_io.read_trace(pipeline["trace"]),
                 parquet_io.read_profile(pipeline["profile"]), [1, 5],
                 calibration=parquet_io.read_trace(pipeline["cal"]))
    for r in rows:
        sub = df[df["experts_per_layer"] == int(r[0])].sort_values("rank")
        w = sub.iloc[0]["candidate"]
        ru = next(c for c, e in zip(sub["candidate"][1:], sub["equivalent_to"][1:])
                  if (e or c) != w)
        assert r[1] == w and r[4] == ru
        assert float(r[3]) == pytest.approx(1e3 / float(r[2]), rel=2e-3)     # tok/s beside ms


def test_warning_without_calibration(capsys, pipeline):
    code, out, err = run(capsys, "predict", "--trace", pipeline["trace"], "--profile",
                         pipeline["profile"], "-K", "2", "--json")
    assert code == 0
    json.loads(out)  # the warning goes to stderr, not into the JSON
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("cope: warning:") and "optimistic" in lines[0]


def test_estimators_from_cli_match_library(capsys, pipeline):
    tr = parquet_io.read_trace(pipeline["trace"])
    prof = parquet_io.read_profile(pipeline["profile"])
    cal = parquet_io.read_trace(pipeline["cal"])
    for est in ("atomic", "hrm"):
        data, _ = _predict_json(capsys, pipeline, "-K", "4", "--estimator", est)
        df = predict(tr, prof, 4, calibration=cal, estimator=est).set_index("candidate")
        assert {d["candidate"]: d["tpot_us"] for d in data} == df["tpot_us"].to_dict()


def test_output_refused_then_forced(capsys, pipeline, tmp_path):
    dest = tmp_path / "out.parquet"
    dest.write_bytes(b"precious")
    args = ["synth", "--model", "olmoe-1b-7b", "--layers", "2", "--prompts", "1", "--tokens",
            "2", "--seed", "0", "-o", dest]
    code, out, err = run(capsys, *args)
    assert_one_line_error(code, out, err, str(dest), "--force")
    assert dest.read_bytes() == b"precious"
    code, out, err = run(capsys, *args, "--force")
    assert code == 0, err
    assert parquet_io.read_trace(dest).model.name == "olmoe-1b-7b"

    prof = tmp_path / "prof.parquet"
    prof.write_bytes(b"precious")
    pargs = ["profile", "--analytic", "--gpu", "h100", "--model", "olmoe-1b-7b", "--threads", "4",
             "-o", prof]
    code, out, err = run(capsys, *pargs)
    assert_one_line_error(code, out, err, str(prof), "--force")
    assert prof.read_bytes() == b"precious"
    code, out, err = run(capsys, *pargs, "--force")
    assert code == 0, err
    assert parquet_io.read_profile(prof).operating_points() == [(4, share) for share in
                                                                 (20.0, 50.0, 80.0, 100.0)]


def test_profile_unknown_platform_and_model(capsys, tmp_path):
    code, out, err = run(capsys, "profile", "--analytic", "--gpu", "voodoo5",
                         "--model", "olmoe-1b-7b", "-o", tmp_path / "p.parquet")
    assert_one_line_error(code, out, err, "voodoo5")
    code, out, err = run(capsys, "profile", "--analytic", "--gpu", "h100", "--model", "gpt-5",
                         "-o", tmp_path / "p.parquet")
    assert_one_line_error(code, out, err, "gpt-5")
    assert not (tmp_path / "p.parquet").exists()


def test_operating_point_choice(capsys, files):
    # tiny profile: (8 threads, 100 %) and (4 threads, 50 %); every cost scales with 8 / threads
    code, out, _ = run(capsys, *predict_args(files, "--fill-by-id"))
    whole = {d["candidate"]: d["tpot_us"] for d in json.loads(out)}
    code4, out4, _ = run(capsys, *predict_args(files, "--fill-by-id", "--threads", "4"))
    four = {d["candidate"]: d["tpot_us"] for d in json.loads(out4)}
    assert code == code4 == 0
    assert four == {c: 2 * v for c, v in whole.items()}
    code, out, _ = run(capsys, "predict", "--trace", files["trace"], "--profile",
                       files["profile"], "-K", "2", "--fill-by-id", "--threads", "4")
    assert "cpu_threads=4 gpu_share=50" in out.splitlines()[0]


def test_exact_tie_goes_to_earlier_candidate(capsys, files):
    # every cost 5: fixed/* and layer_partition all predict 5 + 3 * 5 per token
    parquet_io.write_profile(tiny_profile(lambda row: 5.0), files["profile"], overwrite=True)
    code, out, err = run(capsys, *predict_args(files, "--fill-by-id"))
    assert code == 0, err
    data = {d["candidate"]: d for d in json.loads(out)}
    assert data["layer_partition"]["tpot_us"] == data["fixed/parallel"]["tpot_us"] == 20.0
    assert data["layer_partition"]["rank"] == 1 and data["fixed/parallel"]["rank"] == 2


def test_exact_tie_ignores_candidates_order(capsys, files):
    parquet_io.write_profile(tiny_profile(lambda row: 5.0), files["profile"], overwrite=True)
    subset = "fixed/ready_first,layer_partition,fixed/parallel"
    code, out, err = run(capsys, *predict_args(files, "--fill-by-id", "--candidates", subset))
    assert code == 0, err
    data = json.loads(out)
    assert [d["candidate"] for d in data] == ["layer_partition", "fixed/parallel",
                                              "fixed/ready_first"]
    assert {d["candidate"]: d["rank"] for d in data}["layer_partition"] == 1
    code, out, err = run(capsys, "predict", "--trace", files["trace"], "--profile",
                         files["profile"], "-K", "2", "--fill-by-id", "--candidates", subset)
    # equal costs: a tie of the paired draws, led by the canonical first (exact ties in a draw)
    assert "winner: tied: layer_partition or " in out


# --- evaluate -----------------------------------------------------------------------------------
def _write_measurements(pipeline, path, K, transform, trials=2):
    """Measured TPOT = transform(prompt index, predicted per-prompt TPOT) for every candidate."""
    tr = parquet_io.read_trace(pipeline["trace"])
    prof = parquet_io.read_profile(pipeline["profile"])
    cal = parquet_io.read_trace(pipeline["cal"])
    df = predict(tr, prof, K, calibration=cal)
    threads, share = df.attrs["cpu_threads"], df.attrs["gpu_share"]
    rows = []
    for cid, values in zip(df["candidate"], df["prompt_tpot_us"]):
        for i, (pid, v) in enumerate(zip(tr.prompt_ids, values)):
            for trial in range(trials):
                rows.append({"candidate": cid, "prompt": int(pid), "trial": trial,
                             "tpot_us": float(transform(i, v)), "K": K,
                             "cpu_threads": threads, "gpu_share": share})
    m = Measurements(table=pd.DataFrame(rows), model=tr.model, platform={"gpu": "test"})
    parquet_io.write_measurements(m, path)
    return df


def _evaluate(capsys, pipeline, meas, *extra):
    code, out, err = run(capsys, "evaluate", "--trace", pipeline["trace"], "--profile",
                         pipeline["profile"], "--calibration", pipeline["cal"], "--measurements",
                         meas, *extra)
    assert code == 0, err
    return out, err


def test_evaluate_exact_mape_with_per_prompt_factors(capsys, pipeline, tmp_path):
    # prompt 0 measured 2x the prediction (error 1/2), prompt 1 half of it (error 1),
    # prompt 2 four times (error 3/4): MAPE = (50 + 100 + 75) / 3 = 75 %
    factors = [2.0, 0.5, 4.0]
    meas = tmp_path / "m.parquet"
    _write_measurements(pipeline, meas, 3, lambda i, v: v * factors[i])
    out, _ = _evaluate(capsys, pipeline, meas, "--json")
    res = json.loads(out)
    assert set(res) == {"cope", "atomic", "hrm", "measurement_quality"}
    cope = res["cope"]
    assert cope["mape_pct"] == pytest.approx(75.0, rel=1e-12)
    assert cope["spearman"] == pytest.approx(1.0, abs=1e-12)
    assert cope["top1"] == [3, 3]
    assert cope["top3"] == [9, 9]
    assert cope["pairs"] == 3 * 13
    for est in ("atomic", "hrm"):
        r = res[est]
        assert set(r) == {"mape_pct", "spearman", "top1", "top3", "pairs", "top1_within_noise",
                          "top1_cells", "regret_pct", "interval_coverage"}
        assert r["pairs"] == 39 and r["top1"][1] == 3 and r["top3"][1] == 9
        assert np.isfinite(r["mape_pct"]) and -1 <= r["spearman"] <= 1


def test_evaluate_uniform_factor(capsys, pipeline, tmp_path):
    # every measurement = prediction / 0.9: |p - p/0.9| / (p/0.9) = 0.1 -> MAPE 10 %
    meas = tmp_path / "m.parquet"
    _write_measurements(pipeline, meas, 2, lambda i, v: v / 0.9, trials=1)
    res = json.loads(_evaluate(capsys, pipeline, meas, "--json")[0])
    assert res["cope"]["mape_pct"] == pytest.approx(10.0, rel=1e-9)
    assert res["cope"]["top1"] == [3, 3]


def test_evaluate_monotone_transform(capsys, pipeline, tmp_path):
    # a nonlinear but increasing map keeps every order: rho = 1, top-1 and top-3 all right
    meas = tmp_path / "m.parquet"
    df = _write_measurements(pipeline, meas, 5, lambda i, v: v ** 2 / 1e3 + 7.0 * (i + 1))
    res = json.loads(_evaluate(capsys, pipeline, meas, "--json")[0])
    assert res["cope"]["spearman"] == pytest.approx(1.0, abs=1e-12)
    assert res["cope"]["top1"] == [3, 3] and res["cope"]["top3"] == [9, 9]
    pred = np.concatenate(list(df["prompt_tpot_us"]))
    measured = np.concatenate([v ** 2 / 1e3 + 7.0 * (np.arange(3) + 1)
                               for v in df["prompt_tpot_us"]])
    expect = np.mean(np.abs(pred - measured) / measured) * 100
    assert res["cope"]["mape_pct"] == pytest.approx(expect, rel=1e-12)


def test_evaluate_text_table(capsys, pipeline, tmp_path):
    meas = tmp_path / "m.parquet"
    _write_measurements(pipeline, meas, 3, lambda i, v: v * 2.0, trials=1)
    out, _ = _evaluate(capsys, pipeline, meas)
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["estimator", "MAPE", "%"]
    cope_line = next(line for line in lines if line.startswith("cope"))
    assert cope_line.split()[1] == "50.00"
    assert any(line.startswith("atomic") for line in lines)
    assert any(line.startswith("hrm") for line in lines)


def test_evaluate_json_writes_null_for_an_undefined_spearman(capsys, files):
    # one measured candidate per prompt: no order to correlate, Spearman is undefined. The
    # output must still be strict JSON (null, not NaN), which json.loads with a strict
    # parse_constant checks.
    m = tiny_measurements()
    m = dataclasses.replace(m, table=m.table[m.table["candidate"] == "fixed/parallel"])
    parquet_io.write_measurements(m, files["measurements"], overwrite=True)
    code, out, err = run(capsys, "evaluate", "--trace", files["trace"], "--profile",
                         files["profile"], "--measurements", files["measurements"], "--spec",
                         "h100", "--json")
    assert code == 0, err
    assert "NaN" not in out

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    res = json.loads(out, parse_constant=refuse)
    assert res["cope"]["spearman"] is None
    assert res["cope"]["top1"] == [2, 2]
