"""The sidebar's "Your machine" (issue 40): parts from the catalog and a catalog model (with a
trace made here when none is shipped) reach every page, are in the URL and survive page
changes; nothing chosen keeps the examples' own profiles."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from cope_core import parquet_io, predict
from cope_core.app import compare_view, whatif
from cope_core.app import machine_choice as mc
from cope_core.app.apptest import open_clean, open_page, url_settings
from cope_core.geometry import get_model
from cope_core.machine import compose_machine
from cope_core.matrix import CANDIDATE_IDS
from cope_core.models import resolve_model
from cope_core.profile.analytic import analytic_for_model
from cope_core.trace.synth_defaults import synthetic_inputs

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "data" / "examples"
MINE = {"gpu": "rtx3090", "cpu": "ryzen-7-5700x", "memory": "ddr4-3200x2", "pcie": "pcie4x16"}
PAGES = ("overview", "matrix", "landscape", "export", "compare")


open_app = functools.partial(open_clean, ROOT / "app.py")
query = url_settings


def expected_winner(trace, cal, profile, gib: float, threads: int) -> whatif.Winner:
    k = whatif.k_for_budget(trace.model, gib)
    return whatif.winner_of(predict(trace, profile, [k], calibration=cal, cpu_threads=threads,
                                    candidates=CANDIDATE_IDS))


@pytest.fixture(scope="module")
def qwen():
    return tuple(parquet_io.read_trace(EX / f"qwen3-30b-a3b-{s}.parquet")
                 for s in ("trace", "calibration"))


# --- pure logic ---------------------------------------------------------------------------------
def test_a_choice_composes_the_catalog_machine_and_its_profile():
    m = mc.MachineChoice("rtx3090", "ryzen-7-5700x", "ddr4-3200x2", "pcie4x16").compose()
    ref = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2",
                          link="pcie4x16")
    assert m.spec == ref.spec and m.threads == 8
    # defaults: the CPU's usual memory and the card's own link (an RTX 4060 Ti is PCIe 4.0 x8)
    d = mc.MachineChoice("rtx4060ti-16gb", "ryzen-7-5700x").compose()
    assert (d.memory.name, d.link.name) == ("ddr4-3200x2", "pcie4x8")
    g = get_model("olmoe-1b-7b")
    p = mc.machine_profile(g, m)
    assert p.analytic and mc.is_your_machine(p)
    assert sorted({t for t, _ in p.operating_points()}) == [1, 2, 4, 8]
    assert p.choose()[0] == 8                                  # the CPU's cores by default
    assert p.platform["vram_gib"] == 24.0 and p.platform["machine"] == m.spec.name


def test_the_budget_slider_spans_the_chosen_gpus_memory():
    g = resolve_model("qwen3-30b-a3b", "Q4_K_M")
    lo, hi = whatif.budget_range(g)
    assert hi < 24                              # every expert fits well below a 24 GiB card
    assert whatif.budget_range(g, 32.0) == (lo, 32.0)
    assert whatif.budget_range(g, 8.1) == (lo, hi)   # a smaller card keeps the model's range
    # a chosen machine's default is all of its card; an example's is as before (capped)
    assert whatif.default_budget(g, {"gpu": "rtx5090", "vram_gib": 32.0}) == 32.0
    assert whatif.default_budget(g, {"gpu": "rtx5090"}) < 32.0


def test_weights_offered_are_the_presets_a_family_publishes():
    assert mc.quant_options("gpt-oss-120b") == [mc.AS_IS, "MXFP4_MOE"]
    assert "Q4_K_M" in mc.quant_options("glm-4.5-air")
    assert mc.catalog_geometry("glm-4.5-air", mc.AS_IS) == get_model("glm-4.5-air")
    assert {"glm-4.5-air", "gpt-oss-120b"} <= set(mc.catalog_models(["qwen3-30b-a3b"]))
    assert "qwen3-30b-a3b" not in mc.catalog_models(["qwen3-30b-a3b"])


def test_speed_is_ms_per_token_and_tokens_per_second():
    assert whatif.speed(8241.0) == "8.241 ms/token · 121.3 tokens/s"
    assert whatif.tokens_per_s(20_000.0) == 50.0


# --- pages --------------------------------------------------------------------------------------
def test_nothing_chosen_keeps_the_examples_own_profile(qwen):
    at = open_app()
    assert query(at)["gpu"] == mc.EXAMPLE
    assert not [i for i in at.info if "Your machine" in i.value]
    prof = parquet_io.read_profile(EX / "qwen3-30b-a3b-rtx4090-analytic.parquet")
    gib = whatif.default_budget(qwen[0].model, prof.platform)
    w = expected_winner(*qwen, prof, gib, prof.choose()[0])
    assert at.metric[1].value == f"{w.tpot_us / 1e3:.3f} ms"
    assert at.metric[4].label == "Speed (tokens/s)"
    assert at.metric[4].value == f"{whatif.tokens_per_s(w.tpot_us):.1f}"


def test_the_overview_answers_for_a_machine_from_the_catalog(qwen):
    at = open_app(**MINE)
    m = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2",
                        link="pcie4x16")
    prof = mc.machine_profile(qwen[0].model, m)
    w = expected_winner(*qwen, prof, 24.0, 8)          # all of the card, the CPU's 8 cores
    assert [x.value for x in at.metric][:2] == [w.named, f"{w.tpot_us / 1e3:.3f} ms"]
    assert at.metric[4].label == "Speed (tokens/s)"
    assert at.metric[4].value == f"{whatif.tokens_per_s(w.tpot_us):.1f}"
    assert any("ANALYTIC what-if" in i.value and m.spec.name in i.value for i in at.info)
    assert query(at) | MINE == query(at)               # the machine is in the URL
    default = open_app()
    assert default.metric[1].value != at.metric[1].value


@pytest.mark.parametrize("page", PAGES[1:])
def test_every_page_answers_for_the_machine(page):
    mine, default = open_app(page, **MINE), open_app(page)
    assert any("ANALYTIC what-if" in i.value for i in mine.info)
    assert not any("ANALYTIC what-if" in i.value for i in default.info)

    def shown(at):
        return [x.value for x in (*at.success, *at.warning, *at.markdown)]
    assert shown(mine) != shown(default)                # the numbers are the machine's
    assert query(mine) | MINE == query(mine)
    if page == "landscape":       # the slider spans the card and starts at it
        s = mine.slider(key="_w_vram")
        assert s.value == 24.0 and s.max >= 24.0
    if page == "compare":
        assert mine.dataframe[0].value["platform"][0].startswith("your machine (ANALYTIC, ")
        assert mine.dataframe[0].value["budget GiB"][0] == 24.0
        t = mine.dataframe[0].value
        assert list(t["tokens/s"]) == pytest.approx(list(1e3 / t["TPOT ms"]))
        assert compare_view.label(compare_view.THIS, default_profile()).startswith("this profile")


def default_profile():
    return parquet_io.read_profile(EX / "qwen3-30b-a3b-rtx4090-analytic.parquet")


def test_the_sidebar_choice_survives_page_changes_and_reaches_the_url():
    at = open_app("landscape", vram="20", op="8@100")
    assert at.slider(key="_w_vram").value == 20.0
    at.selectbox(key="_w_gpu").set_value("rtx5090").run()
    at.selectbox(key="_w_cpu").set_value("ryzen-9-9950x").run()
    assert not at.exception
    assert (query(at)["gpu"], query(at)["cpu"]) == ("rtx5090", "ryzen-9-9950x")
    for page in ("landscape", "export", "overview"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception and not at.error
        assert at.selectbox(key="_w_gpu").value == "rtx5090"
        assert at.selectbox(key="_w_cpu").value == "ryzen-9-9950x"
        assert any("rtx5090+" in i.value and "ryzen-9-9950x" in i.value for i in at.info)
        if page != "overview":     # the budget and threads chosen for the example gave way
            assert at.slider(key="_w_vram").value == 32.0          # all of the RTX 5090
            assert at.selectbox(key="_w_op").value == "16@100"     # the 9950X's 16 cores
    assert (query(at)["vram"], query(at)["op"]) == ("32", "16@100")


def test_a_catalog_model_without_an_example_gets_a_synthetic_trace():
    at = open_app(example="glm-4.5-air", quant="Q4_K_M", gpu="rtx4060ti-16gb",
                  cpu="ryzen-7-5700x")
    g = resolve_model("glm-4.5-air", "Q4_K_M")
    trace, cal = synthetic_inputs(g)
    m = mc.MachineChoice("rtx4060ti-16gb", "ryzen-7-5700x").compose()
    prof = mc.machine_profile(g, m)
    w = expected_winner(trace, cal, prof, whatif.default_budget(g, prof.platform), 8)
    assert [x.value for x in at.metric][:2] == [w.named, f"{w.tpot_us / 1e3:.3f} ms"]
    assert any("SYNTHETIC" in c.value for c in at.caption)
    assert query(at)["example"] == "glm-4.5-air" and query(at)["quant"] == "Q4_K_M"
    # other weights in the same session: other bytes, another answer (not a cached one)
    at.selectbox(key="_w_quant").set_value("Q8_0").run()
    assert not at.exception and not at.error
    g8 = resolve_model("glm-4.5-air", "Q8_0")
    t8, c8 = synthetic_inputs(g8)
    p8 = mc.machine_profile(g8, m)
    w8 = expected_winner(t8, c8, p8, whatif.default_budget(g8, p8.platform), 8)
    assert at.metric[1].value == f"{w8.tpot_us / 1e3:.3f} ms" != f"{w.tpot_us / 1e3:.3f} ms"
    # gpt-oss-120b in its published weights, on every page
    for page in PAGES:
        at = open_app(page, example="gpt-oss-120b", quant="MXFP4_MOE", gpu="rtx5080",
                      cpu="ryzen-9-9950x", memory="ddr5-6000x2")
        assert any("ANALYTIC what-if" in i.value for i in at.info)


def test_the_weights_reprice_an_example_of_a_catalog_model(qwen):
    at = open_app(quant="Q4_K_M")
    g = resolve_model("qwen3-30b-a3b", "Q4_K_M")
    prof = analytic_for_model(default_profile(), g)
    tr, cal = (t.with_model(g) for t in qwen)
    w = expected_winner(tr, cal, prof, whatif.default_budget(g, prof.platform),
                        prof.choose()[0])
    assert at.metric[1].value == f"{w.tpot_us / 1e3:.3f} ms"
    assert any("Q4_K_M" in c.value for c in at.caption)


def test_nonsense_in_the_url_falls_back_to_the_defaults():
    at = open_app(gpu="rtx9999", cpu="pentium", quant="Q1")
    assert query(at)["gpu"] == mc.EXAMPLE and query(at)["quant"] == mc.AS_IS
    assert not [i for i in at.info if "Your machine" in i.value]


def test_a_card_too_small_for_the_model_says_so():
    g = resolve_model("deepseek-v3", "Q4_K_M")
    # its non-expert weights 9.7 GiB, MLA's 0.27 GiB cache at 4096 tokens, the workspace
    assert whatif.budget_gib(g, 0) > 8.0
    at = open_app("landscape", example="deepseek-v3", quant="Q4_K_M", gpu="rtx3070",
                  cpu="ryzen-7-5700x")
    assert any("Your GPU's 8 GiB is less than the 10.5 GiB that K = 0 needs" in i.value
               for i in at.info)
    assert at.slider(key="_w_vram").value == 10.5


MY_CARD = {"kind": "gpu", "label": "My card", "vendor": "nvidia", "memory": "20 GiB",
           "bandwidth_gbs": 600, "fp16_tflops": 60.0, "flops_kind": "tensor-fp32acc",
           "flops_basis": "published", "pcie_gen": 4, "pcie_lanes": 16,
           "source": "vendor data sheet"}


def test_a_gpu_the_catalog_lacks_from_a_part_file(qwen, tmp_path):
    import json

    from cope_core.parts import read_part_file
    at = open_app()
    box = next(u for u in at.file_uploader if u.key == "_up_part")
    box.set_value(("my-card.json", json.dumps(MY_CARD).encode(), "application/json")).run()
    assert not at.exception and not at.error
    assert "My card · 20 GiB (your part file)" in at.selectbox(key="_w_gpu").options
    at.selectbox(key="_w_gpu").set_value(mc.FILE).run()
    at.selectbox(key="_w_cpu").set_value("ryzen-7-5700x").run()
    assert not at.exception and not at.error
    path = tmp_path / "my-card.json"
    path.write_text(json.dumps(MY_CARD))
    m = compose_machine(gpu=read_part_file(path), cpu="ryzen-7-5700x")
    prof = mc.machine_profile(qwen[0].model, m)
    w = expected_winner(*qwen, prof, 20.0, 8)           # all of its 20 GiB, 8 cores
    assert at.metric[1].value == f"{w.tpot_us / 1e3:.3f} ms"
    assert any("my-card+pcie4x16+ryzen-7-5700x" in i.value for i in at.info)
    assert query(at)["gpu"] == mc.FILE


def test_a_bad_part_file_is_one_error_line_without_a_server_path():
    at = open_app()
    box = next(u for u in at.file_uploader if u.key == "_up_part")
    box.set_value(("broken.json", b'{"kind": "gpu", "label": "x"}', "application/json")).run()
    assert not at.exception
    assert len(at.error) == 1 and "broken.json" in at.error[0].value
    assert "cope-app-parts" not in at.error[0].value and "/tmp" not in at.error[0].value
    assert not any("your part file" in o for o in at.selectbox(key="_w_gpu").options)


def test_a_longer_context_leaves_less_of_the_card_to_experts(qwen):
    g = qwen[0].model                  # Qwen3-30B-A3B: 48 blocks x 4 KV heads x 128 x 2 bytes
    per_token = 2 * 48 * 4 * 128 * 2   # K and V
    assert whatif.kv_shift_gib(g, 32768) == per_token * (32768 - 4096) / 2**30 == 2.625
    assert whatif.kv_shift_gib(g, 4096) == 0.0 and whatif.kv_shift_gib(g, None) == 0.0
    plat = {"gpu": "rtx3090", "vram_gib": 24.0, "context": 32768}
    assert whatif.default_budget(g, plat) == 21.25          # 24 - 2.625, on the slider's step
    assert whatif.context_note(g, {**plat, "context": 4096}) is None
    at = open_app("landscape", **MINE, ctx="32768")
    assert at.slider(key="_w_vram").value == 21.25
    assert any("At 32768 tokens of context the KV cache takes 2.62 GiB more" in c.value
               for c in at.caption)
    assert any("a 32768-token context" in i.value for i in at.info)
    assert query(at)["ctx"] == "32768"
    at.switch_page("pages/overview.py").run()
    m = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2",
                        link="pcie4x16")
    w = expected_winner(*qwen, mc.machine_profile(g, m), 21.25, 8)
    assert at.metric[1].value == f"{w.tpot_us / 1e3:.3f} ms"
    # back to 4096 tokens in the session: the budget is all of the card again
    at.number_input(key="_w_ctx").set_value(4096).run()
    at.switch_page("pages/landscape.py").run()
    assert at.slider(key="_w_vram").value == 24.0


# --- several cards (issue 72) ---------------------------------------------------------------
def test_more_cards_are_catalog_names_or_one_error_line():
    assert mc.more_cards("") == ()
    assert mc.more_cards(" RTX3090, rtx3060-12gb ") == ("rtx3090", "rtx3060-12gb")
    with pytest.raises(Exception, match="unknown card 'rtx9999'; nearest"):
        mc.more_cards("rtx3090,rtx9999")
    with pytest.raises(Exception, match="unknown card"):
        mc.more_cards("/etc/passwd")                 # never a path read on the server
    choice = mc.MachineChoice(gpu="rtx3090", cpu="ryzen-9-7950x", more=("rtx3060-12gb",))
    assert [g.name for g, _ in choice.compose().cards] == ["rtx3090", "rtx3060-12gb"]
    assert choice.parts_key.startswith("rtx3090,rtx3060-12gb+")


def test_the_overview_places_llamacpp_across_the_cards():
    at = open_app(example="qwen3-235b-a22b", quant="Q4_K_M", gpu="rtx3090",
                  more="rtx3060-12gb", cpu="ryzen-9-7950x", memory="ddr5-6000x2")
    assert query(at)["more"] == "rtx3060-12gb"
    assert any("across 2 cards" in h.value for h in at.subheader)
    (cmd,) = [c.value for c in at.code if "-ts" in c.value]
    assert cmd.startswith("llama-server") and "-ot" in cmd
    table = [d.value for d in at.dataframe if "device" in d.value.columns][0]
    assert list(table["device"]) == ["CUDA0", "CUDA1"]
    assert (table["GiB used"] <= table["of GiB"]).all()
    assert table["GiB used"][0] > table["GiB used"][1]      # the 24 GB card holds more
    assert not at.error


def test_a_bad_card_in_the_sidebar_is_one_error():
    at = open_page(ROOT / "app.py", None, gpu="rtx3090", more="rtx3090,nonsense",
                   cpu="ryzen-9-7950x")
    assert any("unknown card 'nonsense'" in e.value for e in at.sidebar.error)
    assert not [h for h in at.subheader if "cards" in h.value]


def test_more_cards_survive_every_page_and_stay_in_the_url():
    at = open_app(gpu="rtx3090", cpu="ryzen-9-7950x", memory="ddr5-6000x2")
    at.text_input(key="_w_more").set_value("rtx3060-12gb").run()
    assert query(at)["more"] == "rtx3060-12gb"
    for page in ("matrix", "landscape", "export", "compare", "profiles", "traces", "measured",
                 "overview"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception and not at.error, page
        assert at.text_input(key="_w_more").value == "rtx3060-12gb", page
        assert query(at)["more"] == "rtx3060-12gb", page
    assert any("across 2 cards" in h.value for h in at.subheader)   # back on the Overview
