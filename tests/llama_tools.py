"""The runtimes the tests feed COPE's output to, as the tests find them: the folder
scripts/runtimes.sh sets them up in, what a test does when one is missing (fails, unless
``COPE_ALLOW_MISSING_RUNTIMES=1``), and llama.cpp b11434: its GGUF converter run on a tiny model
folder, its llama-quantize, the GGUF tensor names of a geometry, and a tiny random-weight MoE
GGUF its tools load."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest

CACHE = Path(os.environ.get("COPE_RUNTIMES_DIR")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cope-explorer")
LLAMA = CACHE / "llama.cpp-b11434"
#: llama.cpp b11434 built with its Vulkan backend (scripts/runtimes_vulkan.sh): llama-bench,
#: llama-fit-params, llama-completion
LLAMA_VULKAN = CACHE / "llama.cpp-b11434-vulkan"
SETUP = "bash scripts/runtimes.sh (the README's test command runs it)"
#: The opt-out: set to 1, a runtime that is not set up makes its tests skip instead of fail.
ALLOW_MISSING = "COPE_ALLOW_MISSING_RUNTIMES"


def missing_runtime(what: str, setup: str = SETUP) -> NoReturn:
    """Stop a test whose runtime is not there: a failure naming ``what`` and how to set it up
    (``setup``), or a skip saying the same when ``COPE_ALLOW_MISSING_RUNTIMES=1``, the explicit
    opt-out of a machine that cannot have the runtime."""
    if os.environ.get(ALLOW_MISSING) == "1":
        pytest.skip(f"{what} ({ALLOW_MISSING}=1; set it up with {setup})")
    pytest.fail(f"{what}: set it up with {setup}, or set {ALLOW_MISSING}=1 to let the tests of "
                "runtimes that are not set up skip", pytrace=False)


def sentencepiece_tokenizer(folder: Path) -> None:
    """A BPE sentencepiece tokenizer over the tiny models' words (the converter reads it)."""
    try:
        import sentencepiece as spm
    except ImportError:
        missing_runtime("sentencepiece (llama.cpp's GGUF converter reads its tokenizer) is not "
                        "installed", "bash scripts/install.sh (the test extra)")
    from cope_core.trace.sources.tiny_models import WORDS
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join([" ".join(WORDS)] * 50) + "\n")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "tokenizer"),
                                   vocab_size=290, model_type="bpe", byte_fallback=True,
                                   character_coverage=1.0, bos_id=-1, eos_id=1, unk_id=0,
                                   pad_id=-1, minloglevel=2)


