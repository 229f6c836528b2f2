"""``contention`` and ``cope contention``: a schedule's measured cost against the composition of
its isolated ops, on hand-worked rows, and the command's output and errors."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from tiny import hand_atomic, tiny_profile

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.contention import contention, contention_summary, prefetch_hiding
from cope_core.estimate.costs import atomic_costs, atomic_layer
from cope_core.matrix import EXECUTIONS
from cope_core.platforms import platform_spec
from cope_core.profile.analytic import analytic_profile
from cope_core.profile.data import ProfileKey

# R = [.5, 3, 7], C = [1, 20, 45], S = [0, 11, 25], G = [0, 2, 5], A = 8, F = .5, M = .25
OPS = hand_atomic(prefetch=9.0)
S = "schedule"
ROWS = {ProfileKey(S, "parallel", hits=1, cpu=1, staged=0): 40.0,        # contended
        ProfileKey(S, "ready_first", hits=0, cpu=0, staged=2): 20.0,     # pipelines better
        ProfileKey(S, "wait_then_gpu", hits=1, cpu=0, staged=1): 16.75,  # exactly as composed
        ProfileKey(S, "cost_selected", hits=0, cpu=1, staged=1): 30.0}   # slightly better


@pytest.fixture(scope="module")
def table():
    prof = tiny_profile(OPS | ROWS, operating_points=((8, 100.0),))
    return contention(prof).set_index(["execution", "hits", "cpu", "staged"])


def test_hand_worked_rows(table):
    # parallel h=1 c=1: composed max(3, 20 + 8) + .75 = 28.75, serial 3 + 28 + .75 = 31.75
    r = table.loc[("parallel", 1, 1, 0)]
    assert (r.measured_us, r.composed_us, r.serial_us) == (40.0, 28.75, 31.75)
    assert r.excess_pct == pytest.approx(100 * (40 / 28.75 - 1))
    assert r.overlap == pytest.approx((31.75 - 40) / (31.75 - 28.75))   # worse than serial
    # quartiles are 0.875x / 1.125x the medians: 35 > 28.75 * 1.125 = 32.34
    assert r.verdict == "contention"
    # ready_first h=0 u=2: max(.5, 25) + 5 + .75 = 30.75; serial 31.25 is within 5 %: no overlap
    r = table.loc[("ready_first", 0, 0, 2)]
    assert (r.composed_us, r.serial_us) == (30.75, 31.25)
    assert math.isnan(r.overlap) and r.verdict == "faster"      # 22.5 < 30.75 * .875
    # wait_then_gpu is serial by design: 11 + 3 + 2 + .75
    r = table.loc[("wait_then_gpu", 1, 0, 1)]
    assert r.composed_us == r.serial_us == 16.75 and r.excess_pct == 0.0
    assert r.verdict == "as composed" and math.isnan(r.overlap)
    # cost_selected h=0 c=1 u=1: max(.5, 28, 11) + 2 + .75 = 30.75; serial .5+28+11+2+.75
    r = table.loc[("cost_selected", 0, 1, 1)]
    assert (r.composed_us, r.serial_us) == (30.75, 42.25)
    assert r.overlap == pytest.approx(12.25 / 11.5) and r.verdict == "as composed"


def test_one_row_per_schedule_and_the_summary(table):
    k = 2
    # parallel, wait, ready: one row per h; cost_selected: every split
    assert len(table) == 3 * (k + 1) + sum(k - h + 1 for h in range(k + 1))
    s = contention_summary(table.reset_index()).set_index("execution")
    assert list(s.index) == [e.value for e in EXECUTIONS]
    # ready_first h=2 keeps the default row 2 (10 per miss + hits) against 7 + .75: faster too
    assert s.loc["parallel", "contention"] == 1 and s.loc["ready_first", "faster"] == 2
    assert s.loc["cost_selected", "rows"] == 6
    assert s.loc["parallel", "max_excess_pct"] == pytest.approx(100 * (40 / 28.75 - 1))


def test_composed_profile_reads_as_composed():
    """A profile whose schedule rows are their own composition departs from it nowhere."""
    base = tiny_profile(OPS, operating_points=((8, 100.0),))
    op = base.resolve()
    rows = {}
    for e_idx, e in enumerate(EXECUTIONS):
        for h in range(3):
            m = 2 - h
            splits = range(m + 1) if e.value == "cost_selected" else \
                [m] if e.value == "parallel" else [0]
            for c in splits:
                rows[ProfileKey(S, e.value, hits=h, cpu=c, staged=m - c)] = float(
                    atomic_layer(op, e_idx, [h], [c], [m - c])[0])
    df = contention(tiny_profile(OPS | rows, operating_points=((8, 100.0),)))
    assert np.allclose(df["excess_pct"], 0.0) and set(df["verdict"]) == {"as composed"}
    finite = df["overlap"].dropna()
    assert len(finite) and np.allclose(finite, 1.0)


def test_atomic_costs_are_the_composition(table):
    """The atomic estimator's per-execution costs are exactly the table's composed column."""
    prof = tiny_profile(OPS | ROWS, operating_points=((8, 100.0),))
    lc = atomic_costs(prof.resolve())
    t = table.reset_index()
    for e_idx, e in enumerate(EXECUTIONS[:3]):
        got = t[t["execution"] == e.value].sort_values("hits")["composed_us"].to_numpy()
        assert got.tolist() == lc.moe[e_idx].tolist()


def test_prefetch_hiding():
    # default prefetch rows 2 + 3q at 8 threads: 3 beside a layer; the isolated op is 9
    pf = prefetch_hiding(tiny_profile(OPS, operating_points=((8, 100.0),)))
    assert pf["beside_layer_us"].tolist() == [3.0, 3.0]
    assert pf["beside_cpu_us"].tolist() == [3.0, 3.0]      # no rows beside CPU misses
    assert pf["isolated_us"].tolist() == [9.0, 9.0]
    assert pf["hidden_pct"].to_numpy() == pytest.approx([100 * 6 / 9] * 2)


def test_prefetch_beside_cpu_misses():
    ops = {("prefetch", r, -1, c, -1, 1): v for r in ("mutable_per_layer", "mutable_cross_layer")
           for c, v in ((1, 40.0), (2, 70.0))}
    prof = tiny_profile({**OPS, **ops}, operating_points=((8, 100.0),), beside=True)
    pf = prefetch_hiding(prof)
    assert pf["beside_layer_us"].tolist() == [3.0, 3.0]
    assert pf["beside_cpu_us"].tolist() == [70.0 - 2.0, 70.0 - 2.0]   # at c = k, less q = 0


def test_analytic_profile_is_refused():
    prof = tiny_profile()
    ap = analytic_profile(prof.model, platform_spec("rtx4090"), [8], gpu_shares=(100,))
    with pytest.raises(CopeInputError, match="measured profile"):
        contention(ap)


def test_cope_contention_prints_and_writes_strict_json(tmp_path, capsys):
    path = tmp_path / "p.parquet"
    parquet_io.write_profile(tiny_profile(OPS | ROWS), path)
    assert main(["contention", "--profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "cpu_threads 8, gpu_share 100 %" in out and "cpu_threads 4, gpu_share 50 %" in out
    assert "contention" in out and "% hidden" in out
    assert main(["contention", "--profile", str(path), "--threads", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out,
                      parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    (point,) = data["operating_points"]
    assert point["cpu_threads"] == 8 and len(point["schedules"]) == 15
    rt = next(r for r in point["schedules"] if r["execution"] == "ready_first"
              and r["hits"] == 0)
    assert rt["overlap"] is None and rt["verdict"] == "faster"


@pytest.mark.parametrize("extra,field", [(["--threads", "3"], "cpu_threads"),
                                         (["--gpu-share", "70"], "gpu_share")])
def test_cope_contention_bad_input_is_one_line(tmp_path, capsys, extra, field):
    path = tmp_path / "p.parquet"
    parquet_io.write_profile(tiny_profile(), path)
    code = main(["contention", "--profile", str(path), *extra])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and field in err


def test_contention_figure_is_the_table(table):
    from cope_core.app.figures_inputs import contention_figure
    df = table.reset_index()
    fig = contention_figure(df)
    # one trace per verdict present, together one bar per schedule row, in the table's order
    assert sorted(t.name for t in fig.data) == sorted(set(df["verdict"]))
    got = {x: y for t in fig.data for x, y in zip(t.x, t.y)}
    assert len(got) == len(df)
    assert got["parallel h1 c1 u0"] == pytest.approx(100 * (40 / 28.75 - 1))
    assert next(t for t in fig.data if t.name == "contention").x.tolist() == \
        ["parallel h1 c1 u0"]
    assert list(fig.layout.xaxis.categoryarray)[0] == "parallel h0 c2 u0"
