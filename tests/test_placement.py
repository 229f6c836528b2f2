"""The one whole-layer placement rule (cope_core.placement, docs/design.md#layer-placement): hand-
worked on a geometry whose layers store different bytes, on both sides, and on the shipped Q4_K_M
header at every K: the pricing, the cache search and every export agree with it."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from tiny import make_policy, tiny_geometry

from cope_core.errors import CopeInputError
from cope_core.estimate.costs import cope_costs
from cope_core.estimate.predict import compose
from cope_core.export import render
from cope_core.geometry import ExpertTensors
from cope_core.llamacpp.cache.cache_search import search_space
from cope_core.matrix import get_candidate
from cope_core.models import read_model_file
from cope_core.parquet_io import read_profile, read_trace
from cope_core.placement import (
    CpuSide,
    LayerFlag,
    fit_layers,
    gpu_expert_bytes,
    k_budget_bytes,
    layer_plan,
)

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "data" / "models" / "qwen3-30b-a3b-Q4_K_M.header.gguf"


def _uneven(dense: int = 0):
    """4 MoE layers of 4 experts; one expert stores 3, 3, 9 and 9 bytes in layers 0..3, so a
    whole layer takes 12, 12, 36 and 36 bytes and K = 1 is worth 24 bytes."""
    def t(b: int) -> ExpertTensors:
        return ExpertTensors("Q4_K", "Q4_K", "Q6_K", b, b, b)
    g = dataclasses.replace(tiny_geometry(), n_layers=4, n_experts=4, top_k=2,
                            dense_layers=dense, weight_format="test")
    return dataclasses.replace(g, expert_layers=(t(1), t(1), t(3), t(3)))


# K:            0  1  2  3  4   (budget 0, 24, 48, 72, 96 bytes)
# FIRST side: the GPU takes the last layers (36, 36, 12, 12 from the end): 36 > 24; 36 <= 48 but
#   72 > 48; 72 <= 72; 84 > 72 -> 2 at K = 3; 96 at K = 4
# LAST side: the GPU takes the first layers (12, 12, 36, 36): 24 <= 24; 24 <= 48 but 60 > 48;
#   60 <= 72; 96 > 72 -> 3
# the old count min(K*L // E, L): 0, 1, 2, 3, 4
@pytest.mark.parametrize("K,first,last", [(0, 0, 0), (1, 0, 2), (2, 1, 2), (3, 2, 3), (4, 4, 4)])
def test_hand_worked_gpu_layers_on_each_side(K, first, last):
    g = _uneven()
    assert g.layer_expert_bytes == (3, 3, 9, 9) and k_budget_bytes(g, K) == 24 * K
    a, b = layer_plan(g, K, CpuSide.FIRST), layer_plan(g, K, CpuSide.LAST)
    assert (a.n_gpu, a.n_cpu, b.n_gpu, b.n_cpu) == (first, 4 - first, last, 4 - last)
    assert a.budget_bytes == b.budget_bytes == 24 * K
    assert a.gpu_bytes == 4 * sum((3, 3, 9, 9)[4 - first:])
    assert b.gpu_bytes == 4 * sum((3, 3, 9, 9)[:last])


def test_blocks_and_flag_numbering_with_a_dense_prefix():
    g = _uneven(dense=1)
    a, b = layer_plan(g, 2, CpuSide.FIRST), layer_plan(g, 2, CpuSide.LAST)
    assert a.cpu_blocks == (1, 2, 3) and a.gpu_blocks == (4,)
    assert b.cpu_blocks == (3, 4) and b.gpu_blocks == (1, 2)
    assert a.flag_value(LayerFlag.LLAMACPP) == a.n_cpu_moe == 4      # blocks 0..3, dense incl.
    assert a.flag_value(LayerFlag.EXLLAMAV3) == 3
    assert b.flag_value(LayerFlag.IK_LLAMACPP) == b.flag_value(LayerFlag.FASTLLM) == 2
    assert layer_plan(g, 4).n_cpu_moe == 0                           # nothing on the CPU
    with pytest.raises(ValueError, match="last"):
        a.flag_value(LayerFlag.FASTLLM)


def test_budgets_between_and_outside():
    g = _uneven()
    assert fit_layers(g, 35, CpuSide.FIRST).n_gpu == 0       # one byte short of a last layer
    assert fit_layers(g, 36, CpuSide.FIRST).n_gpu == 1
    assert fit_layers(g, 71, CpuSide.FIRST).n_gpu == 1 and fit_layers(g, 72).n_gpu == 2
    assert fit_layers(g, -5).n_gpu == 0 and fit_layers(g, 10**9).n_gpu == 4
    assert gpu_expert_bytes(g, 1, CpuSide.LAST) == 4 * (3 + 3 + 9)
    with pytest.raises(CopeInputError, match="experts per layer"):
        layer_plan(g, 5)


def _flag(text: str, flag: str) -> int:
    """The value of ``flag`` on the first command line that has it (0 when none has)."""
    for line in text.splitlines():
        if not line.startswith("#"):
            m = re.search(rf"(?:^| ){re.escape(flag)} (\d+)", line)
            if m:
                return int(m.group(1))
    return 0


def test_every_count_agrees_fits_and_is_the_largest_on_the_q4_k_m_header():
    """Done when (issue 37): at every K from 0 to E the pricing of layer_partition, the cache
    search's plain placement and every exported layer count agree, fit K's bytes and are the
    largest that do."""
    g = read_model_file(str(HEADER)).geometry
    L, E = g.n_layers, g.n_experts
    assert len(set(g.layer_expert_bytes)) == 2               # Q6_K and Q4_K ffn_down
    ex = ROOT / "data" / "examples" / "gguf-qwen3-30b-a3b-q4_k_m"
    trace = read_trace(f"{ex}-trace.parquet")
    assert trace.model.same_shape(g)
    costs = cope_costs(read_profile(f"{ex}-rtx4090-analytic.parquet").resolve(None, None, model=g))
    priced = compose(trace, {}, costs, [get_candidate("layer_partition")], ks=np.arange(E + 1))
    changed = 0
    for K in range(E + 1):
        budget = K * g.per_k_bytes
        first, last = layer_plan(g, K, CpuSide.FIRST), layer_plan(g, K, CpuSide.LAST)
        for plan in (first, last):          # fits, and one more GPU layer would not
            assert plan.gpu_bytes == gpu_expert_bytes(g, plan.n_cpu, plan.side) <= budget
            assert plan.n_cpu == 0 or gpu_expert_bytes(g, plan.n_cpu - 1, plan.side) > budget
        changed += first.n_gpu != min(K * L // E, L)
        hit = priced[priced["experts_per_layer"] == K]["hit_rate"].iloc[0]
        assert round(hit * L) == first.n_gpu                           # the pricing
        plain = [c.n_cpu for c in search_space(g, budget) if not c.cache_mib]
        assert min(plain) == first.n_cpu                                # the search
        policy = make_policy(g, K, "layer_partition")
        assert policy.layer_plan == first
        assert _flag(render(policy, "llama.cpp").text, "--n-cpu-moe") == first.n_cpu_moe
        ik = render(policy, "ik_llama.cpp").text
        assert _flag(ik, "-ncmoe") == last.n_cpu
        fast = render(policy, "fastllm").text
        assert _flag(fast, "--moe_device_layers") == last.n_cpu
        assert _flag(render(policy, "exllamav3").text, "-mcl") == first.n_cpu
    assert changed == 27          # the old count rule overshot at 19 K and undershot at 8


def test_the_llamacpp_export_says_when_the_budget_holds_more_than_ks_bytes():
    """K is the floor of what the VRAM leaves, so the search at the budget may place a layer
    more than the layer partition at K's bytes; the export says so instead of leaving two
    --n-cpu-moe values unexplained."""
    from cope_core.geometry import get_model
    from cope_core.llamacpp import CacheRecord
    g = get_model("qwen3-30b-a3b")
    pol = make_policy(g, 32, "layer_partition")
    n = pol.layer_plan.n_cpu

    def record(cpu_layers: int) -> CacheRecord:
        row = {"candidate": "layer_partition", "build": "", "cpu_layers": cpu_layers,
               "n_cpu_moe": cpu_layers, "cache_mib": 0, "cpu_share": 0.0, "slots": 0,
               "tpot_us": 8245.0, "hits": 0.0, "uploads": 0.0, "cpu_misses": 0.0}
        rec = CacheRecord.from_dict({
            "expert_budget_gib": 9.0, "configurations": 3, "cache_start": "server",
            "best": [row], "versus": [{"name": "layer_partition", "tpot_us": 8245.0,
                                       "tpot_ci_us": None, "cache_faster": None}]})
        assert rec is not None
        return rec
    text = render(dataclasses.replace(pol, llamacpp_cache=record(n - 1)), "llama.cpp").text
    assert (f"# the VRAM budget holds more than K's bytes: its plain placement, --n-cpu-moe "
            f"{n - 1} (8.245 ms/token, searched above), puts 1 more layer(s) on the GPU") in text
    text = render(dataclasses.replace(pol, llamacpp_cache=record(n)), "llama.cpp").text
    assert "holds more than K's bytes" not in text
