"""What would help most (cope_core/export/upgrades.py): llama.cpp's placement priced with one part
changed at a time, and cope advise's lines for it."""
from __future__ import annotations

import json

import pytest

from cope_core.cli.main import main
from cope_core.export.upgrades import FASTER_MEMORY, upgrades
from cope_core.machine import compose_machine
from cope_core.models import resolve_model

G = resolve_model("gpt-oss-120b", "MXFP4_MOE")


def test_nothing_on_the_host_or_no_gpu_nothing_to_say():
    m = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    assert upgrades(G, m, 0, 4096) == ()
    assert upgrades(G, compose_machine(gpu=None, cpu="ryzen-7-5700x"), 20, 4096) == ()


def test_each_part_moves_the_cpu_heavy_placement_the_right_way():
    m = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2", threads=4)
    ups = upgrades(G, m, 30, 4096)
    assert [u.gain_pct for u in ups] == sorted((u.gain_pct for u in ups), reverse=True)
    by = {u.label.split(" (")[0]: u for u in ups}
    assert set(by) == {"faster memory", "twice the channels", "every core"}
    mts = round(3200 * FASTER_MEMORY)
    assert by["faster memory"].label.startswith(f"faster memory (ddr4-{mts}x2")
    assert "ddr4-3200x4" in by["twice the channels"].label and "-t 8" in by["every core"].label
    # more bandwidth or more cores never slow a placement down, and 30 of 36 layers' experts in
    # host memory make memory matter
    assert all(u.gain_pct >= 0 for u in ups) and by["twice the channels"].gain_pct > 0
    assert by["twice the channels"].gain_pct >= by["faster memory"].gain_pct
    base = {u.base_tokens_per_s for u in ups}
    assert len(base) == 1


def test_advise_prints_what_would_help_and_its_json(capsys):
    argv = ["advise", "--model", "gpt-oss-120b", "--gpu", "rtx3090", "--cpu", "ryzen-7-5700x",
            "--memory", "ddr4-3200x2", "--runtime", "llama.cpp"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("  what would help most"))
    assert all(lines[at + i].startswith("    ") and "tokens/s (" in lines[at + i]
               for i in (1, 2, 3))
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    helps = doc["what_would_help"]
    assert len(helps) == 3 and all({"change", "tokens_per_s", "gain_pct"} == set(h)
                                   for h in helps)
    assert helps[0]["gain_pct"] == pytest.approx(max(h["gain_pct"] for h in helps))
