"""Write the header (metadata and tensor table, no tensor data) of unsloth's
Qwen3-30B-A3B-Q4_K_M.gguf as published, with the gguf package's writer: the shipped example of a
quantised model file (data/models/README.md).

The tensor types are those the published file lists (a llama.cpp load log of
unsloth/Qwen3-30B-A3B-GGUF Q4_K_M: 241 F32, 289 Q4_K and 49 Q6_K tensors, 17.28 GiB; quoted in
an ikawrakow/ik_llama.cpp issue thread exported to that repository's github-data/): Q6_K for
``ffn_down_exps`` and ``attn_v`` in blocks 0-5, 8, 11, ..., 41 and 42-47 and for ``output``;
Q4_K for ``token_embd``, every ``ffn_gate_exps``/``ffn_up_exps``, ``attn_q``, ``attn_k``,
``attn_output`` and the other blocks' ``attn_v``/``ffn_down_exps``; F32 for norms and routers.
The shapes and metadata are Qwen/Qwen3-30B-A3B's config (48 blocks, 128 experts, top-8, hidden
2048, expert width 768, 32/4 heads of 128, vocabulary 151936).

With ``--examples DIR`` it also writes the shipped quantised what-if beside the BF16 one: the
Qwen3-30B-A3B example's trace and calibration priced as this file
(``Trace.with_model``) and the same RTX 4090 analytic profile made from the header.

    python scripts/make_gguf_header.py [-o data/models/qwen3-30b-a3b-Q4_K_M.header.gguf]
        [--examples data/examples]
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType

L, E, K, H, I, HEADS, KV, HD, VOCAB = 48, 128, 8, 2048, 768, 32, 4, 128, 151936
Q6_BLOCKS = set(range(6)) | set(range(8, 42, 3)) | set(range(42, 48))


def tensors() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape, type) of every tensor of the published file, in its order."""
    out = [("token_embd.weight", (H, VOCAB), "Q4_K")]
    for b in range(L):
        more = "Q6_K" if b in Q6_BLOCKS else "Q4_K"
        out += [(f"blk.{b}.attn_norm.weight", (H,), "F32"),
                (f"blk.{b}.attn_q.weight", (H, HEADS * HD), "Q4_K"),
                (f"blk.{b}.attn_k.weight", (H, KV * HD), "Q4_K"),
                (f"blk.{b}.attn_v.weight", (H, KV * HD), more),
                (f"blk.{b}.attn_output.weight", (HEADS * HD, H), "Q4_K"),
                (f"blk.{b}.attn_q_norm.weight", (HD,), "F32"),
                (f"blk.{b}.attn_k_norm.weight", (HD,), "F32"),
                (f"blk.{b}.ffn_norm.weight", (H,), "F32"),
                (f"blk.{b}.ffn_gate_inp.weight", (H, E), "F32"),
                (f"blk.{b}.ffn_gate_exps.weight", (H, I, E), "Q4_K"),
                (f"blk.{b}.ffn_up_exps.weight", (H, I, E), "Q4_K"),
                (f"blk.{b}.ffn_down_exps.weight", (I, H, E), more)]
    return out + [("output_norm.weight", (H,), "F32"), ("output.weight", (H, VOCAB), "Q6_K")]


def write_header(path: str) -> None:
    w = GGUFWriter(path, "qwen3moe")
    w.add_name("Qwen3-30B-A3B")
    w.add_basename("Qwen3")
    w.add_size_label("30B-A3B")
    w.add_file_type(LlamaFileType.MOSTLY_Q4_K_M)
    w.add_block_count(L)
    w.add_context_length(40960)
    w.add_embedding_length(H)
    w.add_feed_forward_length(6144)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_expert_feed_forward_length(I)
    w.add_vocab_size(VOCAB)
    for name, shape, t in tensors():
        qt = GGMLQuantizationType[t]
        block, size = GGML_QUANT_SIZES[qt]
        n = int(np.prod(shape))
        # numpy order (the reverse of ggml's) in elements, with the stored type
        w.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32), n // block * size,
                          raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default="data/models/qwen3-30b-a3b-Q4_K_M.header.gguf")
    p.add_argument("--examples", metavar="DIR",
                   help="also write the quantised example's trace, calibration and profile here")
    args = p.parse_args()
    folder = os.path.dirname(os.path.abspath(args.output))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
    os.close(fd)
    try:
        write_header(tmp)
        os.replace(tmp, args.output)    # atomic: a reader never sees half a header
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"wrote {args.output} ({os.path.getsize(args.output):,} bytes)")
    if args.examples:
        write_example(args.output, args.examples)


def write_example(header: str, folder: str) -> None:
    from cope_core import parquet_io
    from cope_core.models import resolve_model
    from cope_core.platforms import resolve_platform
    from cope_core.profile.analytic import analytic_for_model
    g = resolve_model(header)
    base = os.path.join(folder, "qwen3-30b-a3b")
    for part in ("trace", "calibration"):
        t = parquet_io.read_trace(f"{base}-{part}.parquet").with_model(g)
        out = os.path.join(folder, f"gguf-{g.name}-{part}.parquet")
        parquet_io.write_trace(t, out, overwrite=True)
        print(f"wrote {out}")
    bf16 = parquet_io.read_profile(f"{base}-rtx4090-analytic.parquet")
    assert bf16.platform["spec"] == resolve_platform("rtx4090", cpu="xeon-gold-6430").to_dict()
    out = os.path.join(folder, f"gguf-{g.name}-rtx4090-analytic.parquet")
    parquet_io.write_profile(analytic_for_model(bf16, g), out, overwrite=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
