"""The controlled grid's report (benchmarks/grid_report.py, run by benchmarks/fidelity_grid.py):
cells from ``cope evaluate --per-k --json``, the per-cell table and the aggregate on a hand-made
case, and the shipped report consistent with its cells."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from tiny import hand_atomic

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "platforms" / "cpu-emulated-grid"


def _grid():
    """The report module of the grid (benchmarks/grid_report.py, beside its driver)."""
    path = ROOT / "benchmarks" / "grid_report.py"
    spec = importlib.util.spec_from_file_location("grid_report", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _cell(est, pick, agree, within, regret, mape, measured="fixed/parallel", k=2, threads=1):
    return {"K": k, "cpu_threads": threads, "gpu_share": 100.0, "estimator": est,
            "predicted": pick, "measured": measured, "agree": agree, "mape_pct": mape,
            "regret_pct": regret, "measured_tied": [measured, "fixed/cost_selected"],
            "within_noise": within, "measured_tpot_ci_us": [1.0, 2.0]}


def test_settings_and_tags():
    g = _grid()
    assert g.settings_of("none:4,4:2,1:1") == [(None, 4.0), (4.0, 2.0), (1.0, 1.0)]
    assert g.tag(None, 4.0) == "link-unpaced-slow-4" and g.tag(0.5, 1.0) == "link-0.5-slow-1"


def test_cells_and_report_by_hand():
    g = _grid()
    ev = {"cope": {"per_k": [_cell("cope", "fixed/parallel", True, True, 0.0, 5.0),
                             _cell("cope", "fixed/cost_selected", False, True, 1.0, 3.0,
                                   threads=2)]},
          "atomic": {"per_k": [_cell("atomic", "layer_partition", False, False, 10.0, 8.0),
                               _cell("atomic", "fixed/parallel", True, True, 0.0, 4.0,
                                     threads=2)]},
          "hrm": None}
    cells = g.cells_of(ev, 4.0, 2.0)
    assert [(c["K"], c["cpu_threads"]) for c in cells] == [(2, 1), (2, 2)]
    assert cells[0]["tied"] == ["fixed/cost_selected"] and "hrm" not in cells[0]
    for c in cells:
        c["runner_up"], c["margin_pct"] = "layer_partition", 12.5
    text = g.report(cells, {"cope": [3, 4]})
    assert "| 4 GB/s | 2x slower | 1 | 2 | fixed/parallel | 12.5 % over layer_partition | " \
           "no: fixed/cost_selected | = fixed/parallel (regret 0.0 %, MAPE 5.0 %) | " \
           "✗ layer_partition (regret 10.0 %, MAPE 8.0 %) | — |" in text
    assert "| cope | 2/2 | 1/2 | 3/4 | 0.50 % | 1.00 % | 4.00 % |" in text
    assert "| atomic | 1/2 | 1/2 | — | 5.00 % | 10.00 % | 6.00 % |" in text
    assert "1 distinct measured winners (fixed/parallel); the winner is beyond the tie test " \
           "in 0 of 2 cells." in text


@pytest.mark.skipif(not (SHIPPED / "report.json").exists(), reason="no shipped grid")
def test_the_shipped_report_is_its_cells():
    g = _grid()
    data = json.loads((SHIPPED / "report.json").read_text())
    assert len(data["cells"]) >= 6
    assert (SHIPPED / "report.md").read_text() == \
        g.report(data["cells"], data["top1_prompts"]) + "\n\n" \
        + g.resemblance_table(data["resemblance"]) + "\n\n" \
        + g.contention_table(data["contention"]) + "\n\n" + g.bias_table(data["bias"]) \
        + "\n\n" + g.gap_table(data["bias"]) \
        + ("\n\n" + g.ablation_table(data["ablation"], data["cells"])
           if data.get("ablation") else "") + "\n"


@pytest.mark.skipif(not (SHIPPED / "report.json").exists(), reason="no shipped grid")
def test_the_shipped_contention_and_bias_come_from_the_shipped_files():
    g = _grid()
    data = json.loads((SHIPPED / "report.json").read_text())
    names = sorted({r["setting"] for r in data["contention"]})
    profiles = {n: SHIPPED / f"profile-{n}.parquet" for n in names}
    assert sorted(map(json.dumps, g.contention_rows(profiles))) == \
        sorted(map(json.dumps, data["contention"]))
    both = {n: (profiles[n], SHIPPED / f"measurements-{n}.parquet") for n in names}
    bias = g.bias_rows(SHIPPED / "trace.parquet", SHIPPED / "calibration.parquet", both)
    assert sorted(map(json.dumps, bias)) == sorted(map(json.dumps, data["bias"]))
    abl = g.ablation_rows(SHIPPED / "trace.parquet", SHIPPED / "calibration.parquet", both)
    assert sorted(map(json.dumps, abl)) == sorted(map(json.dumps, data.get("ablation", [])))


def test_contention_and_bias_tables_by_hand(tmp_path):
    from tiny import tiny_profile

    from cope_core import parquet_io
    g = _grid()
    from cope_core.profile.data import ProfileKey
    keep = ("gpu_expert", "cpu_expert", "act_copy", "sync", "merge", "prefetch")
    ops = {k: v for k, v in hand_atomic(prefetch=6.0).items() if k.name in keep}
    ops[ProfileKey("schedule", "parallel", hits=1, cpu=1, staged=0)] = 57.5  # 2 max(3, 28) + .75
    path = tmp_path / "profile-x.parquet"
    parquet_io.write_profile(tiny_profile(ops, operating_points=((8, 100.0),)), path)
    (row,) = g.contention_rows({"x": path})
    assert row["largest_excess"]["execution"] == "parallel"
    assert row["largest_excess"]["excess_pct"] == pytest.approx(100.0)
    assert row["prefetch_hidden_pct"] == pytest.approx(50.0)      # 3 of 6 beside a layer
    text = g.contention_table([row])
    assert "| x | 8 | parallel h=1 c=1 u=0: +100.0 % (0.1 vs 0.0 ms) |" in text
    assert text.rstrip().endswith("| 50 % of 0.0 ms |")
    rows = [{"setting": "x", "cpu_threads": 8, "estimator": "cope", "fixed": 1.25,
             "mutable_per_layer": -2.0, "layer_partition": 0.0}]
    assert "| x | 8 | cope | +1.2 % | -2.0 % | — | +0.0 % |" in g.bias_table(rows)
    # the gap: mean of the mutable residencies' errors minus fixed's, per execution
    err = {"fixed/parallel": 1.0, "mutable_per_layer/parallel": -4.0,
           "mutable_cross_layer/parallel": -6.0, "fixed/ready_first": 2.0,
           "mutable_cross_layer/ready_first": 2.5, "mutable_per_layer/cost_selected": 3.0}
    assert g.residency_gaps(err) == {"parallel": -6.0, "ready_first": 0.5}   # no fixed/cs
    rows[0]["gap"] = g.residency_gaps(err)
    assert "| x | 8 | cope | -6.0 | — | +0.5 | — |" in g.gap_table(rows)


def test_ablation_table_by_hand():
    g = _grid()
    cells = [{"link_gbps": 4.0, "cpu_slowdown": 2.0, "K": 2, "cpu_threads": t,
              "cope": {"pick": "fixed/parallel", "agree": t == 1, "within_noise": True,
                       "regret_pct": 0.0 if t == 1 else 2.0, "mape_pct": 4.0}} for t in (1, 2)]
    rows = [{"setting": "link-4-slow-2", "K": 2, "cpu_threads": t, "pick": "m/p",
             "agree": False, "within_noise": t == 2, "regret_pct": 6.0, "mape_pct": 8.0}
            for t in (1, 2)]
    text = g.ablation_table(rows, cells)
    assert "| link-4-slow-2 | 2 | 2 | fixed/parallel (2.0 %, 4.0 %) | m/p (6.0 %, 8.0 %) |" \
        in text
    assert text.endswith("Beside CPU misses: tie-aware 2/2, strict 1/2, mean regret 1.00 %, "
                         "max 2.00 %, MAPE 4.00 %. Beside a resident layer only: tie-aware "
                         "1/2, strict 0/2, mean regret 6.00 %, max 6.00 %, MAPE 8.00 %.")
    assert g.ablation_table([], cells) == ""
