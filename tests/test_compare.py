"""``compare`` and ``cope compare``: the same trace on several platforms equals each platform's
own prediction, budgets are capped at each GPU's memory, and bad input is one line."""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from tiny import tiny_profile, tiny_trace

from cope_core import parquet_io, predict
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.compare import (
    Platform,
    catalog_platform,
    compare,
    profile_platform,
    spec_platform,
)
from cope_core.geometry import GIB
from cope_core.platforms import platform_spec


def _predict(tr, prof, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return predict(tr, prof, k, calibration=tr, **kw)


@pytest.fixture(scope="module")
def three():
    tr = tiny_trace()
    return tr, [catalog_platform(tr.model, "rtx4090"), catalog_platform(tr.model, "h100+pcie5"),
                Platform("tiny measured", tiny_profile(), None)]


def test_each_platform_is_its_own_prediction(three):
    tr, plats = three
    cmp = compare(tr, plats, 0.50163, tr, cpu_threads=8, draws=200)   # K = 2
    at = cmp.at_budget
    assert at["platform"].tolist() == ["rtx4090+pcie4+xeon-gold-6430",
                                       "h100+pcie5+xeon-gold-6430", "tiny measured"]
    for p, row in zip(plats, at.itertuples(index=False)):
        df = _predict(tr, p.profile, [row.experts_per_layer], cpu_threads=8, draws=200)
        w = df.sort_values("rank").iloc[0]
        assert row.winner == w.candidate and row.tpot_us == w.tpot_us
        assert (row.tpot_lo_us, row.tpot_hi_us) == (w.tpot_lo_us, w.tpot_hi_us)
        conf = df.attrs["uncertainty"]["per_k"][row.experts_per_layer]
        assert row.win_probability == conf["win_probability"]
        assert row.layer_partition_us == df.set_index("candidate").loc["layer_partition",
                                                                       "tpot_us"]
        # the sweep: the best candidate at every K the platform holds
        sw = cmp.sweep[cmp.sweep["platform"] == p.label]
        full = _predict(tr, p.profile, list(range(len(sw))), cpu_threads=8, draws=0)
        best = full[full["winner"]].sort_values("experts_per_layer")
        assert sw["winner"].tolist() == best["candidate"].tolist()
        np.testing.assert_array_equal(sw["tpot_us"], best["tpot_us"])
    assert at["speedup"].tolist() == pytest.approx(at["tpot_us"].iloc[0] / at["tpot_us"])
    assert at["speedup"].iloc[0] == 1.0
    assert at["analytic"].tolist() == [True, True, False]


def test_a_platform_is_capped_at_its_own_memory():
    tr = tiny_trace()
    g = tr.model
    small = g.vram_for_experts_per_layer(2) / GIB            # holds K = 2, not 3
    plats = [spec_platform(g, platform_spec("rtx4090"), small, cpu_threads=8, label="small"),
             spec_platform(g, platform_spec("rtx4090"), None, cpu_threads=8, label="unknown")]
    cmp = compare(tr, plats, 100.0, tr, draws=0)
    a = cmp.at_budget.set_index("platform")
    assert a.loc["small", "experts_per_layer"] == 2 and a.loc["small", "budget_gib"] == small
    assert a.loc["unknown", "experts_per_layer"] == g.n_experts
    assert cmp.sweep[cmp.sweep["platform"] == "small"]["experts_per_layer"].max() == 2
    assert cmp.sweep[cmp.sweep["platform"] == "unknown"]["experts_per_layer"].max() == \
        g.n_experts
    assert math.isnan(a.loc["small", "win_probability"])           # no draws


def test_platform_names_and_profiles():
    g = tiny_trace().model
    p = catalog_platform(g, "rtx5090+pcie4+epyc-7763")
    assert p.label == "rtx5090+pcie4+epyc-7763" and p.profile.analytic
    assert p.vram_gib == pytest.approx(32.0)
    for bad in ("b200", "rtx4090+pcie9", "rtx4090+pcie4+m3+x"):
        with pytest.raises(CopeInputError):
            catalog_platform(g, bad)
    assert profile_platform(p.profile).vram_gib == pytest.approx(32.0)
    with pytest.raises(CopeInputError, match="at least one platform"):
        compare(tiny_trace(), [], 1.0)


def test_cope_compare_prints_and_writes_strict_json(tmp_path, capsys):
    tr = tiny_trace()
    trace = tmp_path / "t.parquet"
    parquet_io.write_trace(tr, trace)
    prof = tmp_path / "p.parquet"
    parquet_io.write_profile(tiny_profile(), prof)
    args = ["compare", "--trace", str(trace), "--calibration", str(trace), "--platform",
            "rtx4090", "--platform", "h100", "--profile", str(prof), "--vram-gib", "0.50163",
            "--threads", "8", "--draws", "100"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "rtx4090+pcie4+xeon-gold-6430" in out and "p.parquet" in out and "MEASURED" in out
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out,
                      parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    ref = compare(tr, [catalog_platform(tr.model, "rtx4090", cpu_threads=8),
                       catalog_platform(tr.model, "h100", cpu_threads=8),
                       profile_platform(tiny_profile())], 0.50163, tr, cpu_threads=8, draws=100)
    assert [p["winner"] for p in data["platforms"]] == ref.at_budget["winner"].tolist()
    assert [p["tpot_us"] for p in data["platforms"]] == ref.at_budget["tpot_us"].tolist()
    assert len(data["sweep"]) == len(ref.sweep)
    # the text table's tok/s column: each platform's TPOT as tokens per second
    rows = [ln.split() for ln in out.splitlines() if ln.split()[1:2] in (["ANALYTIC"],
                                                                       ["MEASURED"])]
    assert len(rows) == len(data["platforms"]) == 3
    for r, p in zip(rows, data["platforms"]):
        assert float(r[6]) == pytest.approx(1e6 / p["tpot_us"], abs=0.051)


@pytest.mark.parametrize("extra, field", [(["--platform", "b200"], "platform"),
                                           ([], "--platform")])
def test_cope_compare_bad_input_is_one_line(tmp_path, capsys, extra, field):
    trace = tmp_path / "t.parquet"
    parquet_io.write_trace(tiny_trace(), trace)
    code = main(["compare", "--trace", str(trace), "--vram-gib", "1", *extra])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and field in err
