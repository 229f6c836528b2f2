"""Tiny random-weight Hugging Face MoE models and a word-level tokenizer.

They let the whole collection path (``cope trace collect``, hidden states, the predictor) and the
runtime exports run without a download: the test suite, ``scripts/make_data.py``'s collected
example and the llama.cpp conversion tests build them here. Nothing is fetched; transformers and
tokenizers are imported only when a model is built.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The families :func:`tiny_config` builds (``config.model_type``).
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss")

WORDS = tuple(("the cat sat on a mat while experts route every token to two of eight small feed "
               "forward blocks and the router picks the best scores first").split())


def build_tokenizer(folder: str | Path, words: Sequence[str] = WORDS) -> None:
    """Save a whitespace word-level tokenizer over ``words`` (plus ``<unk>`` and ``<eos>``, ids 0
    and 1) into ``folder``."""
    import tokenizers
    import transformers as tf

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)], tokenizers.trainers.WordLevelTrainer(
        special_tokens=["<unk>", "<eos>"]))
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                               eos_token="<eos>").save_pretrained(str(folder))


def tiny_config(family: str, layers: int = 3, **overrides: Any):
    """A transformers config of ``family`` with 8 experts (top-2), hidden size 32 and ``layers``
    decoder blocks; ``overrides`` replace any field (e.g. ``vocab_size``, ``q_lora_rank``)."""
    import transformers as tf

    common = dict(vocab_size=48, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, num_hidden_layers=layers, intermediate_size=16,
                  num_experts_per_tok=2, eos_token_id=1, bos_token_id=None, pad_token_id=None)
    mla = dict(num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=8,
               n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
               kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=8)
    family_args: dict[str, tuple[Any, dict[str, Any]]] = {
        "mixtral": (tf.MixtralConfig, dict(num_local_experts=8)),
        # one dense layer in the middle (mlp_only_layers)
        "qwen2_moe": (tf.Qwen2MoeConfig, dict(moe_intermediate_size=16, num_experts=8,
                                             shared_expert_intermediate_size=16,
                                             mlp_only_layers=[1])),
        "qwen3_moe": (tf.Qwen3MoeConfig, dict(moe_intermediate_size=16, num_experts=8,
                                             head_dim=8, norm_topk_prob=True)),
        "deepseek_v2": (tf.DeepseekV2Config, dict(mla, topk_method="group_limited_greedy",
                                                 q_lora_rank=None)),
        "deepseek_v3": (tf.DeepseekV3Config, dict(mla, q_lora_rank=16, norm_topk_prob=True)),
        "olmoe": (tf.OlmoeConfig, dict(num_experts=8)),
        "gpt_oss": (tf.GptOssConfig, dict(num_local_experts=8, head_dim=8)),
    }
    if family not in family_args:
        raise ValueError(f"unknown family {family!r}, expected one of {FAMILIES}")
    cls, extra = family_args[family]
    return cls(**{**common, **extra, **overrides})


def build_tiny_model(family: str, folder: str | Path, *, layers: int = 3, seed: int = 0,
                     words: Sequence[str] = WORDS, **overrides: Any) -> Path:
    """Save a random-weight model of ``family`` and a tokenizer over ``words`` into ``folder``.

    Router weights are drawn at unit scale so routing is decisive (no near-ties that rounding
    could flip), and DeepSeek-V3's score-correction bias is made non-zero so it changes the
    choice. ``overrides`` go to :func:`tiny_config`.
    """
    import torch
    import transformers as tf

    folder = Path(folder)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(tiny_config(family, layers, **overrides),
                                                dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            router = getattr(layer.mlp, "gate", None) or getattr(layer.mlp, "router", None)
            if router is not None and hasattr(router, "weight") and router.weight.dim() == 2:
                router.weight.normal_(0.0, 1.0)
                if hasattr(router, "e_score_correction_bias"):
                    router.e_score_correction_bias.normal_(0.0, 0.3)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    build_tokenizer(folder, words)
    return folder
