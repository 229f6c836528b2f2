"""The ik_llama.cpp format against a replay of ik_llama.cpp's own parsing and placement
(tests/ik_tools.py: ikawrakow/ik_llama.cpp @ 8337e4cd3861406fc04e0854b1409cd1b027fbc9, which is
not on a package registry and is not built here)."""
from __future__ import annotations

import dataclasses

import pytest
from ik_tools import UnknownArgument, ik_place
from llama_tools import expert_tensor, gguf_names
from tiny import make_policy

from cope_core import parquet_io
from cope_core.export import render
from cope_core.geometry import get_model
from cope_core.placement import CpuSide, layer_plan


def _lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith("llama-server ")]


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v2-lite", "qwen3-30b-a3b"])
@pytest.mark.parametrize("frac", [0.0, 0.3, 0.9, 1.0])
def test_the_exact_line_places_the_first_layers_and_ncmoe_the_last(name, frac):
    g = get_model(name)
    K = int(frac * g.n_experts)
    policy = make_policy(g, K, "layer_partition")
    plan = policy.layer_plan
    names = gguf_names(g, scales=True)
    lines = _lines(render(policy, "ik_llama.cpp").text)
    first = {n for n in names if expert_tensor(n) in plan.cpu_blocks
             and n.endswith((".weight", ".scale"))}
    assert ik_place(lines[0], names) == first
    if plan.n_cpu:
        assert len(lines) == 2 and f"-ncmoe {plan.n_cpu}" in lines[1]
        last = set(range(g.dense_layers + plan.n_gpu, g.dense_layers + g.n_layers))
        assert {expert_tensor(n) for n in ik_place(lines[1], names)} == last
    else:
        assert len(lines) == 1 and ik_place(lines[0], names) == set()


def test_mainline_lines_do_not_parse_in_ik_llamacpp():
    g = get_model("mixtral-8x7b")
    text = render(make_policy(g, 3, "layer_partition"), "llama.cpp").text
    assert "mainline llama.cpp only" in text
    with pytest.raises(UnknownArgument, match="-fit"):
        ik_place(_lines(text)[0], gguf_names(g))


def test_a_cannot_express_candidate_falls_back_to_the_layer_partition():
    g = get_model("deepseek-v2-lite")
    r = render(make_policy(g, 20, "mutable_per_layer/ready_first"), "ik_llama.cpp")
    assert not r.exact and r.deployed == "layer_partition"
    assert "ik_llama.cpp CANNOT express mutable_per_layer/ready_first" in r.text


def test_ncmoe_fits_k_bytes_when_layers_store_their_experts_differently():
    g = parquet_io.read_trace("data/examples/gguf-qwen3-30b-a3b-q4_k_m-trace.parquet").model
    b, E = g.layer_expert_bytes, g.n_experts
    for K in range(E + 1):
        n = layer_plan(g, K, CpuSide.LAST).n_cpu
        assert E * sum(b[:g.n_layers - n]) <= K * g.per_k_bytes         # fits K's bytes
        assert n == 0 or E * sum(b[:g.n_layers - n + 1]) > K * g.per_k_bytes  # the least
    # a file whose first layers store more bytes: the last-N rule needs one more host layer
    big = dataclasses.replace(g.expert_layers[0], down_type="Q8_0",
                              down_bytes=2 * g.expert_layers[0].down_bytes)
    g2 = dataclasses.replace(g, expert_layers=(big, big) + g.expert_layers[2:])
    assert layer_plan(g2, E, CpuSide.LAST).n_cpu == 0     # everything on the GPU either way
    K = 20
    assert layer_plan(g2, K, CpuSide.LAST).n_cpu == layer_plan(g, K, CpuSide.LAST).n_cpu + 1
