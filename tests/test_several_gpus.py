"""Several GPUs in one box (issue 72): llama.cpp's layer split and per-device counts, its --fit
across devices, the search for the fastest ranges against a brute-force reference, the cost of
a hand-off, the machine with several cards, and the CLI's answers and one-line refusals."""
from __future__ import annotations

import itertools
import json

import pytest

from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.llamacpp.answer.devices_answer import (
    HANDOFF_MEASURED_US,
    Cards,
    card_costs,
    device_names,
    devices_answer,
    handoff_us,
)
from cope_core.llamacpp.answer.settings import LlamaSettings
from cope_core.llamacpp.placement.command import LlamaFlags, n_cpu_moe_patterns
from cope_core.llamacpp.placement.device_search import (
    BlockCosts,
    blocks_tpot,
    plan_cost,
    search_devices,
)
from cope_core.llamacpp.placement.devices import (
    Buffers,
    DeviceLayout,
    device_memories,
    n_cpu_moe_layout,
    split_counts,
)
from cope_core.llamacpp.placement.fit import fit
from cope_core.llamacpp.placement.fit_devices import fit_devices
from cope_core.llamacpp.placement.vram import (
    Placement,
    device_memory,
    llama_model_of,
    read_llama_model,
)
from cope_core.machine import compose_machine
from cope_core.mechanisms import this_machine as tm
from cope_core.models import resolve_model
from cope_core.platforms import platform_spec

GiB = 1 << 30
GGUF = "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"


def _big():
    g = resolve_model("qwen3-235b-a22b", "Q4_K_M")
    return g, llama_model_of(g)


def test_the_split_is_llamacpps_rule():
    # 95 indices (94 blocks and the output) by equal free memory: j/95 < 0.5 for j <= 47
    assert split_counts(95, [24, 24]) == (48, 47)
    # whole layer counts, as --fit writes -ts, place exactly those counts
    assert split_counts(95, [17, 78]) == (17, 78)
    assert split_counts(95, [15, 16, 64]) == (15, 16, 64)
    assert split_counts(5, [0, 1]) == (0, 5)
    assert split_counts(4, [3, 1]) == (3, 1)
    for bad in ([], [0, 0], [-1, 2], [float("nan"), 1]):
        with pytest.raises(CopeInputError):
            split_counts(10, bad)


@pytest.mark.parametrize("table", ["gguf", "catalog"])
def test_one_device_counts_as_the_single_gpu_count(table):
    m = read_llama_model(GGUF) if table == "gguf" else \
        llama_model_of(resolve_model("glm-4.5-air", "Q4_K_M"))
    b = Buffers(4096)
    for n in (0, 1, 7, m.n_layer):
        one = device_memories(m, DeviceLayout((m.n_layer + 1,), frozenset(range(n))), b)[0]
        assert one == device_memory(m, Placement(-1, n_cpu_moe_patterns(n)), 4096)


def test_n_cpu_moe_empties_the_first_card():
    # ggml-org/llama.cpp#15136: the split comes first, so the first card's layers lose their
    # experts and the last card's keep them
    g, m = _big()
    lay = n_cpu_moe_layout(m, [24, 24], 60)
    first, last = device_memories(m, lay, Buffers(4096))
    assert lay.counts == (48, 47)
    assert first.total < 4 * GiB and last.total > 24 * GiB


def test_the_devices_hold_what_the_layout_puts_on_them():
    g, m = _big()
    lay = DeviceLayout((17, 78), frozenset(range(30, 94)))
    mems = device_memories(m, lay, Buffers(4096))
    single = device_memory(m, Placement(-1, (lay.host_patterns()[0],)), 4096)
    # weights and KV cache split without loss; the output on the last card only
    assert sum(x.model for x in mems) == single.model
    assert sum(x.context for x in mems) == single.context
    assert mems[0].compute > mems[1].compute     # the host weights' copies: the first card


