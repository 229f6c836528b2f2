"""The second anchor: published llama.cpp --n-cpu-moe sweeps (data/published/), checked on load
and predicted from llama.cpp's plain placement priced by hand."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny import ROUND_GEOMETRY as G
from tiny import ROUND_OVERHEADS as OVER
from tiny import exact, row_us

from cope_core.errors import CopeInputError
from cope_core.llamacpp import placement_tpot
from cope_core.profile.analytic import analytic_profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import published_sweeps as ps  # noqa: E402


def test_a_plain_placement_is_its_layers_placed_whole():
    prof = analytic_profile(G, OVER, cpu_threads=[4], contexts=(0,), gpu_shares=(100,))
    t = prof.table
    gpu, cpu = row_us(t, 4, "layer", "gpu_layer"), row_us(t, 4, "layer", "cpu_layer")
    # the shared work per token at context 0: one dense block, two MoE blocks and the head
    shared = (row_us(t, 4, "shared", "dense_block", context=0)
              + 2 * row_us(t, 4, "shared", "moe_block", context=0) + row_us(t, 4, "shared", "head"))
    # a CPU expert layer in llama.cpp's graph: the row, plus the second split's hand-offs (two
    # more small transfers, one more wait: act_copy 4.4 and sync 10 by hand)
    host = cpu + row_us(t, 4, "atomic", "act_copy", count=1) + row_us(t, 4, "atomic", "sync",
                                                                     count=1)
    got = placement_tpot(prof, G, [0, 1, 2], 0.0, cpu_threads=4)
    np.testing.assert_allclose(got, [shared + 2 * gpu, shared + gpu + host, shared + 2 * host])
    assert gpu == exact(140.0) and cpu == exact(839.4)     # test_schedule_rows_by_hand
    assert host == exact(839.4 + 4.4 + 10.0)
    with pytest.raises(CopeInputError, match=r"\[0, 2\]"):
        placement_tpot(prof, G, [3], 0.0, cpu_threads=4)


def test_every_shipped_point_is_sourced_and_checked():
    sweeps = ps.load()
    assert len(sweeps) >= 2
    assert len({(s["hardware"]["gpu"], s["hardware"]["cpu"]) for s in sweeps}) >= 2
    for s in sweeps:
        assert s["source"].startswith("https://") and len(s["points"]) >= 3
        assert s["_spec"].cpu_bandwidth == s["platform"]["cpu_bandwidth"]


def test_the_ratio_is_to_the_sweeps_first_point():
    s = ps.load()[0]
    pts = ps.predict(s)
    assert pts[0].published_ratio == pts[0].predicted_ratio == 1.0
    p = pts[1]
    assert p.published_ratio == exact(p.published_tps / pts[0].published_tps)
    assert p.predicted_ratio == exact(p.predicted_tps / pts[0].predicted_tps)
    assert p.ratio_error == exact(p.predicted_ratio / p.published_ratio - 1)
    # fewer layers on the CPU is faster, in the prediction as in the sweep
    assert all(a.predicted_tps < b.predicted_tps for a, b in zip(pts, pts[1:]))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema="x"), "expected schema"),
    (lambda d: d["sweeps"][0].update(source="www.example.com"), "https URL"),
    (lambda d: d["sweeps"][0]["points"][0].update(n_cpu_moe=41), r"N in \[0, 40\]"),
    (lambda d: d["sweeps"][0]["points"][0].update(tokens_per_s=-1), "tokens/s > 0"),
    (lambda d: d["sweeps"][0]["platform_sources"].pop("cpu_bandwidth"),
     "no source for platform.cpu_bandwidth"),
    (lambda d: d["sweeps"][0]["model"].pop("why"), "missing 'why'"),
])
def test_bad_files_get_one_line_errors(tmp_path, edit, message):
    doc = copy.deepcopy(json.loads(ps.DATA.read_text()))
    edit(doc)
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(CopeInputError, match=message) as e:
        ps.load(bad)
    assert "\n" not in str(e.value) and "s.json" in str(e.value)


def test_the_published_table_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "published_sweeps.py"),
                        "--check"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
