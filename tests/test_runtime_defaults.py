"""ik_llama.cpp's and SGLang-KT's defaults as read in their sources (issue 40; docs/design.md
"The other runtimes' defaults"): with no placement flag both keep every expert on the GPU
(ik_llama.cpp: ``-ngl`` -1 becomes 999 with a GPU, ``ncmoe`` 0, ``--fit`` off; SGLang-KT: no
``--kt-num-gpu-experts``/``--kt-gpu-experts-ratio``, no KT wrapper). So ``cope advise`` prices
their default as every expert on the GPU where the whole model fits, and says it does not load
where it does not."""
from __future__ import annotations

import pytest

from cope_core.export.advising import advise
from cope_core.export.formats import get_format
from cope_core.machine import compose_machine
from cope_core.matrix import LAYER_PARTITION
from cope_core.models import resolve_model

QWEN = "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"
RUNTIMES = ("ik_llama.cpp", "exllamav3", "sglang-kt")


@pytest.mark.parametrize("name", ["ik_llama.cpp", "sglang-kt"])
def test_the_records_say_every_expert_on_the_gpu(name):
    f = get_format(name)
    assert f.default_kind == "gpu"
    assert "every expert on the GPU" in f.default and "not read" not in f.default


def _advice(gpu: str):
    m = compose_machine(gpu=gpu, cpu="ryzen-7-5700x", memory="ddr4-3200x2", link="pcie4x16")
    return advise(resolve_model(QWEN), m, runtimes=RUNTIMES)


def test_where_the_whole_model_fits_the_default_is_every_expert_on_the_gpu():
    a = _advice("rtx3090")              # 23 GiB: Qwen3-30B-A3B Q4_K_M fits whole
    assert a.experts_per_layer == a.model.n_experts
    whole = a.policy.cope_us(LAYER_PARTITION)           # K = E: nothing on the CPU
    by = {r.runtime: r for r in a.answers}
    for name in ("ik_llama.cpp", "sglang-kt"):
        r = by[name]
        assert r.default is not None and r.default.tpot_us == whole
        assert r.default_what == get_format(name).default
        assert r.gain_over_default == pytest.approx(whole / r.speed.tpot_us, rel=1e-12)
    # ik_llama.cpp's own line places nothing on the CPU: the default, gain exactly 1
    ik = by["ik_llama.cpp"]
    assert ik.command.endswith("-ngl 999 -t 8") and ik.gain_over_default == 1.0
    # the same default as exllamav3's (every expert on the GPU without -mcs/-mcl)
    assert by["exllamav3"].default.tpot_us == whole


def test_where_it_does_not_fit_the_default_does_not_load():
    a = _advice("rtx3060-12gb")         # 11 GiB: K < E
    assert a.experts_per_layer < a.model.n_experts
    for r in a.answers:
        assert r.default is None and r.gain_over_default is None
        assert r.default_what == get_format(r.runtime).default + ": does not fit this VRAM"
        assert r.to_dict()["default_tokens_per_s"] is None
