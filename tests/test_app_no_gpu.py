"""The sidebar's "no GPU" machine (issue 40): every page answers for the CPU alone with the
answer ``cope advise --gpu none`` gives (the same library call), says what no GPU means there,
and the choice is in the URL and survives page changes."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from cope_core import parquet_io, parts
from cope_core.app import machine_choice as mc
from cope_core.app import no_gpu
from cope_core.app.apptest import open_clean, url_settings
from cope_core.estimate.cpu_only import cpu_only_price
from cope_core.export.advising import advise
from cope_core.machine import compose_machine

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "data" / "examples"
NONE = {"gpu": "none", "cpu": "ryzen-7-5700x", "memory": "ddr4-3200x2"}
PAGES = ("overview", "matrix", "landscape", "measured", "traces", "profiles", "compare",
         "export")
TITLES = {"overview": "COPE Explorer", "matrix": "Policy Matrix",
          "landscape": "Landscape: what-if VRAM budgets", "measured": "Predicted vs measured",
          "traces": "Traces", "profiles": "Profiles", "compare": "Compare platforms",
          "export": "Export a policy"}


open_app = functools.partial(open_clean, ROOT / "app.py")
query = url_settings


@pytest.fixture(scope="module")
def qwen():
    return tuple(parquet_io.read_trace(EX / f"qwen3-30b-a3b-{s}.parquet")
                 for s in ("trace", "calibration"))


@pytest.fixture(scope="module")
def expected(qwen):
    """tokens/s of the 5700X with dual-channel DDR4-3200 at its 8 cores, priced directly."""
    p = cpu_only_price(qwen[0].model, parts.cpu_part("ryzen-7-5700x"),
                       parts.memory_part("ddr4-3200x2"), 8, float(qwen[0].context.mean()))
    return 1e6 / p.tpot_us


# --- pure logic ---------------------------------------------------------------------------------
def test_no_gpu_is_a_gpu_choice_that_composes_a_cpu_only_machine():
    assert mc.NO_GPU in mc.gpu_options() and mc.gpu_label(mc.NO_GPU) == "no GPU (CPU only)"
    c = mc.MachineChoice(mc.NO_GPU, "ryzen-7-5700x", "ddr4-3200x2")
    m = c.compose()
    assert c.cpu_only and m.cpu_only and m.spec is None and m.threads == 8
    assert not mc.MachineChoice("rtx3090").cpu_only


def test_the_answer_is_cope_advise_s(qwen, expected):
    c = mc.MachineChoice(mc.NO_GPU, "ryzen-7-5700x", "ddr4-3200x2")
    a = no_gpu.cpu_only_advice(*qwen, c)
    ref = advise(qwen[0].model, compose_machine(gpu=None, cpu="ryzen-7-5700x",
                                                memory="ddr4-3200x2"),
                 trace=qwen[0], calibration=qwen[1])
    assert a.to_dict() == ref.to_dict()
    assert a.baseline.tokens_per_s == pytest.approx(expected, rel=1e-12)
    assert f"**{expected:.1f} tokens/s**" in no_gpu.headline(a)
    rows = {r["runtime"]: r for r in no_gpu.answer_rows(a)}
    assert rows["llama.cpp"]["command"] == "llama-server -m MODEL.gguf -ngl 0 -t 8"
    assert rows["llama.cpp"]["tokens/s"] == round(expected, 1)
    assert rows["vllm"]["command"] == "—" and rows["vllm"]["tokens/s"] is None


def test_every_page_title_has_its_note():
    assert set(no_gpu.PAGES) == set(TITLES.values())
    assert no_gpu.page_note("Traces")[1] is False
    assert no_gpu.page_note("Policy Matrix")[1] is True
    assert no_gpu.page_note("a new page")[0].startswith("**No GPU.**")


# --- the app ------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES)
def test_every_page_answers_for_the_cpu_alone(page, expected):
    at = open_app(page, **NONE)
    note, stops = no_gpu.page_note(TITLES[page])
    assert any(i.value == note for i in at.info)          # what no GPU means on this page
    assert any(f"{expected:.1f} tokens/s" in s.value for s in at.success)
    assert query(at) | NONE == query(at)                   # the choice is in the URL
    assert at.selectbox(key="_w_gpu").value == mc.NO_GPU
    assert not [s for s in at.sidebar.selectbox if s.key == "_w_pcie"]     # no slot
    if stops:     # nothing after the answer: no chart, no metric, no GPU candidate
        assert not at.metric and not at.get("plotly_chart")
    else:
        assert at.get("plotly_chart")                      # the routing is shown as usual
    if page == "matrix":
        assert "does not apply" in note and "GPU residency" not in note  # said in words
        assert "rows say which experts reside on the GPU" in note


def test_no_gpu_survives_page_changes_and_other_parts():
    at = open_app("matrix", **NONE)
    at.selectbox(key="_w_cpu").set_value("ryzen-9-9950x").run()
    at.selectbox(key="_w_memory").set_value("ddr5-6000x2").run()
    for page in ("export", "overview"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception and not at.error
        assert at.selectbox(key="_w_gpu").value == mc.NO_GPU
        assert (query(at)["gpu"], query(at)["cpu"], query(at)["memory"]) == \
            ("none", "ryzen-9-9950x", "ddr5-6000x2")
    c = mc.MachineChoice(mc.NO_GPU, "ryzen-9-9950x", "ddr5-6000x2")
    qwen = [parquet_io.read_trace(EX / f"qwen3-30b-a3b-{s}.parquet")
            for s in ("trace", "calibration")]
    a = no_gpu.cpu_only_advice(*qwen, c)
    assert any(no_gpu.headline(a) == s.value for s in at.success)
    rows = at.dataframe[0].value
    assert list(rows["command"])[0] == "llama-server -m MODEL.gguf -ngl 0 -t 16"
    at.selectbox(key="_w_gpu").set_value("rtx3090").run()   # back to a GPU: the pages again
    assert not at.exception and not at.error
    assert at.metric and not any(i.value.startswith("**No GPU.**") for i in at.info)