def test_fit_fills_dense_only_layers_back_to_front():
    g, m = _big()
    f = fit_devices(m, [2 * GiB, 4 * GiB], Buffers(4096))
    assert f.status == "dense" and f.fits
    r0, r1 = ([b for b in r if b < m.n_layer] for r in f.layout.ranges())
    assert len(r1) > len(r0) > 0                        # the last card filled first
    assert f.layout.start > 0                           # the rest wholly on the CPU
    # every offloaded block dense-only but the last card's first: fit counts the output layer
    # (index n_layer, no block) among that card's n_part (fit.cpp l. 548-586, 685)
    assert f.layout.host_blocks == frozenset(r0 + r1[1:])


def test_fit_then_makes_layers_full_front_to_back():
    g, m = _big()
    f = fit_devices(m, [24 * GiB, 24 * GiB], Buffers(4096))
    assert f.status == "moe" and f.fits and f.layout.start == 0
    (r0, r1) = f.layout.ranges()
    # the first card's layers are full; the host experts are the last card's last layers
    assert not set(r0) & f.layout.host_blocks
    assert max(f.layout.host_blocks) == m.n_layer - 1


def test_fit_on_one_device_is_the_single_gpu_port_within_its_partial_layer():
    m = read_llama_model(GGUF)
    for free in (12 * GiB, 14 * GiB, 16 * GiB):
        ours = fit_devices(m, [free], Buffers(4096))
        port = fit(m, free, n_ctx=4096)
        full_port = m.n_layer - len(port.host_expert_blocks(m))
        full_ours = m.n_layer - len(ours.layout.host_blocks)
        assert full_port - 1 <= full_ours <= full_port


def _tiny():
    return llama_model_of(resolve_model("qwen3-30b-a3b", "Q8_0").with_layers(6))


@pytest.mark.parametrize("caps_gib,hand", [((2.0, 3.0), 30.0), ((3.0, 1.5), 5.0),
                                           ((1.6, 1.6), 300.0), ((5.0, 5.0), 30.0),
                                           ((0.2, 3.0), 30.0)])
def test_the_search_is_the_brute_force_optimum(caps_gib, hand):
    m = _tiny()
    b = Buffers(1024)
    caps = [int(c * GiB) for c in caps_gib]
    costs = [BlockCosts(100.0, 900.0, 10.0), BlockCosts(140.0, 905.0, 12.0)]
    best = None
    n = m.n_layer
    for k in range(n + 1):
        for host in itertools.chain.from_iterable(itertools.combinations(range(n), r)
                                                  for r in range(n + 1)):
            counts = [k, n - k]
            counts[1 if k < n else 0] += 1
            lay = DeviceLayout(tuple(counts), frozenset(host))
            first = lay.used[0]
            mems = device_memories(m, lay, b, copies_on=first)
            if any(x.total > c for x, c in zip(mems, caps)):
                continue
            cost = plan_cost(m, lay, costs, hand)
            best = cost if best is None else min(best, cost)
    got = search_devices(m, caps, costs, hand, b)
    if best is None:
        assert got is None
        return
    assert got is not None and got.tpot_us == pytest.approx(best)
    assert plan_cost(m, got.layout, costs, hand) == pytest.approx(got.tpot_us)
    mems = device_memories(m, got.layout, b, copies_on=got.used[0])
    assert all(x.total <= c for x, c in zip(mems, caps))


def test_a_slow_card_is_left_out_when_its_handoff_costs_more_than_it_saves():
    m = _tiny()
    costs = [BlockCosts(100.0, 900.0, 10.0), BlockCosts(140.0, 900.0, 12.0)]
    got = search_devices(m, [8 * GiB, 8 * GiB], costs, 50.0, Buffers(1024))
    assert got is not None and got.used == (0,)          # the fast card holds it all
    got = search_devices(m, [8 * GiB, 8 * GiB], costs[::-1], 50.0, Buffers(1024))
    assert got is not None and got.used == (1,)          # wherever it is