def convert(folder: Path, out: Path, outtype: str = "f32") -> None:
    """llama.cpp's convert_hf_to_gguf.py on ``folder`` (sentencepiece vocabulary)."""
    src = LLAMA / "src"
    code = ("import runpy, sys\n"
            "import conversion.base as base\n"
            "base.TextModel._set_vocab_gpt2 = base.TextModel._set_vocab_sentencepiece\n"
            f"sys.argv = ['convert_hf_to_gguf.py', {str(folder)!r}, '--outfile', {str(out)!r},"
            f" '--outtype', {outtype!r}]\n"
            f"runpy.run_path({str(src / 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n")
    env = dict(os.environ, PYTHONPATH=f"{src / 'gguf-py'}{os.pathsep}{src}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0 and out.is_file(), r.stderr[-2000:]


def quantize(src: Path, out: Path, preset: str) -> None:
    """llama.cpp's llama-quantize ``src`` -> ``out`` in ``preset`` (Q8_0, Q4_K_M, ...)."""
    exe = LLAMA / "bin" / "llama-quantize"
    if not exe.is_file():
        missing_runtime("llama.cpp b11434's llama-quantize is not built")
    r = subprocess.run([str(exe), str(src), str(out), preset, "2"], capture_output=True,
                       text=True, timeout=600,
                       env=dict(os.environ, LD_LIBRARY_PATH=str(LLAMA / "bin")))
    assert r.returncode == 0 and out.is_file(), (r.stdout + r.stderr)[-2000:]


def gguf_names(g, *, fused=False, biases=False, scales=False) -> list[str]:
    """Every tensor name of a GGUF of this geometry (llama.cpp naming; ``scales``: the
    ``.scale``/``.input_scale`` tensors llama-model.cpp loads for quantized experts)."""
    names = ["token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"]
    for b in range(g.dense_layers + g.n_layers):
        p = f"blk.{b}."
        names += [p + n for n in (
            "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
            "attn_output.weight", "attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight",
            "attn_kv_a_norm.weight", "attn_kv_b.weight", "attn_q_norm.weight",
            "attn_k_norm.weight", "ffn_norm.weight", "attn_sinks.weight")]
        if b < g.dense_layers:
            names += [p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight"]
            continue
        names += [p + n for n in (
            "ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_inp_shexp.weight",
            "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
            "ffn_gate_inp.bias")]
        projs = ("gate_up", "down") if fused else ("gate", "up", "down")
        for proj in projs:
            names.append(f"{p}ffn_{proj}_exps.weight")
            if biases:
                names.append(f"{p}ffn_{proj}_exps.bias")
            if scales:
                names += [f"{p}ffn_{proj}_exps.scale", f"{p}ffn_{proj}_exps.input_scale"]
        if scales:
            names += [f"{p}ffn_{proj}_shexp.scale" for proj in ("gate", "up", "down")]
    return names


def expert_tensor(name: str) -> int | None:
    """The block of a routed-expert tensor name, else None (an independent parse)."""
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                                          "ffn_gate_up_exps"):
        return int(parts[1])
    return None


def qwen3moe_header(w, *, n_blocks, n_experts, n_used, hidden, inter, heads, kv_heads,
                    head_dim, vocab, ctx_train) -> None:
    """The key-value part of a random-weight qwen3moe GGUF (F16, byte-level vocabulary)."""
    for k, v in (("context_length", ctx_train), ("embedding_length", hidden),
                 ("block_count", n_blocks), ("feed_forward_length", inter),
                 ("attention.head_count", heads), ("attention.head_count_kv", kv_heads),
                 ("attention.key_length", head_dim), ("attention.value_length", head_dim),
                 ("expert_count", n_experts), ("expert_used_count", n_used),
                 ("expert_feed_forward_length", inter)):
        w.add_uint32(f"qwen3moe.{k}", v)
    w.add_float32("qwen3moe.rope.freq_base", 10000.0)
    w.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_file_type(1)
    byte_tokenizer(w, vocab)


def byte_tokenizer(w, vocab: int) -> None:
    """A llama (SentencePiece-style) vocabulary of ``vocab`` tokens on a GGUFWriter: the three
    specials, the 256 byte tokens, then made-up words: enough for llama.cpp to load and decode."""
    words = vocab - 259
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
                     + [f"\u2581w{i}" for i in range(words)])
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(words)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * words)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def moe_tensor_shapes(*, n_blocks, n_experts, hidden, inter, heads, kv_heads, head_dim, vocab
                      ) -> list[tuple[str, tuple[int, ...], bool]]:
    """``(name, numpy shape, is_norm)`` of every tensor of the qwen3moe GGUF, in file order
    (norms and the router in F32, the rest F16)."""
    out: list[tuple[str, tuple[int, ...], bool]] = [
        ("token_embd.weight", (vocab, hidden), False), ("output_norm.weight", (hidden,), True),
        ("output.weight", (vocab, hidden), False)]
    for b in range(n_blocks):
        p = f"blk.{b}."
        out += [(p + "attn_norm.weight", (hidden,), True),
                (p + "attn_q.weight", (heads * head_dim, hidden), False),
                (p + "attn_k.weight", (kv_heads * head_dim, hidden), False),
                (p + "attn_v.weight", (kv_heads * head_dim, hidden), False),
                (p + "attn_output.weight", (hidden, heads * head_dim), False),
                (p + "attn_q_norm.weight", (head_dim,), True),
                (p + "attn_k_norm.weight", (head_dim,), True),
                (p + "ffn_norm.weight", (hidden,), True),
                (p + "ffn_gate_inp.weight", (n_experts, hidden), True),
                (p + "ffn_gate_exps.weight", (n_experts, inter, hidden), False),
                (p + "ffn_up_exps.weight", (n_experts, inter, hidden), False),
                (p + "ffn_down_exps.weight", (n_experts, hidden, inter), False)]
    return out


