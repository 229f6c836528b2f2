"""The shipped data: every file documented, sizes within bounds, labels honest, README current."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cope_core import parquet_io

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
sys.path.insert(0, str(ROOT / "scripts"))
from make_data_readme import render  # noqa: E402

MANIFEST = json.loads((DATA / "manifest.json").read_text())
FILES = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*")
               if p.is_file() and p.name not in ("README.md", "manifest.json"))


def test_every_file_is_in_the_manifest_and_the_readme():
    assert len(FILES) >= 20
    assert sorted(MANIFEST) == FILES
    readme = (DATA / "README.md").read_text()
    for rel in FILES:
        assert f"`{rel}`" in readme, rel
    for rel, e in MANIFEST.items():
        assert e["commands"] and e["provenance"] and e["what"], rel


def test_the_readme_is_rendered_from_the_current_manifest():
    assert (DATA / "README.md").read_text() == render(MANIFEST, DATA)


def test_sizes():
    total = sum((DATA / f).stat().st_size for f in FILES)
    assert total < 30 * 2**20
    for f in FILES:
        if f.endswith(".parquet") and parquet_io.detect_schema(DATA / f) == parquet_io.TRACE_SCHEMA:
            assert (DATA / f).stat().st_size <= 2 * 2**20, f


@pytest.mark.parametrize("model", ["deepseek-v2-lite", "qwen3-30b-a3b", "qwen3.5-35b-a3b",
                                   "mixtral-8x7b", "olmoe-1b-7b"])
def test_each_model_has_labelled_calibrated_traces_and_a_profile(model):
    params = json.loads((DATA / "synthetic-parameters.json").read_text())
    p = params["models"][model]
    for kind in ("trace", "calibration"):
        tr = parquet_io.read_trace(DATA / "examples" / f"{model}-{kind}.parquet")
        assert tr.model.name == model and tr.source == "synthetic"
        assert "SYNTHETIC" in tr.description
        assert f'"skew": {p["skew"]}' in tr.description
        assert f'"reuse": {params["reuse"]["value"]}' in tr.description
    profiles = [f for f in FILES if f.startswith(f"examples/{model}-") and "analytic" in f]
    assert len(profiles) == 1
    assert parquet_io.read_profile(DATA / profiles[0]).analytic


def test_the_measured_example_is_measured_and_the_collected_trace_collected():
    stem = DATA / "examples" / "deepseek-v2-lite-4l"
    prof = parquet_io.read_profile(f"{stem}-cpu-emulated-profile.parquet")
    meas = parquet_io.read_measurements(f"{stem}-cpu-emulated-measurements.parquet")
    assert not prof.analytic and prof.model.n_layers == 4
    assert sorted({t for t, _ in prof.operating_points()}) == [1, 2]
    assert sorted(meas.table["cpu_threads"].unique()) == [1, 2]
    assert meas.table["candidate"].nunique() == 13
    # made by the trusted measurement: 3 trials or more everywhere, a noise floor per cell, and
    # a verify run at the same cells whose inputs are the shipped files
    per = meas.table.groupby(["K", "cpu_threads", "candidate", "prompt"])["trial"].nunique()
    assert per.min() >= 3 and meas.complete
    cells = {(c["K"], c["cpu_threads"]) for c in meas.quality["cells"]}
    assert cells == set(zip(meas.table["K"], meas.table["cpu_threads"]))
    assert all(c["reference"]["noise_pct"] is not None for c in meas.quality["cells"])
    from cope_core.verify import read_verify
    rec = read_verify(f"{stem}-cpu-emulated-verify.json")
    assert {(c.K, c.cpu_threads) for c in rec.cells} == cells
    assert rec.inputs["profile"]["path"] == "deepseek-v2-lite-4l-cpu-emulated-profile.parquet"
    tr = parquet_io.read_trace(DATA / "collected" / "tiny-mixtral-trace.parquet")
    assert tr.source == "collected" and tr.has_predictions
    assert "RANDOM-WEIGHT" in tr.description