def test_the_handoff_is_the_measured_boundary():
    # PR #19922's baseline: 12.13, 13.01, 13.62 ms a token on 2, 4, 6 cards
    per = [(13.01 - 12.13) / 2, (13.62 - 13.01) / 2]
    assert HANDOFF_MEASURED_US == pytest.approx(1e3 * sum(per) / 2, abs=1)
    a = platform_spec("rtx3090")
    hidden = 4 * 4096
    link = a.link_bandwidth * a.link_efficiency
    assert handoff_us(a, a, hidden) == HANDOFF_MEASURED_US
    assert handoff_us(a, a, hidden, peer=True) == pytest.approx(
        HANDOFF_MEASURED_US - a.link_latency_us - hidden / link * 1e6)


def test_blocks_price_experts_on_another_card_with_two_crossings():
    c = [BlockCosts(100.0, 900.0, 10.0), BlockCosts(140.0, 950.0, 12.0)]
    # block 0 on card 0; block 1's attention on card 0, its experts on card 1; block 2 on the
    # host; block 3 on card 1; a dense block on card 1
    got = blocks_tpot(c, [0, 0, 0, 1, 1], [0, 1, -1, 1, None], 5.0)
    want = 100 + (10 + 140 - 12) + 900 + 140 + 12
    # hops: 0 -> 1 (block 1's experts) -> 0 (its return) -> ... -> 1 (block 3)
    assert got == pytest.approx(want + 3 * 5.0)


def test_the_card_costs_add_up_to_the_single_card_placement():
    from cope_core.llamacpp.cache.cache_search import placement_tpot
    from cope_core.profile.analytic import analytic_profile
    g = resolve_model("qwen3-30b-a3b", "Q4_K_M")
    spec = platform_spec("rtx3090", cpu="ryzen-9-7950x")
    c = card_costs(g, spec, 16, 1024.0)
    p = analytic_profile(g, spec, cpu_threads=[16])
    for n in (0, 10, g.n_layers):
        assert (g.n_layers - n) * c.full + n * c.host == pytest.approx(
            float(placement_tpot(p, g, [n], 1024.0, cpu_threads=16)[0]))


def _answer(gpus: str):
    g = resolve_model("qwen3-235b-a22b", "Q4_K_M")
    mc = compose_machine(gpu=gpus, cpu="ryzen-9-7950x", memory="ddr5-6000x2")
    a = devices_answer(g, mc.card_specs(), [x.memory_bytes for x, _ in mc.cards],
                       [x.vendor for x, _ in mc.cards], threads=mc.threads, context=1024.0,
                       llama=LlamaSettings(n_ctx=4096), rel=0.1)
    assert a is not None
    return a


@pytest.mark.parametrize("gpus,big", [("rtx3090,rtx3060-12gb", 0), ("rtx3060-12gb,rtx3090", 1)])
def test_the_larger_card_holds_more(gpus, big):
    a = _answer(gpus)
    mem = [x.total for x in a.memory]
    blocks = [len(r) for r in a.best.layout.ranges()]
    assert a.best.used == (0, 1)
    assert mem[big] > mem[1 - big] and blocks[big] > blocks[1 - big]
    assert all(x <= c for x, c in zip(mem, a.caps))


def test_two_cards_beat_one_and_are_at_least_fit():
    a = _answer("rtx3090,rtx3090")
    assert a.best.used == (0, 1)
    assert a.one_card is not None and a.best.tpot_us < a.one_card.tpot_us
    assert a.fit_tpot_us is not None and a.best.tpot_us <= a.fit_tpot_us
    argv = a.flags().argv()
    assert argv[argv.index("-ts") + 1] == ",".join(str(c) for c in a.best.layout.counts)
    assert "-dev" not in argv


@pytest.mark.parametrize("model", ["qwen3-235b-a22b", "deepseek-v3"])
def test_the_answer_prices_its_blocks_as_the_search_did(model):
    g = resolve_model(model, "Q4_K_M")
    mc = compose_machine(gpu="rtx3090,rtx3090,rtx3090", cpu="ryzen-9-7950x",
                         memory="ddr5-6000x2")
    cards = Cards.of(mc)
    a = devices_answer(g, cards.specs, cards.memory, [x.vendor for x, _ in mc.cards],
                       threads=mc.threads, context=1024.0, llama=LlamaSettings(n_ctx=4096))
    assert a is not None
    card, experts = a.blocks()
    assert experts[:g.dense_layers] == [None] * g.dense_layers
    assert blocks_tpot(cards.costs(g, mc.threads, 1024.0), card, experts,
                       cards.handoff(g)) == pytest.approx(a.best.tpot_us)


