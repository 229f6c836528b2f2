"""The context through the library's budget functions (issue 39/40): ``build_policy`` counts K
and llama.cpp's record at the context it is given, and the app turns a page's budget and the
sidebar's context into that call without moving K."""
from __future__ import annotations

import warnings

import pytest

from cope_core import parquet_io
from cope_core.app import whatif
from cope_core.export import build_policy
from cope_core.geometry import DEFAULT_CONTEXT, GIB
from cope_core.llamacpp import LlamaSettings

EX = "data/examples/olmoe-1b-7b"


@pytest.fixture(scope="module")
def files():
    return (parquet_io.read_trace(f"{EX}-trace.parquet"),
            parquet_io.read_profile(f"{EX}-rtx4090-analytic.parquet"),
            parquet_io.read_trace(f"{EX}-calibration.parquet"))


def test_build_policy_counts_k_and_llama_cpp_at_the_context(files):
    trace, profile, cal = files
    g = trace.model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        long = build_policy(trace, profile, cal, vram_gib=8.0, context=32768)
    assert long.vram["context"] == 32768 and long.vram["budget_gib"] == 8.0
    assert long.experts_per_layer == g.experts_per_layer_for_vram(8 * GIB, context=32768)
    assert long.vram["needed_gib"] == g.vram_for_experts_per_layer(long.experts_per_layer,
                                                                   context=32768) / GIB
    rec = long.llamacpp_cache
    assert rec is not None and rec.default_fit is not None
    # llama.cpp's -c, KV cache and compute buffer at 32768 tokens, not 4096
    assert rec.default_fit.n_ctx == 32768
    fixed = LlamaSettings(n_ctx=32768).fixed_bytes(g)
    assert rec.expert_budget_gib == pytest.approx((8 * GIB - fixed) / GIB, abs=1e-12)
    assert fixed > LlamaSettings().fixed_bytes(g)          # a longer context leaves less


def test_a_pages_budget_stands_for_the_card_at_the_sidebars_context():
    g = parquet_io.read_trace(f"{EX}-trace.parquet").model
    plat = {"vram_gib": 16.0, "context": 32768}
    assert whatif.context_of(plat) == 32768
    assert whatif.context_of({}) == whatif.context_of({"context": True}) == DEFAULT_CONTEXT
    assert whatif.vram_at_context(g, 5.0, None) == (5.0, DEFAULT_CONTEXT)
    for tenth in range(20, 161, 7):
        gib = tenth / 10
        vram, ctx = whatif.vram_at_context(g, gib, plat)
        assert ctx == 32768
        assert vram * GIB - g.kv_cache_bytes(32768) == pytest.approx(
            gib * GIB - g.kv_cache_bytes(DEFAULT_CONTEXT), abs=1e-3)
        # K as the page shows it (counted at 4096) is K at the card and its context
        assert g.experts_per_layer_for_vram(vram * GIB, context=ctx) == \
            whatif.k_for_budget(g, gib)
