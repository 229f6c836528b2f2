"""A hybrid model's cache as llama.cpp b11434 allocates it (issue 39): a tiny random-weight
qwen35moe GGUF (three Gated DeltaNet blocks and one full-attention block, as Qwen3.5 lays them
out) read by ``read_llama_model`` and counted by ``device_memory``; the slow test loads it in
real llama.cpp on the software Vulkan device and compares the KV and recurrent-state buffers."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from llama_tools import CACHE, byte_tokenizer, missing_runtime

from cope_core.llamacpp.placement.vram import Placement, device_memory, kv_bytes, read_llama_model

MiB = 1 << 20
VK = CACHE / "llama.cpp-b11434-vulkan"
#: 4 blocks, 8 experts of 128, hidden 256; full attention 4 heads / 2 KV heads of 64; DeltaNet 2
#: key heads and 4 value heads of 32, a 4-wide convolution
N, E, HIDDEN, INTER, HEADS, KV, HD, VOCAB = 4, 8, 256, 128, 4, 2, 64, 512
KH, VH, DK, CONV = 2, 4, 32, 4


def write_tiny_qwen35moe(path: Path) -> Path:
    from gguf import GGUFWriter
    rng = np.random.default_rng(0)
    a = "qwen35moe"
    w = GGUFWriter(str(path), a)
    for k, v in (("context_length", 8192), ("embedding_length", HIDDEN), ("block_count", N),
                 ("feed_forward_length", INTER), ("attention.head_count", HEADS),
                 ("attention.head_count_kv", KV), ("attention.key_length", HD),
                 ("attention.value_length", HD), ("expert_count", E), ("expert_used_count", 2),
                 ("expert_feed_forward_length", INTER),
                 ("expert_shared_feed_forward_length", INTER), ("ssm.conv_kernel", CONV),
                 ("ssm.inner_size", VH * DK), ("ssm.state_size", DK), ("ssm.time_step_rank", VH),
                 ("ssm.group_count", KH), ("full_attention_interval", 4),
                 ("rope.dimension_count", HD // 4)):
        w.add_uint32(f"{a}.{k}", v)
    w.add_array(f"{a}.rope.dimension_sections", [4, 2, 2, 0])
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_file_type(1)
    byte_tokenizer(w, VOCAB)

    def t(name: str, *shape: int, dtype=np.float16) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(dtype))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))
    t("token_embd.weight", VOCAB, HIDDEN)
    ones("output_norm.weight", HIDDEN)
    t("output.weight", VOCAB, HIDDEN)
    kd, vd = KH * DK, VH * DK
    for b in range(N):
        p = f"blk.{b}."
        ones(p + "attn_norm.weight", HIDDEN)
        ones(p + "post_attention_norm.weight", HIDDEN)
        if (b + 1) % 4 == 0:
            t(p + "attn_q.weight", HEADS * HD * 2, HIDDEN)
            t(p + "attn_k.weight", KV * HD, HIDDEN)
            t(p + "attn_v.weight", KV * HD, HIDDEN)
            t(p + "attn_output.weight", HIDDEN, HEADS * HD)
            ones(p + "attn_q_norm.weight", HD)
            ones(p + "attn_k_norm.weight", HD)
        else:
            t(p + "attn_qkv.weight", 2 * kd + vd, HIDDEN)
            t(p + "attn_gate.weight", vd, HIDDEN)
            t(p + "ssm_conv1d.weight", 2 * kd + vd, CONV, dtype=np.float32)
            t(p + "ssm_dt.bias", VH, dtype=np.float32)
            t(p + "ssm_a", VH, dtype=np.float32)
            t(p + "ssm_beta.weight", VH, HIDDEN)
            t(p + "ssm_alpha.weight", VH, HIDDEN)
            ones(p + "ssm_norm.weight", DK)
            t(p + "ssm_out.weight", HIDDEN, vd)
        t(p + "ffn_gate_inp.weight", E, HIDDEN, dtype=np.float32)
        t(p + "ffn_gate_inp_shexp.weight", HIDDEN, dtype=np.float32)
        t(p + "ffn_gate_exps.weight", E, INTER, HIDDEN)
        t(p + "ffn_up_exps.weight", E, INTER, HIDDEN)
        t(p + "ffn_down_exps.weight", E, HIDDEN, INTER)
        t(p + "ffn_gate_shexp.weight", INTER, HIDDEN)
        t(p + "ffn_up_shexp.weight", INTER, HIDDEN)
        t(p + "ffn_down_shexp.weight", HIDDEN, INTER)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_qwen35moe(tmp_path_factory.mktemp("hybrid") / "tiny-qwen35moe.gguf")


# n_embd_r = (d_conv - 1)(d_inner + 2 n_group d_state), n_embd_s = d_state d_inner (F32)
STATE = (CONV - 1) * (VH * DK + 2 * KH * DK) + DK * VH * DK


def test_only_the_full_attention_block_caches_k_and_v(tiny):
    m = read_llama_model(tiny)
    assert m.kv_widths == ((0, 0),) * 3 + ((KV * HD, KV * HD),)
    assert m.states == (STATE,) * 3 + (0,)
    # 1000 tokens: 1024 cells of K and V (f16) in block 3; each DeltaNet block's state in F32
    kv = 1024 * 2 * KV * HD * 2
    assert kv_bytes(m, range(N), 1000) == kv + 3 * 4 * STATE
    assert device_memory(m, Placement(), 1000).context == kv + 3 * 4 * STATE
    grown = kv_bytes(m, range(N), 8000) - kv_bytes(m, range(N), 1000)
    assert grown == (8192 - 1024) * 2 * KV * HD * 2        # only K and V grow


@pytest.mark.slow
def test_the_cache_llama_cpp_allocates(tiny):
    """llama-completion -v: Vulkan0's KV buffer (the full-attention block only) and RS buffer
    (the three recurrent states), to the printed 0.01 MiB."""
    exe = VK / "bin" / "llama-completion"
    if not exe.is_file():
        missing_runtime("llama.cpp b11434 with Vulkan (llama-completion) is not built",
                        "bash scripts/runtimes.sh (its Vulkan section)")
    env = dict(os.environ, LD_LIBRARY_PATH=str(VK / "bin"), GGML_VK_VISIBLE_DEVICES="0")
    m = read_llama_model(tiny)
    for ctx in (1000, 4096):
        r = subprocess.run([str(exe), "-m", str(tiny), "-c", str(ctx), "-n", "1", "-p", "w1 w2",
                            "-no-cnv", "--fit", "off", "-ngl", "-1", "-fa", "on", "-v"],
                           capture_output=True, text=True, errors="replace", env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        out = r.stdout + r.stderr
        got_kv = float(re.search(r"Vulkan0 KV buffer size = +([\d.]+) MiB", out).group(1))
        got_rs = float(re.search(r"Vulkan0 RS buffer size = +([\d.]+) MiB", out).group(1))
        assert abs(got_kv - kv_bytes(m, [3], ctx) / MiB) <= 0.006, (ctx, got_kv)
        assert abs(got_rs - 3 * 4 * STATE / MiB) <= 0.006, (ctx, got_rs)
        assert re.search(r"layer +0: filtered", out) and re.search(r"layer +3: skipped", out)
