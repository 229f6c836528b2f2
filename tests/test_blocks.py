"""Shared work per architecture family (cope_core/profile/blocks.py): each family's weights and
bytes per token worked out by hand from the catalog's configs, the family found by name and by
shape, and the analytic and roofline block rows built on it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tiny import exact

from cope_core.estimate import roofline
from cope_core.geometry import get_model
from cope_core.platforms import platform_spec, roofline_only
from cope_core.profile import analytic
from cope_core.profile.blocks import (
    GatedDeltaNet,
    Mla,
    SlidingWindow,
    attention_work,
    dense_block_work,
    family,
    moe_block_work,
)


def test_full_attention_is_q_k_v_o_and_the_kv_of_every_context_token():
    g = get_model("qwen3-30b-a3b")      # 32 heads, 4 KV heads of 128, hidden 2048
    assert family(g) is None
    w = moe_block_work(g, np.array([0.0, 1000.0]))
    qd, kvd = 32 * 128, 4 * 128
    assert w.params == exact(2 * qd * 2048 + 2 * kvd * 2048 + 128 * 2048)   # router, no shared
    np.testing.assert_array_equal(w.extra_bytes, [0.0, 2 * kvd * 2 * 1000])
    np.testing.assert_array_equal(w.extra_flops, [0.0, 4 * qd * 1000])


def test_qwen35_gated_deltanet_by_hand():
    g = get_model("qwen3.5-35b-a3b")
    assert isinstance(family(g), GatedDeltaNet)
    # linear layer: in_proj_qkv 2048 x (2*2048 + 4096), in_proj_z 2048 x 4096, in_proj_b and
    # in_proj_a 2048 x 32 each, conv1d 8192 x 4, out_proj 4096 x 2048
    linear = 16_777_216 + 8_388_608 + 131_072 + 32_768 + 8_388_608
    # full layer: q_proj 2048 x (16 * 256 * 2), k_proj and v_proj 2048 x 512, o_proj 4096 x 2048
    full = 16_777_216 + 2 * 1_048_576 + 8_388_608
    w = moe_block_work(g, 64)
    assert w.params == exact(0.75 * linear + 0.25 * full + 256 * 2048 + 3 * 2048 * 512)
    assert w.params == exact(35_774_464)
    # state 32 x 128 x 128 F32 and conv state 8192 x 3 F32, read and written; KV of the full layer
    state = 2 * 4 * (32 * 128 * 128 + 8192 * 3)
    assert float(w.extra_bytes) == exact(0.75 * state + 0.25 * 2 * 512 * 2 * 64)
    # the state does not grow with the context; the full layers' KV does
    grown = moe_block_work(g, 64 + 1000)
    assert float(grown.extra_bytes - w.extra_bytes) == exact(0.25 * 2 * 512 * 2 * 1000)


def test_deepseek_mla_reads_the_latent_not_per_head_kv():
    g = get_model("deepseek-v2-lite")
    assert isinstance(family(g), Mla)
    w = moe_block_work(g, 4096)
    # q_proj 2048 x 16*192, kv_a_proj_with_mqa 2048 x 576, kv_b_proj 512 x 16*256,
    # o_proj 16*128 x 2048; router 64 x 2048; two shared experts of 1408
    attn = 6_291_456 + 1_179_648 + 2_097_152 + 4_194_304
    assert w.params == exact(attn + 64 * 2048 + 2 * 3 * 2048 * 1408)
    assert float(w.extra_bytes) == exact(576 * 2 * 4096)
    assert float(w.extra_flops) == exact(2 * 16 * (576 + 512) * 4096)
    # V3 has a query LoRA: q_a_proj 7168 x 1536 and q_b_proj 1536 x 128*192
    v3 = attention_work(get_model("deepseek-v3"), 0)
    assert v3.params == exact(7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256
                              + 128 * 128 * 7168)
    # the dense prefix adds its FFN to the same attention
    d = dense_block_work(g, 4096)
    assert d.params == exact(attn + 3 * 2048 * g.dense_intermediate)


def test_gpt_oss_sliding_layers_read_at_most_the_window():
    g = get_model("gpt-oss-120b")
    assert isinstance(family(g), SlidingWindow)
    full = dataclasses.replace(g, name="plain-gqa-of-the-same-shape", n_heads=g.n_heads + 1)
    per_token = 2 * 8 * 64 * 2                    # K and V of 8 heads of 64, 2 bytes
    short, long = attention_work(g, 100), attention_work(g, 4096)
    assert float(short.extra_bytes) == exact(per_token * 100)       # within the window
    assert float(long.extra_bytes) == exact(per_token * (4096 + 128) / 2)
    assert family(full) is None


def test_a_model_file_takes_its_catalog_shapes_family():
    g = get_model("qwen3.5-35b-a3b")
    named_after_the_file = dataclasses.replace(g, name="qwen3.6-35b-a3b-ud-q4_k_m")
    assert family(named_after_the_file) == family(g)
    assert isinstance(family(get_model("deepseek-v2-lite").with_layers(4)), Mla)   # a cut
    other = dataclasses.replace(named_after_the_file, n_kv_heads=4)
    assert family(other) is None


@pytest.mark.parametrize("name", ["qwen3.5-35b-a3b", "deepseek-v2-lite", "gpt-oss-20b",
                                  "mixtral-8x7b"])
def test_analytic_block_rows_reduce_to_the_roofline_by_architecture(name):
    g = get_model(name)
    spec = roofline_only(platform_spec("h100"))
    c = analytic.consts(spec, 1)
    launches = spec.gpu_kernels_per_block * spec.gpu_launch_us      # 0 on the pure roofline
    for ctx in (64.0, 4096.0):
        assert float(analytic.moe_block(g, c, ctx)) == pytest.approx(
            float(roofline.moe_block_us(g, spec, ctx)) + launches, rel=1e-12)
