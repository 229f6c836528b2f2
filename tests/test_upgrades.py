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


def test_nothing_on_the_host_nothing_to_say():
    m = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    assert upgrades(G, m, 0, 4096) == ()


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
    assert len(helps) == 3 and all({"change", "tokens_per_s", "gain_pct", "checked"} == set(h)
                                   for h in helps)
    assert helps[0]["gain_pct"] == pytest.approx(max(h["gain_pct"] for h in helps))


def test_a_hybrid_part_is_also_priced_with_its_e_cores():
    from cope_core.export import upgrades as up
    m = compose_machine(gpu="rtx4070", cpu="core-i5-12600k", memory="ddr5-4800x2")
    by = {u.label.split(" (")[0]: u for u in upgrades(G, m, 30, 4096)}
    e = by["the E-cores too"]
    assert "-t 10" in e.label and m.threads == 6
    assert e.tokens_per_s == pytest.approx(
        up._speed(G, m, m.cpu, m.memory, 10, 30, 4096), rel=1e-12)
    # a part without E-cores says nothing of them
    plain = compose_machine(gpu="rtx4070", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    assert not any("E-cores" in u.label for u in upgrades(G, plain, 30, 4096))


def test_a_machine_without_a_gpu_is_priced_on_its_cpu_and_more_threads_can_slow_it():
    from cope_core.estimate.cpu_only import host_spec, spec_tpot
    m = compose_machine(gpu=None, cpu="epyc-7763", memory="ddr4-3200x8")
    by = {u.label.split(" (")[0]: u for u in upgrades(G, m, G.n_layers, 4096)}
    assert set(by) == {"faster memory", "twice the channels", "twice the cores"}
    base = 1e6 / spec_tpot(G, host_spec(m.cpu, m.memory), m.threads, 4096)
    assert by["faster memory"].base_tokens_per_s == pytest.approx(base, rel=1e-12)
    # 64 cores already saturate eight channels: 128 threads only add barrier time
    assert by["twice the cores"].gain_pct < 0 < by["twice the channels"].gain_pct


def test_each_line_says_how_the_model_did_on_published_ab_sets():
    from cope_core.estimate.cpu_only import published_error
    from cope_core.export.upgrades import checked
    err = published_error()
    shares = [p["share"] for p in err["memory_pairs"]]
    assert len(shares) == 3 and min(shares) == 0.0           # the EPYC 9175F pair
    assert checked("memory") == (f"on 3 published memory-clock A/Bs the model gave "
                                 f"0-{100 * max(shares):.0f} % of the measured gain")
    assert "no published channel-count A/B" in checked("channels")
    m = compose_machine(gpu="rtx4070", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    assert all(u.checked and u.text().endswith(u.checked) for u in upgrades(G, m, 30, 4096))