def test_the_prompt_across_cards_is_each_share_at_its_rate_and_a_handoff_a_batch():
    from cope_core.llamacpp.answer.devices_answer import devices_prompt
    from cope_core.llamacpp.answer.prompt import PromptRun, prompt_time
    g = resolve_model("qwen3-235b-a22b", "Q4_K_M")
    a, b = platform_spec("rtx3090", cpu="ryzen-9-7950x"), platform_spec("rtx3060-12gb",
                                                                        cpu="ryzen-9-7950x")
    run = PromptRun(2048, n_ubatch=512, threads=16)
    one = prompt_time(g, a, 60, run)
    assert devices_prompt(g, [a], [94], 60, run, 400.0) == one
    two = devices_prompt(g, [a, b], [47, 47], 60, run, 400.0)
    slow = prompt_time(g, b, 60, run)
    assert two.copy_s == one.copy_s and two.cpu_s == one.cpu_s     # the first card's link
    assert two.gpu_s == pytest.approx((one.gpu_s + slow.gpu_s) / 2 + 4 * 400e-6)


def test_flags_write_the_split_and_the_devices():
    f = LlamaFlags(n_gpu_layers=99, fit=False, tensor_split=(17, 78), devices=("CUDA0", "CUDA2"))
    assert f.argv() == ["-ngl", "99", "-dev", "CUDA0,CUDA2", "-ts", "17,78", "-fit", "off"]


def test_device_names_follow_llamacpps_backends():
    assert device_names(["nvidia", "nvidia", "amd", "other"]) == ("CUDA0", "CUDA1", "ROCm0",
                                                                  "Vulkan0")


def test_this_finds_every_card():
    text = ("NVIDIA GeForce RTX 3090, 24576, 4, 16\nNVIDIA GeForce RTX 3060, 12288, 4, 8\n")
    found = tm.this_machine(gpu=True, cpu=False, memory=False,
                            run=lambda cmd: text if cmd[0] == "nvidia-smi" else None,
                            torch_probe=False)
    assert found.gpu is not None and found.gpu.name == "this0 (rtx3090)"
    assert [x.name for x in found.more_gpus] == ["this1 (rtx3060-12gb)"]
    m = compose_machine(gpu="this", cpu="ryzen-9-7950x", this=found)
    assert [(g.name, lk.name) for g, lk in m.cards] == [("this0 (rtx3090)", "pcie4x16"),
                                                        ("this1 (rtx3060-12gb)", "pcie4x8")]
    assert any(f.part == "gpu1" for f in m.facts)


def test_pcie_is_one_for_all_or_one_per_card():
    m = compose_machine(gpu="rtx3090,rtx3090", cpu="ryzen-9-7950x", link="3x16")
    assert [lk.name for _, lk in m.cards] == ["pcie3x16", "pcie3x16"]
    m = compose_machine(gpu="rtx3090,rtx3090", cpu="ryzen-9-7950x", link="4x16,4x4")
    assert [lk.name for _, lk in m.cards] == ["pcie4x16", "pcie4x4"]
    assert [s.link_bandwidth for s in m.card_specs()] == [lk.bandwidth for _, lk in m.cards]


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,field", [
    (["advise", "--gpu", "rtx3090,rtx9999"], "gpu"),
    (["advise", "--gpu", "rtx3090,rtx3090", "--pcie", "4x16,4x8,4x4"], "--pcie"),
    (["advise", "--gpu", "rtx3090", "--pcie", "4x16,4x8"], "--pcie"),
    (["advise", "--gpu", "rtx3090,none"], "--gpu"),
    (["vram", "--gpu", "rtx3090,rtx3090", "--n-cpu-moe", "80", "-ts", "3,1,1"],
     "--tensor-split"),
    (["vram", "--gpu", "rtx3090,rtx3090", "--n-cpu-moe", "60"], "--n-cpu-moe"),
])
def test_bad_device_lists_get_one_line(capsys, argv, field):
    rest = ["--model", "qwen3-235b-a22b"] + (["--cpu", "ryzen-9-7950x"]
                                            if argv[0] == "advise" else [])
    code, out, err = _run(capsys, *argv, *rest)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and f"'{field}'" in err