def write_moe_streamed(path: Path, *, n_blocks: int, n_experts: int, n_used: int, hidden: int,
                       inter: int, heads: int, kv_heads: int, head_dim: int, vocab: int,
                       ctx_train: int = 8192, seed: int = 0) -> Path:
    """A random-weight qwen3moe GGUF in F16 written one tensor at a time (a file larger than
    memory holds comfortably: Qwen3-30B-A3B's expert shapes are 1.2 GB per block)."""
    from gguf import GGUFWriter
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen3moe")
    qwen3moe_header(w, n_blocks=n_blocks, n_experts=n_experts, n_used=n_used, hidden=hidden,
                    inter=inter, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
                    ctx_train=ctx_train)
    shapes = moe_tensor_shapes(n_blocks=n_blocks, n_experts=n_experts, hidden=hidden,
                               inter=inter, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                               vocab=vocab)
    for name, shape, norm in shapes:
        dt = np.dtype(np.float32 if norm else np.float16)
        w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, norm in shapes:
        if name.endswith("_norm.weight"):
            w.write_tensor_data(np.ones(shape, np.float32))
        elif norm:        # the router
            w.write_tensor_data(rng.standard_normal(shape, np.float32) * 0.02)
        else:
            w.write_tensor_data((rng.standard_normal(shape, np.float32) * 0.02)
                                .astype(np.float16))
    w.close()
    return path


def write_tiny_moe(path: Path, n_blocks=4, n_experts=8, hidden=512, inter=1024, heads=8,
                   kv_heads=4, head_dim=64, vocab=512, ctx_train=8192, seed=0) -> Path:
    """A random-weight qwen3moe GGUF in F16 (about 103 MiB at the defaults), with a byte-level
    vocabulary: what llama.cpp's own tools load (llama-fit-params, llama-bench)."""
    from gguf import GGUFWriter
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen3moe")
    qwen3moe_header(w, n_blocks=n_blocks, n_experts=n_experts, n_used=2, hidden=hidden,
                    inter=inter, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
                    ctx_train=ctx_train)

    def f16(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16))

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))
    f16("token_embd.weight", vocab, hidden)
    ones("output_norm.weight", hidden)
    f16("output.weight", vocab, hidden)
    for b in range(n_blocks):
        p = f"blk.{b}."
        ones(p + "attn_norm.weight", hidden)
        f16(p + "attn_q.weight", heads * head_dim, hidden)
        f16(p + "attn_k.weight", kv_heads * head_dim, hidden)
        f16(p + "attn_v.weight", kv_heads * head_dim, hidden)
        f16(p + "attn_output.weight", hidden, heads * head_dim)
        ones(p + "attn_q_norm.weight", head_dim)
        ones(p + "attn_k_norm.weight", head_dim)
        ones(p + "ffn_norm.weight", hidden)
        w.add_tensor(p + "ffn_gate_inp.weight",
                     (rng.standard_normal((n_experts, hidden)) * 0.02).astype(np.float32))
        f16(p + "ffn_gate_exps.weight", n_experts, inter, hidden)
        f16(p + "ffn_up_exps.weight", n_experts, inter, hidden)
        f16(p + "ffn_down_exps.weight", n_experts, hidden, inter)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
