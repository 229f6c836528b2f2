"""Models as users run them (docs/design.md#model-files, #bytes-as-stored): GGUF headers, HF
configs with a llama-quantize preset, bytes as stored in the memory model and the analytic
costs, and the refusals. The slow tests convert tiny HF models with llama.cpp b11434's own
converter and quantise them with its llama-quantize."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from cope_core import parquet_io
from cope_core.errors import CopeInputError
from cope_core.geometry import GIB, MIB, ExpertTensors, ModelGeometry, get_model
from cope_core.models import read_gguf, read_model_file, resolve_model
from cope_core.platforms import resolve_platform
from cope_core.profile.analytic import analytic_profile, consts, cpu_expert

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "data" / "models" / "qwen3-30b-a3b-Q4_K_M.header.gguf"
EXAMPLES = ROOT / "data" / "examples"


def _cope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cope_core.cli.main", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


# --- bytes as stored, by hand --------------------------------------------------------------------
Q4 = ExpertTensors("Q4_K", "Q4_K", "Q4_K", 144, 144, 144)      # one 256-weight block each
Q46 = ExpertTensors("Q4_K", "Q4_K", "Q6_K", 144, 144, 210)
HAND = ModelGeometry(name="hand", n_layers=2, n_experts=4, top_k=2, hidden=256,
                     expert_intermediate=1, dtype_bytes=2, n_shared_experts=0, dense_layers=0,
                     n_heads=1, n_kv_heads=1, head_dim=4, vocab=10, non_expert_bytes=1000,
                     weight_format="Q4_K_M", expert_layers=(Q4, Q46), non_expert_params=2000)


def test_hand_worked_bytes_and_k_of_a_quantised_model():
    assert HAND.layer_expert_bytes == (432, 498)
    assert HAND.per_k_bytes == 930 and HAND.expert_bytes == 465
    assert HAND.all_expert_bytes == 4 * 930
    assert HAND.weight_bytes_per_param == 0.5
    kv = HAND.kv_cache_bytes(16)          # 2 blocks x 2 (K, V) x 1 head x 4 x 2 bytes x 16
    assert kv == 512
    # 1000 non-expert + 512 KV + 0 workspace + K * 930
    assert HAND.experts_per_layer_for_vram(1000 + 512 + 3 * 930, context=16,
                                           workspace_bytes=0) == 3
    assert HAND.experts_per_layer_for_vram(1000 + 512 + 3 * 930 - 1, context=16,
                                           workspace_bytes=0) == 2
    assert HAND.vram_for_experts_per_layer(4, context=16, workspace_bytes=0) == 1512 + 3720


def test_a_stored_geometry_round_trips_and_a_16_bit_one_writes_as_before():
    assert ModelGeometry.from_dict(json.loads(json.dumps(HAND.to_dict()))) == HAND
    g = get_model("qwen3-30b-a3b")
    d = g.to_dict()
    assert "expert_layers" not in d and "weight_format" not in d
    assert ModelGeometry.from_dict(d) == g
    with pytest.raises(CopeInputError, match="expert_layers"):
        ModelGeometry.from_dict(dict(HAND.to_dict(), expert_layers=[{"gate_type": "Q4_K"}]))
    with pytest.raises(CopeInputError, match="2 layers of expert tensors for n_layers=3"):
        dataclasses.replace(HAND, n_layers=3)
    assert HAND.with_layers(1).expert_layers == (Q4,)
    with pytest.raises(CopeInputError, match="cannot grow"):
        HAND.with_layers(3)


def test_cpu_expert_cost_of_stored_types_by_hand():
    spec = resolve_platform("rtx4090", cpu="xeon-gold-6430")
    c = consts(spec, 1)
    lane, mem = float(c.cpu_lane_bw), float(c.cpu_mem_bw)
    # one thread streams less than the memory: each projection at efficiency * lane bandwidth
    stream = ((144 / 0.65 + 144 / 0.65 + 144 / 0.65) + (144 / 0.65 + 144 / 0.65 + 210 / 0.60)) / 2
    want = max(HAND.expert_flops / float(c.cpu_flops),
               stream / min(mem, lane) if lane * 0.6 > mem else stream / lane) * 1e6
    assert float(cpu_expert(HAND, c)) == pytest.approx(want, rel=1e-12)
    # a 16-bit geometry prices exactly as before: bytes over the achieved bandwidth
    g = get_model("qwen3-30b-a3b")
    assert float(cpu_expert(g, c)) == max(g.expert_flops / c.cpu_flops,
                                         g.expert_bytes / c.cpu_bw) * 1e6


def test_bf16_catalog_prices_exactly_as_the_shipped_analytic_profile():
    shipped = parquet_io.read_profile(EXAMPLES / "qwen3-30b-a3b-rtx4090-analytic.parquet")
    again = analytic_profile(get_model("qwen3-30b-a3b"),
                             resolve_platform("rtx4090", cpu="xeon-gold-6430"),
                             cpu_threads=sorted(set(shipped.table["cpu_threads"])))
    key = ["kind", "name", "hits", "cpu", "staged", "count", "context", "cpu_threads",
           "gpu_share"]
    def rows(t):
        return {tuple(r[:-1]): r[-1] for r in t[key + ["median_us"]].astype(object)
                .itertuples(index=False)}
    a, b = rows(shipped.table), rows(again.table)
    assert len(a) == len(shipped.table) > 1000 and a == {k: b[k] for k in a}


def test_presets_match_the_published_qwen3_30b_q4_k_m_file():
    g = read_gguf(HEADER).geometry
    # unsloth's Qwen3-30B-A3B-Q4_K_M.gguf: 17.28 GiB of tensors (docs/design.md#model-files)
    assert g.all_expert_bytes + g.non_expert_bytes == 18_550_716_416
    assert (g.n_layers, g.n_experts, g.top_k, g.hidden, g.expert_intermediate) == \
        (48, 128, 8, 2048, 768)
    assert g.expert_layers[0] == ExpertTensors("Q4_K", "Q4_K", "Q6_K", 884_736, 884_736,
                                               1_290_240)
    assert g.expert_layers[6].down_type == "Q4_K"
    assert resolve_model("qwen3-30b-a3b", "Q4_K_M").expert_layers == g.expert_layers
    assert read_model_file(str(HEADER)).header_only
    # the header's K at 16 GiB, by hand: (16 GiB - non-expert - KV - 0.5 GiB) // per-K bytes
    free = 16 * GIB - g.non_expert_bytes - g.kv_cache_bytes(4096) - 512 * MIB
    assert g.experts_per_layer_for_vram(16 * GIB) == free // g.per_k_bytes == 111


# --- bad files ------------------------------------------------------------------------------------
def _write(path: Path, arch: str, keys: dict, tensors: list[tuple[str, tuple, str]]) -> Path:
    w = GGUFWriter(str(path), arch)
    for k, v in keys.items():
        w.add_uint32(f"{arch}.{k}", v)
    for name, shape, t in tensors:
        qt = GGMLQuantizationType[t]
        w.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32),
                          int(np.prod(shape)) * (4 if t == "F32" else 2), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


MOE_KEYS = {"block_count": 1, "expert_count": 2, "expert_used_count": 1,
            "embedding_length": 8, "attention.head_count": 2}
MOE_TENSORS = [("token_embd.weight", (8, 10), "F16")] + [
    (f"blk.0.ffn_{p}_exps.weight", (8, 4, 2) if p != "down" else (4, 8, 2), "F16")
    for p in ("gate", "up", "down")]


def test_a_header_made_by_the_gguf_writer_reads(tmp_path):
    g = read_gguf(_write(tmp_path / "m.gguf", "qwen3moe", MOE_KEYS, MOE_TENSORS)).geometry
    assert (g.n_layers, g.n_experts, g.top_k, g.hidden, g.expert_intermediate, g.vocab) == \
        (1, 2, 1, 8, 4, 10)
    assert g.expert_layers == (ExpertTensors("F16", "F16", "F16", 64, 64, 64),)
    assert g.non_expert_bytes == 160 and g.non_expert_params == 80


@pytest.mark.parametrize("case, message", [
    ("unknown", "general.architecture.*unknown architecture 'foo'"),
    ("dense", "a dense model"),
    ("missing", "qwen3moe.expert_used_count.*missing key"),
    ("truncated", "truncated or damaged"),
    ("text", "not a GGUF"),
    ("width", "blk.0.ffn_gate_exps.weight.*embedding_length is 16"),
])
def test_bad_files_give_one_line_errors(tmp_path, case, message):
    path = tmp_path / "bad.gguf"
    if case == "unknown":
        _write(path, "foo", MOE_KEYS, MOE_TENSORS)
    elif case == "dense":
        _write(path, "llama", {"block_count": 1, "embedding_length": 8},
               [("token_embd.weight", (8, 10), "F16"), ("blk.0.ffn_up.weight", (8, 4), "F16")])
    elif case == "missing":
        _write(path, "qwen3moe", {k: v for k, v in MOE_KEYS.items() if k != "expert_used_count"},
               MOE_TENSORS)
    elif case == "truncated":
        full = _write(tmp_path / "full.gguf", "qwen3moe", MOE_KEYS, MOE_TENSORS).read_bytes()
        path.write_bytes(full[:100])
    elif case == "text":
        path.write_text("not a model\n")
    else:
        _write(path, "qwen3moe", dict(MOE_KEYS, embedding_length=16), MOE_TENSORS)
    with pytest.raises(CopeInputError, match=message) as info:
        read_model_file(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    r = _cope("models", "--show", path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


# --- HF configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                                    "deepseek_v3", "olmoe", "gpt_oss"])
def test_hf_config_parameter_counts_match_the_real_model_classes(tmp_path, family):
    torch = pytest.importorskip("torch")
    from cope_core.trace.sources.tiny_models import build_tiny_model
    folder = build_tiny_model(family, tmp_path / family, layers=3, seed=0)
    import transformers as tf
    model = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    experts = {id(p) for layer in model.model.layers
               if hasattr(layer.mlp, "experts") for p in layer.mlp.experts.parameters()}
    # what a checkpoint stores: the parameters and the persistent buffers (DeepSeek-V3's
    # e_score_correction_bias), tied tensors once
    stored = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    non_expert = sum(t.numel() for i, t in stored.items() if i not in experts)
    g = read_model_file(str(folder)).geometry
    assert g.non_expert_bytes == non_expert * g.dtype_bytes
    routed = sum(t.numel() for i, t in stored.items() if i in experts)
    assert g.all_expert_bytes == routed * g.dtype_bytes


# --- the command line and the refusals ------------------------------------------------------------
def test_predict_prices_the_routing_as_the_quantised_file_and_refuses_a_16_bit_profile(tmp_path):
    prof = tmp_path / "q4.parquet"
    r = _cope("profile", "--analytic", "--gpu", "rtx4090", "--model", HEADER, "-o", prof,
              "--threads", "8")
    assert r.returncode == 0, r.stderr
    trace = EXAMPLES / "qwen3-30b-a3b-trace.parquet"
    r = _cope("predict", "--trace", trace, "--profile", prof, "--model", HEADER,
              "--vram-gib", "16", "--draws", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert {row["experts_per_layer"] for row in json.loads(r.stdout)} == {111}
    r = _cope("predict", "--trace", trace, "--model", HEADER, "--vram-gib", "16",
              "--profile", EXAMPLES / "qwen3-30b-a3b-rtx4090-analytic.parquet")
    assert r.returncode == 2 and "profile priced 16-bit weights" in r.stderr
    assert r.stderr.count("\n") == 1
    r = _cope("vram", "--model", HEADER, "--gib", "16", "--json")
    assert json.loads(r.stdout)["experts_per_layer"] == 111
    r = _cope("vram", "--model", "qwen3-30b-a3b", "--quant", "Q9_Z", "--gib", "16")
    assert r.returncode == 2 and "unknown format 'Q9_Z'" in r.stderr


def test_the_torch_path_refuses_quantised_experts():
    pytest.importorskip("torch")
    from cope_core.mechanisms.weights import model_dtype
    with pytest.raises(CopeInputError, match="Q4_K"):
        model_dtype(HAND)


# --- real GGUF files: llama.cpp b11434's converter and llama-quantize -----------------------------
@pytest.fixture(scope="module")
def quantised(tmp_path_factory):
    from llama_tools import LLAMA, convert, missing_runtime, quantize, sentencepiece_tokenizer
    if not (LLAMA / "bin" / "llama-quantize").is_file():
        missing_runtime("llama.cpp b11434 is not built")
    pytest.importorskip("torch")
    from cope_core.trace.sources.tiny_models import build_tiny_model
    root = tmp_path_factory.mktemp("gguf")
    folder = build_tiny_model("qwen3_moe", root / "tiny-qwen3_moe", layers=4, seed=0,
                              vocab_size=320, hidden_size=256, moe_intermediate_size=256)
    sentencepiece_tokenizer(folder)
    f16 = root / "tiny.F16.gguf"
    convert(folder, f16, "f16")
    files = {"F16": f16}
    for preset in ("Q8_0", "Q4_K_M"):
        files[preset] = root / f"tiny.{preset}.gguf"
        quantize(f16, files[preset], preset)
    return folder, files


@pytest.mark.slow
def test_real_quantised_ggufs_read_exactly(quantised):
    folder, files = quantised
    q8, q4k, q6k = 256 * 256 // 32 * 34, 256 * 256 // 256 * 144, 256 * 256 // 256 * 210
    want = {"F16": [(256 * 256 * 2,) * 3] * 4, "Q8_0": [(q8,) * 3] * 4,
            # use_more_bits(i, 4): blocks 2 and 3 give ffn_down Q6_K (src/llama-quant.cpp)
            "Q4_K_M": [(q4k, q4k, q4k)] * 2 + [(q4k, q4k, q6k)] * 2}
    for preset, path in files.items():
        mf = read_gguf(path)
        g = mf.geometry
        assert (g.n_layers, g.n_experts, g.top_k, g.hidden, g.expert_intermediate,
                g.dense_layers, g.vocab, g.weight_format) == (4, 8, 2, 256, 256, 0, 320, preset)
        assert [(x.gate_bytes, x.up_bytes, x.down_bytes) for x in g.expert_layers] == want[preset]
        assert not mf.header_only
        # every tensor's bytes add up to the file's data section (padding under alignment)
        size = path.stat().st_size
        data = size - (g.all_expert_bytes + g.non_expert_bytes)
        assert 0 < data < 64 * 1024
        # a preset applied to the HF config gives llama-quantize's expert bytes exactly
        if preset != "F16":
            hf = read_model_file(str(folder), preset).geometry
            assert hf.expert_layers == g.expert_layers
            assert hf.non_expert_params == g.non_expert_params
        # the header alone (the first bytes of a download) reads the same
        head = path.parent / f"head.{preset}.gguf"
        with open(path, "rb") as src, open(head, "wb") as dst:
            dst.write(src.read(size - g.all_expert_bytes - g.non_expert_bytes + 1))
        part = read_gguf(head)
        assert part.header_only and part.geometry.expert_layers == g.expert_layers
    q8 = read_model_file(str(folder), "Q8_0").geometry
    assert q8.non_expert_bytes == read_gguf(files["Q8_0"]).geometry.non_expert_bytes


@pytest.mark.slow
def test_a_real_dense_gguf_is_refused(tmp_path):
    from llama_tools import LLAMA, convert, missing_runtime, sentencepiece_tokenizer
    if not (LLAMA / "src" / "convert_hf_to_gguf.py").is_file():
        missing_runtime("llama.cpp b11434 is not built")
    torch = pytest.importorskip("torch")
    import transformers as tf
    folder = tmp_path / "dense"
    cfg = tf.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    tf.LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(folder)
    from cope_core.trace.sources.tiny_models import build_tokenizer
    build_tokenizer(folder)
    sentencepiece_tokenizer(folder)
    out = tmp_path / "dense.gguf"
    convert(folder, out, "f16")
    with pytest.raises(CopeInputError, match="a dense model"):
        read_gguf(out)
    shutil.rmtree(folder)
