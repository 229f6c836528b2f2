"""Prompt processing as llama.cpp runs it (issue 63, first part): physical batches of -ub (at
most -b) tokens, op offload's copies of the host layers' experts for batches of 32 tokens or
more (every expert before b6220, the used ones since), the CPU path otherwise."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cope_core.errors import CopeInputError
from cope_core.llamacpp import Build
from cope_core.llamacpp.answer.prompt import (
    PromptRun,
    card_efficiency,
    distinct_experts,
    offloads,
    prompt_experts,
    prompt_time,
)
from cope_core.llamacpp.answer.prompt_rates import (
    FULL_OFFLOAD_ROWS,
    PINNED_LINK_EFFICIENCY,
    copy_bandwidth,
    fitted,
    host_pinned,
    link_generation,
    staging_bandwidth,
    unpriced_reason,
    warm_share,
)
from cope_core.machine import compose_machine
from cope_core.models import resolve_model

G = resolve_model("qwen3-30b-a3b", "Q4_K_M")
SPEC = compose_machine(gpu="rtx3090", cpu="ryzen-9-7950x").spec


def test_a_prompt_in_physical_batches():
    assert PromptRun(1000, n_ubatch=512).chunks() == [(512, 0), (488, 512)]
    assert PromptRun(1000, depth=4096, n_ubatch=512).chunks() == [(512, 4096), (488, 4608)]
    assert PromptRun(4096, n_ubatch=8192).chunks() == [(2048, 0), (2048, 2048)]    # -b 2048
    assert PromptRun(4096, n_ubatch=8192, n_batch=8192).chunks() == [(4096, 0)]
    with pytest.raises(CopeInputError, match="n_ubatch"):
        PromptRun(512, n_ubatch=0)


def test_distinct_experts_by_hand():
    assert distinct_experts(1, 128, 8) == pytest.approx(8)
    assert distinct_experts(2, 4, 2) == pytest.approx(3)              # 4 (1 - (1/2)^2)
    assert distinct_experts(10_000, 128, 8) == pytest.approx(128)
    assert distinct_experts(5, 0, 0) == 0.0


def test_when_the_gpu_runs_the_host_experts():
    run = PromptRun(512)
    assert not offloads(run, 31, Build(12000, "t")) and offloads(run, 32, Build(12000, "t"))
    assert not offloads(PromptRun(512, op_offload=False), 512, Build(12000, "t"))
    assert not offloads(run, 512, Build(2453, "t")) and offloads(run, 512, Build(2454, "t"))


def test_every_expert_crosses_the_link_before_b6220_the_used_ones_since():
    run = PromptRun(1024, n_ubatch=512)
    old = prompt_time(G, SPEC, 10, run, Build(6219, "t"))
    new = prompt_time(G, SPEC, 10, run, Build(6220, "t"))
    link = copy_bandwidth(SPEC, pinned=False)      # llama.cpp's default: mmap, pageable
    latency = 2 * 10 * SPEC.link_latency_us * 1e-6          # each batch, each host layer
    assert old.copy_s == pytest.approx(2 * 10 * G.n_experts * G.expert_bytes / link + latency)
    used = distinct_experts(512, G.n_experts, G.top_k)
    assert new.copy_s == pytest.approx(2 * 10 * used * G.expert_bytes / link + latency)
    assert new.copy_s < old.copy_s and old.cpu_s == new.cpu_s == 0.0


def test_load_modes_that_leave_host_experts_pinned():
    """src/llama-model-loader.cpp demotes the host buffer under mmap; auto is mmap on a discrete
    GPU; --no-host bypasses the host buffer."""
    assert [host_pinned(m) for m in ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")] \
        == [False, True, False, True, False, True]
    assert not host_pinned("none", no_host=True)
    with pytest.raises(CopeInputError, match="load_mode"):
        host_pinned("never")


def test_the_copy_from_pinned_and_from_pageable_memory_by_hand():
    assert link_generation(SPEC) == 4
    pinned = copy_bandwidth(SPEC, pinned=True)
    assert pinned == pytest.approx(SPEC.link_bandwidth * 0.83)
    assert PINNED_LINK_EFFICIENCY[4].value == 0.83
    # pageable: the driver's staging copy, at most half the host's bandwidth and one thread's
    staging = min(SPEC.cpu_bandwidth / 2, SPEC.cpu_bandwidth_per_thread)
    assert staging_bandwidth(SPEC) == staging
    assert copy_bandwidth(SPEC, pinned=False) == pytest.approx(
        min(pinned, fitted("pageable_share") * staging))
    # a slower memory clock slows the pageable copy, never the pinned one
    slow_mem = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-2133x2").spec
    fast_mem = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3000x2").spec
    assert staging_bandwidth(slow_mem) == pytest.approx(34.128e9 / 2)
    assert copy_bandwidth(slow_mem, pinned=False) < copy_bandwidth(fast_mem, pinned=False)
    assert copy_bandwidth(slow_mem, pinned=True) == copy_bandwidth(fast_mem, pinned=True)
    import dataclasses
    slow = dataclasses.replace(SPEC, host_copy_bandwidth=2e9)          # a refit's host rate
    assert copy_bandwidth(slow, pinned=False) == 2e9
    assert copy_bandwidth(slow, pinned=True) == pytest.approx(pinned)  # pinned: the link's
    run = PromptRun(4096, n_ubatch=512)
    a = prompt_time(G, slow, 24, run)
    b = prompt_time(G, slow, 24, PromptRun(4096, n_ubatch=512, pinned=True))
    assert a.gpu_s == b.gpu_s and a.copy_s > b.copy_s


def test_a_ubatch_touches_only_the_warm_experts_of_gpt_oss():
    oss = resolve_model("gpt-oss-20b", "MXFP4_MOE")
    assert warm_share("gpt-oss-20b") == 0.65 and warm_share("qwen3-30b-a3b") == 1.0
    # 0.65 x 32 = 20.8 -> 21 warm experts, 4 drawn per token: all 21 after many tokens
    assert prompt_experts(4096, oss, None, range(0, 3)) == pytest.approx(3 * 21, rel=1e-6)
    assert prompt_experts(1, oss, None, range(0, 1)) == pytest.approx(4)
    # Qwen3: every expert, as independent draws touch them
    assert prompt_experts(512, G, None, range(0, 2)) == pytest.approx(
        2 * distinct_experts(512, G.n_experts, G.top_k))


def test_each_card_s_prompt_rate_reproduces_its_published_run():
    import dataclasses
    for r in FULL_OFFLOAD_ROWS:
        g = resolve_model(r.model, r.quant)
        spec = dataclasses.replace(compose_machine(gpu=r.gpu, cpu="ryzen-9-7950x").spec,
                                   gpu_prompt_efficiency=card_efficiency(r.gpu))
        run = PromptRun(r.n_prompt, n_ubatch=r.ubatch, n_batch=max(r.ubatch, 2048))
        assert prompt_time(g, spec, 0, run).tokens_per_s == pytest.approx(r.tokens_per_s,
                                                                           rel=1e-3)
    # a card without a row: its vendor's median (the RX 7900 XTX is the one AMD row)
    assert card_efficiency("rx9070xt") == card_efficiency("rx7900xtx")


def test_attention_by_family_by_hand():
    """gpt-oss: every other layer attends to at most its 128-token window; Qwen3.5: one layer in
    four attends at all; a full-attention model: every layer to the whole context."""
    from cope_core.llamacpp.answer.prompt import _attention_flops
    oss = resolve_model("gpt-oss-20b", "MXFP4_MOE")
    hd = oss.n_heads * oss.head_dim
    full = 4.0 * 512 * (32768 + 256) * hd
    window = 4.0 * 512 * 128 * hd
    assert _attention_flops(oss, 512, 32768) == pytest.approx(full / 2 + window / 2)
    q35 = resolve_model("qwen3.5-35b-a3b", "Q4_K_M")
    assert _attention_flops(q35, 512, 0) == pytest.approx(
        4.0 * 512 * 256 * q35.n_heads * q35.head_dim / 4)
    assert _attention_flops(G, 100, 900) == pytest.approx(4.0 * 100 * 950 * G.n_heads
                                                          * G.head_dim)


def test_a_backend_that_cannot_be_priced_says_why():
    assert "20292" in unpriced_reason("qwen3.5-35b-a3b", "amd")
    assert unpriced_reason("qwen3.5-35b-a3b", "nvidia") is None
    assert unpriced_reason("gpt-oss-20b", "amd") is None


def test_no_host_layer_no_copy_and_the_cpu_path_without_op_offload():
    run = PromptRun(2048, n_ubatch=512)
    assert prompt_time(G, SPEC, 0, run).copy_s == 0.0
    off = prompt_time(G, SPEC, 24, PromptRun(2048, n_ubatch=512, op_offload=False, threads=16))
    assert off.copy_s == 0.0 and off.cpu_s > 0 and not off.offloaded
    small = prompt_time(G, SPEC, 24, PromptRun(2048, n_ubatch=16, threads=16))
    assert small.copy_s == 0.0 and small.cpu_s > 0


def test_each_batch_launches_every_blocks_kernels_once():
    """The fixed cost per batch, by hand: the spec's launches at zero FLOP and byte cost."""
    import dataclasses
    free = dataclasses.replace(SPEC, gpu_flops=1e30, gpu_bandwidth=1e30)
    launches = (G.dense_layers + G.n_layers) * SPEC.gpu_kernels_per_block \
        + G.n_layers * SPEC.gpu_kernels_per_expert_group
    for ub, batches in ((512, 4), (2048, 1)):
        t = prompt_time(G, free, 0, PromptRun(2048, n_ubatch=ub))
        assert t.gpu_s == pytest.approx(batches * launches * SPEC.gpu_launch_us * 1e-6,
                                        rel=1e-6)
    # the CPU path: a synchronisation and a hand-off per host layer and batch, beside its work
    cpu = prompt_time(G, free, 3, PromptRun(64, n_ubatch=16, threads=8))
    work = prompt_time(G, dataclasses.replace(free, gpu_sync_us=0.0, cpu_dispatch_us=0.0), 3,
                       PromptRun(64, n_ubatch=16, threads=8))
    assert cpu.cpu_s - work.cpu_s == pytest.approx(
        4 * 3 * (SPEC.gpu_sync_us + SPEC.cpu_dispatch_us) * 1e-6)


def test_a_larger_batch_amortises_the_copy_and_depth_costs_attention():
    speeds = [prompt_time(G, SPEC, 24, PromptRun(4096, n_ubatch=ub, n_batch=4096)).tokens_per_s
              for ub in (64, 256, 1024, 4096)]
    assert speeds == sorted(speeds)
    shallow = prompt_time(G, SPEC, 0, PromptRun(512))
    deep = prompt_time(G, SPEC, 0, PromptRun(512, depth=32768))
    assert deep.seconds > shallow.seconds
    with pytest.raises(CopeInputError, match="--n-cpu-moe"):
        prompt_time(G, SPEC, G.n_layers + 1, PromptRun(512))


@pytest.mark.parametrize("script", ["published_pp.py", "vulkan_pp.py"])
def test_the_generated_tables_are_current(script):
    """docs/results.md's prompt tables (published sweeps; the software Vulkan device's measured
    rows) and the request's error file are what the scripts price now."""
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "scripts" / script), "--check"],
                       capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