def test_vram_prints_every_card(capsys):
    code, out, _ = _run(capsys, "vram", "--model", "qwen3-235b-a22b", "--quant", "Q4_K_M", "--gpu",
                        "rtx3090,rtx3090", "--n-cpu-moe", "88", "-ts", "1,1", "--json")
    assert code == 0
    d = json.loads(out)
    assert [x["device"] for x in d["devices"]] == ["CUDA0", "CUDA1"]
    assert all(x["gib"] <= x["card_gib"] for x in d["devices"])
    assert d["tensor_split"] == [48, 47]


@pytest.mark.slow
def test_advise_places_qwen3_235b_on_both_cards(capsys):
    code, out, _ = _run(capsys, "advise", "--model", "qwen3-235b-a22b", "--gpu",
                        "rtx3090,rtx3090", "--cpu", "ryzen-9-7950x", "--memory", "ddr5-6000x2",
                        "--runtime", "llama.cpp", "--json")
    assert code == 0
    d = json.loads(out)
    dev = d["devices"]
    assert [x["device"] for x in dev["devices"]] == ["CUDA0", "CUDA1"]
    assert all(x["blocks"] and x["total_gib"] <= x["budget_gib"] for x in dev["devices"])
    assert dev["fit"]["gain"] >= 1 and dev["one_card"]["gain"] > 1
    assert dev["ttft_s"] > 0 and dev["request_s"] > dev["ttft_s"]
    run = d["runtimes"][0]
    assert run["command"] == dev["command"] and "-ts" in run["command"]
    assert run["alternatives"][0]["label"] == "one card"


EX = "data/examples"
PREDICT = ["--trace", f"{EX}/qwen3-30b-a3b-trace.parquet", "--calibration",
           f"{EX}/qwen3-30b-a3b-calibration.parquet", "--profile",
           f"{EX}/qwen3-30b-a3b-rtx4090-analytic.parquet", "--vram-gib", "8"]


def test_predict_and_export_place_llamacpp_beside_the_profiles_card(capsys):
    code, out, _ = _run(capsys, "predict", *PREDICT, "--more-gpus", "rtx4090", "--json")
    assert code == 0
    rows = json.loads(out)
    dev = rows[-1]["devices"]
    assert rows[-1]["label"] == "several GPUs"
    assert [x["gpu"] for x in dev["devices"]] == ["rtx4090", "rtx4090"]
    assert dev["devices"][0]["budget_gib"] == pytest.approx(8.0)     # --vram-gib: the first
    code, out, _ = _run(capsys, "export", "--format", "llama.cpp", *PREDICT, "--more-gpus",
                        "rtx4090")
    assert code == 0
    commands = [x for x in out.splitlines() if x and not x.startswith("#")]
    assert commands == [dev["command"]]                    # one command: the cards'


@pytest.mark.parametrize("argv,field", [
    (["export", "--format", "vllm", *PREDICT, "--more-gpus", "rtx4090"], "--more-gpus"),
    (["predict", *PREDICT, "--more-gpus", "rtx9999"], "gpu"),
    (["predict", "--trace", f"{EX}/deepseek-v2-lite-4l-trace.parquet", "--profile",
      f"{EX}/deepseek-v2-lite-4l-cpu-emulated-profile.parquet", "-K", "32",
      "--more-gpus", "rtx4090"], "--more-gpus"),
])
def test_more_gpus_refusals_are_one_line(capsys, argv, field):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"'{field}'" in err
