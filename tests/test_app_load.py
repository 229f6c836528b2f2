"""Less work per rerun and bounded inputs for many sessions on one server (docs/app.md#many-
sessions-on-one-server): the budget chart assembled from a kept base equals the one drawn
whole, the kept base is never modified, the Landscape's one-K rows come from its sweep, upload
limits refuse with one line, and the rerun log times each run."""
from __future__ import annotations

import copy
import json
import threading

import numpy as np
import plotly.io as pio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tiny import tiny_profile, tiny_trace

from cope_core import parquet_io, predict
from cope_core.app import figures, rerun_log, sources, whatif
from cope_core.errors import CopeInputError


@pytest.fixture(scope="module")
def sweep():
    tr = tiny_trace()
    return tr, predict(tr, tiny_profile(), range(7), calibration=tr, draws=50)


def test_a_marked_base_is_the_figure_drawn_whole(sweep):
    tr, sw = sweep
    regions = whatif.winner_regions(sw, tr.model)
    unsure = whatif.uncertain_ranges(sw, tr.model)
    whole = figures.tpot_vs_budget(sw, tr.model, regions, current_gib=0.4, current_k=3,
                                   title="t", uncertain=unsure)
    base = figures.budget_base(sw, tr.model, regions, title="t", uncertain=unsure).to_dict()
    kept = copy.deepcopy(base)
    marked = figures.mark_budget(base, 0.4, 3)
    # what the browser receives is the same, and the kept base is untouched for the next run
    assert json.loads(pio.to_json(marked, validate=False)) == \
        json.loads(pio.to_json(whole, validate=False))
    assert json.dumps(base, sort_keys=True, default=str) == \
        json.dumps(kept, sort_keys=True, default=str)
    # the marker is clamped to the axis, and absent without a budget
    far = figures.mark_budget(base, 1e6, 6).layout.shapes[-1]
    assert far.x0 == far.x1 == pytest.approx(base["layout"]["meta"]["x_range"][1])
    assert len(figures.mark_budget(base, None).layout.shapes) == len(base["layout"]["shapes"])


def test_plain_drops_attrs_and_keeps_the_columns(sweep):
    _, sw = sweep
    assert sw.attrs["uncertainty"]["per_k"]
    p = whatif.plain(sw)
    assert p.attrs == {} and list(p.columns) == list(sw.columns)
    assert p.equals(sw)
    assert sw.attrs["uncertainty"]["per_k"]          # the original keeps them


def test_the_one_k_rows_come_from_the_sweep(sweep):
    from cope_core.app.results import SweepView, sweep_at
    tr, sw = sweep
    view = SweepView(sw, whatif.winner_regions(sw, tr.model), [], ())
    rows = sweep_at(view, 3)
    assert set(rows["experts_per_layer"]) == {3} and len(rows) == sw["candidate"].nunique()
    assert rows.attrs["uncertainty"]["per_k"] == {3: sw.attrs["uncertainty"]["per_k"][3]}
    w = whatif.winner_of(rows)
    assert w.candidate == sw[(sw["experts_per_layer"] == 3) & sw["winner"]]["candidate"].iloc[0]
    assert w.win_probability == sw.attrs["uncertainty"]["per_k"][3]["win_probability"]


def test_upload_limits_refuse_with_one_line(tmp_path, monkeypatch):
    with pytest.raises(CopeInputError) as e:
        sources.check_upload_size("big.parquet", int(sources.MAX_UPLOAD_MB * 1e6) + 1)
    assert "upload big.parquet" in str(e.value) and f"{sources.MAX_UPLOAD_MB} MB" in str(e.value)
    assert "\n" not in str(e.value)
    # a small file whose columns decode large: refused from its footer, before it is read
    path = tmp_path / "t.parquet"
    parquet_io.write_trace(tiny_trace(), path)
    decoded = parquet_io.decoded_bytes(path)
    assert decoded > 0
    sources.check_upload_size("t.parquet", path.stat().st_size, path)        # within limits
    monkeypatch.setattr(sources, "MAX_DECODED_MIB", decoded / 2**20 / 2)
    with pytest.raises(CopeInputError, match=r"MiB once read") as e:
        sources.check_upload_size("t.parquet", path.stat().st_size, path)
    assert "upload t.parquet" in str(e.value)


def test_decoded_bytes_counts_every_value_at_its_width(tmp_path):
    # 800 kB of zeros that run-length encoding and zstd store in a few hundred bytes
    t = pa.table({"a": np.zeros(100_000, np.int64),
                  "l": pa.array([[1, 2, 3]] * 100_000, pa.list_(pa.int32()))})
    pq.write_table(t, tmp_path / "z.parquet", compression="zstd")
    assert (tmp_path / "z.parquet").stat().st_size < 50_000
    assert parquet_io.decoded_bytes(tmp_path / "z.parquet") == \
        100_000 * 8 + 300_000 * 4 + 100_000 * 4
    # at least what arrow holds for the shipped trace
    trace = sources.EXAMPLES_DIR / "qwen3-30b-a3b-trace.parquet"
    assert parquet_io.decoded_bytes(trace) >= pq.read_table(trace).nbytes


def test_the_rerun_log_times_runs_not_nested_fragments(tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv(rerun_log.ENV, str(log))
    with rerun_log.measured("app") as run:
        run["page"] = "Landscape"
        with rerun_log.measured("landscape: cache sweep"):   # inside a whole run: not counted
            sum(range(10_000))
    with rerun_log.measured("landscape: cache sweep"):       # a fragment rerun alone
        pass
    with pytest.raises(ValueError), rerun_log.measured("app"):   # a run that ends early
        raise ValueError
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(r["what"], r["page"]) for r in rows] == [
        ("app", "Landscape"), ("landscape: cache sweep", ""), ("app", "")]
    assert all(r["cpu_ms"] >= 0 and r["wall_ms"] >= 0 for r in rows)
    # each thread (each Streamlit session's script thread) logs its own runs, even while
    # another thread is inside one
    def other() -> None:
        with rerun_log.measured("app") as r:
            r["page"] = "other"
    with rerun_log.measured("app"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    pages = [json.loads(x)["page"] for x in log.read_text().splitlines()[3:]]
    assert pages == ["other", ""]
    monkeypatch.delenv(rerun_log.ENV)
    with rerun_log.measured("app"):
        pass
    assert len(log.read_text().splitlines()) == 5
