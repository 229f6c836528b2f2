"""Collect a routing trace from a local Hugging Face MoE model by greedy batch-1 decoding.

Where the routing is read
-------------------------
In transformers 5 every supported family computes its routing in a router module (``mlp.gate``,
or ``mlp.router`` for GPT-OSS) and hands the chosen ids to the experts module
(``mlp.experts(hidden_states, top_k_index, top_k_weights)``). A forward pre-hook on the experts
module therefore sees the *final* routing, whatever the family's rule was (softmax or sigmoid,
group-limited, bias-corrected); the same hook sees the MoE layer's input hidden state. Dense
layers (DeepSeek's ``first_k_dense_replace``, Qwen's ``mlp_only_layers``) have no experts
module and are skipped.

Order "best score first": ids are sorted by the score the router ranked them by (the router
logit, which orders softmax probabilities the same way; for DeepSeek-V3's sigmoid router the
bias-corrected ``sigmoid(logit) + e_score_correction_bias``), ties to the lower id. DeepSeek's
routers return their top-k unsorted, so this matters.

Decode
------
Each prompt is prefilled (not recorded: the trace holds decode tokens only) and then decoded
greedily, one token at a time, with a KV cache. ``max_new_tokens`` counts generated tokens as
``generate`` does, the first of which comes out of the prefill, so at most ``max_new_tokens - 1``
decode tokens are recorded per prompt; decoding stops early at an end-of-sequence token unless
``stop_at_eos`` is False. Token ``t``'s ``context`` is ``prompt_len + t``.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CopeInputError
from ...geometry import ModelGeometry
from ..data import Trace
from .hidden import HiddenStateWriter
from .predictor import Predictor

#: ``config.model_type`` of the supported families.
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss")


@dataclass(frozen=True, eq=False)
class MoeLayer:
    """One MoE layer: its decoder-layer index and the router and experts modules."""

    index: int
    router: Any
    experts: Any


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model loaded once for a whole collection."""

    model: Any
    tokenizer: Any
    layers: tuple[MoeLayer, ...]
    geometry: ModelGeometry
    family: str
    path: str
    eos_ids: frozenset[int] = field(default_factory=frozenset)


def find_moe_layers(model: Any) -> tuple[MoeLayer, ...]:
    """The decoder layers whose MLP has a router and an experts module, in order."""
    inner = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(getattr(inner, "layers", ())):
        mlp = getattr(layer, "mlp", None)
        router = getattr(mlp, "gate", None)
        router = getattr(mlp, "router", None) if router is None else router
        experts = getattr(mlp, "experts", None)
        if router is not None and experts is not None and hasattr(router, "weight"):
            out.append(MoeLayer(i, router, experts))
    return tuple(out)


def selection_scores(router: Any, logits: Any) -> Any:
    """Per-expert scores the router ranks by (see the module docstring); ``logits`` [.., E]."""
    bias = getattr(router, "e_score_correction_bias", None)
    if bias is not None:
        return logits.float().sigmoid() + bias.float()
    return logits.float()


def _geometry(model: Any, layers: Sequence[MoeLayer], name: str) -> ModelGeometry:
    c = model.config
    E = layers[0].router.weight.shape[0]  # the router's rows are the routed experts
    inter = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    if getattr(c, "n_shared_experts", None):
        shared = int(c.n_shared_experts)
    else:
        shared = 1 if getattr(c, "shared_expert_intermediate_size", 0) else 0
    heads = int(c.num_attention_heads)
    head_dim = getattr(c, "v_head_dim", None) or getattr(c, "head_dim", None) \
        or c.hidden_size // heads
    expert_params = {id(p): p for m in layers for p in m.experts.parameters()}
    all_params = {id(p): p for p in model.parameters()}
    ebytes = sum(p.numel() * p.element_size() for p in expert_params.values())
    total = sum(p.numel() * p.element_size() for p in all_params.values())
    dtype_bytes = next(iter(expert_params.values())).element_size()
    return ModelGeometry(
        name=name, n_layers=len(layers), n_experts=int(E), top_k=int(c.num_experts_per_tok),
        hidden=int(c.hidden_size), expert_intermediate=int(inter), dtype_bytes=int(dtype_bytes),
        n_shared_experts=shared, dense_layers=len(model.model.layers) - len(layers),
        n_heads=heads, n_kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim), vocab=int(c.vocab_size), non_expert_bytes=int(total - ebytes))


def load_model(path: str | os.PathLike, *, dtype: str = "auto", device: str = "cpu",
               name: str | None = None) -> LoadedModel:
    """Load a local transformers MoE causal LM folder (config, weights, tokenizer); never
    downloads.

    Parameters
    ----------
    path : folder with ``config.json``, weights and tokenizer files.
    dtype : ``"auto"`` (the checkpoint's), ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    device : torch device for the model (``"cpu"``, ``"cuda"``, ...).
    name : geometry name; default the folder name in lower case.
    """
    src = str(path)
    cfg = Path(path) / "config.json"
    if not Path(path).is_dir() or not cfg.is_file():
        raise CopeInputError("expected a Hugging Face model folder with config.json", source=src)
    try:
        model_type = json.loads(cfg.read_text()).get("model_type")
    except (ValueError, OSError, AttributeError) as exc:
        raise CopeInputError(f"config.json is not a JSON object ({exc})", source=src,
                             field="config.json") from None
    if model_type not in FAMILIES:
        raise CopeInputError(f"model_type {model_type!r} is not a supported MoE family; expected "
                             f"one of {list(FAMILIES)}", source=src, field="model_type")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers as tf
    if dtype != "auto" and not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise CopeInputError(f"expected auto, float32, bfloat16 or float16, got {dtype!r}",
                             field="dtype")
    try:
        tok = tf.AutoTokenizer.from_pretrained(src, local_files_only=True)
        model = tf.AutoModelForCausalLM.from_pretrained(
            src, local_files_only=True, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as exc:
        raise CopeInputError(f"cannot load the model ({' '.join(str(exc).split())[:200]})",
                             source=src) from None
    model.to(device).eval()  # type: ignore[arg-type]  # transformers' own annotation of .to
    layers = find_moe_layers(model)
    if not layers:
        raise CopeInputError("no MoE layers (router + experts) found", source=src,
                             field="model_type")
    g = _geometry(model, layers, name or Path(path).resolve().name.lower())
    blocks = [m.index for m in layers]
    n_blocks = len(model.model.layers)
    if blocks != list(range(n_blocks - len(blocks), n_blocks)):
        # COPE's geometry is a dense prefix then MoE layers: predictions are unaffected (the
        # dense blocks' work is shared), but a runtime export numbers blocks that way
        warnings.warn(f"{src}: the MoE layers are blocks {blocks} of {n_blocks}, interleaved "
                      "with dense ones; COPE counts the dense blocks as a prefix, so the block "
                      "numbers of `cope export` for this model are wrong: do not deploy them",
                      stacklevel=2)
    eos = model.generation_config.eos_token_id if model.generation_config else None
    eos = eos if eos is not None else tok.eos_token_id
    eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
    return LoadedModel(model, tok, layers, g, model_type, src, eos_ids)


def read_prompts(path: str | os.PathLike) -> list[str]:
    """Prompts from a text file (one per non-empty line) or JSON lines (a string, or an object
    with a ``prompt`` or ``text`` field, per line)."""
    src = str(path)
    if not os.path.isfile(src):
        raise CopeInputError("file not found", source=src)
    lines = [ln for ln in Path(src).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise CopeInputError("the prompt file is empty, expected at least one prompt", source=src)
    if not src.endswith((".jsonl", ".json")):
        return lines
    out = []
    for i, ln in enumerate(lines):
        try:
            obj = json.loads(ln)
        except ValueError:
            raise CopeInputError(f"line {i + 1} is not JSON", source=src) from None
        text = obj if isinstance(obj, str) else (obj.get("prompt", obj.get("text"))
                                                 if isinstance(obj, dict) else None)
        if not isinstance(text, str) or not text.strip():
            raise CopeInputError(f"line {i + 1}: expected a string or an object with a 'prompt' "
                                 f"string", source=src, field="prompt")
        out.append(text)
    return out


class _Recorder:
    """Hooks on every MoE layer; fills one decode token's routing and hidden states."""

    def __init__(self, lm: LoadedModel, want_hidden: bool):
        g = lm.geometry
        self.lm, self.want_hidden = lm, want_hidden
        self.routed = np.full((g.n_layers, g.top_k), -1, np.int16)
        self.hidden = np.zeros((g.n_layers, g.hidden), np.float32) if want_hidden else None
        self.active = False
        self._logits: list[Any] = [None] * g.n_layers
        self.handles = []
        for j, m in enumerate(lm.layers):
            self.handles.append(m.router.register_forward_hook(self._router_hook(j)))
            self.handles.append(m.experts.register_forward_pre_hook(self._experts_hook(j),
                                                                    with_kwargs=True))

    def _router_hook(self, j: int):
        def hook(module, args, output):
            if self.active:
                self._logits[j] = output[0] if isinstance(output, tuple) else output
        return hook

    def _experts_hook(self, j: int):
        import torch
        router = self.lm.layers[j].router

        def hook(module, args, kwargs):
            if not self.active:
                return None
            hs = args[0] if args else kwargs["hidden_states"]
            idx = args[1] if len(args) > 1 else kwargs.get("top_k_index",
                                                           kwargs.get("router_indices"))
            ids = idx.reshape(-1, idx.shape[-1])
            if ids.shape[0] != 1:
                raise RuntimeError(f"expected one decode token at MoE layer {j}, got {ids.shape}")
            ids = ids[0].tolist()
            if self._logits[j] is not None:
                score = selection_scores(router, self._logits[j])
            else:  # the router ran outside its module: rank by the routing weights instead
                w = args[2] if len(args) > 2 else kwargs.get("top_k_weights",
                                                             kwargs.get("routing_weights"))
                score = torch.full((len(router.weight),), float("-inf"))
                score[torch.as_tensor(ids)] = w.reshape(-1, len(ids))[0].float().cpu()
            s = score.reshape(-1, len(router.weight))[0].tolist()
            self._logits[j] = None
            self.routed[j] = sorted(ids, key=lambda e: (-s[e], e))
            if self.want_hidden:
                self.hidden[j] = hs.reshape(-1, hs.shape[-1])[-1].float().cpu().numpy()
            return None
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _encode(lm: LoadedModel, prompt: str, index: int, chat: bool):
    if chat:
        try:
            ids = lm.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True,
                return_tensors="pt", return_dict=True)["input_ids"]
        except (ValueError, TypeError, KeyError) as exc:
            raise CopeInputError(f"the tokenizer cannot apply a chat template "
                                 f"({' '.join(str(exc).split())[:120]})", source=lm.path,
                                 field="chat_template") from None
    else:
        ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[-1] == 0:
        raise CopeInputError(f"prompt {index} encodes to no tokens", field="prompts")
    return ids


def collect(lm: LoadedModel, prompts: Sequence[str], max_new_tokens: int, *,
            hidden_writer: HiddenStateWriter | None = None, predictor: Predictor | None = None,
            stop_at_eos: bool = True, chat: bool = False, progress: bool = True,
            description: str = "") -> Trace:
    """Greedy batch-1 decode of every prompt, recording each decode token's routing.

    Parameters
    ----------
    lm : LoadedModel
        From :func:`load_model` (loaded once, reused for all prompts).
    prompts : sequence of str
    max_new_tokens : int
        Generated tokens per prompt (>= 2), the first from the prefill (module docstring).
    hidden_writer : HiddenStateWriter, optional
        Receives each decode token's MoE-layer inputs as they are produced (streamed, not kept).
    predictor : Predictor, optional
        Fills ``predicted`` with its ranked ids for layer ``l + 1``.
    stop_at_eos, chat, progress : decoding stops at EOS; prompts go through the tokenizer's chat
        template; a tqdm bar per prompt on stderr.

    Returns
    -------
    Trace
        ``source="collected"``; prompts that produced no decode token are left out (warned).
    """
    import warnings

    import torch
    g = lm.geometry
    if not isinstance(max_new_tokens, int) or max_new_tokens < 2:
        raise CopeInputError(f"expected an integer >= 2 (the first new token comes from the "
                             f"prefill), got {max_new_tokens!r}", field="max-new-tokens")
    if not prompts:
        raise CopeInputError("no prompts given", field="prompts")
    if predictor is not None and (predictor.model.n_layers, predictor.model.n_experts,
                                  predictor.meta.get("hidden")) != (g.n_layers, g.n_experts,
                                                                    g.hidden):
        raise CopeInputError(f"predictor is for {predictor.model.n_layers} layers x "
                             f"{predictor.model.n_experts} experts, hidden "
                             f"{predictor.meta.get('hidden')}; the model has {g.n_layers} x "
                             f"{g.n_experts}, hidden {g.hidden}", field="predictor")
    rec = _Recorder(lm, want_hidden=hidden_writer is not None or predictor is not None)
    routed, predicted, context, pids, counts = [], [], [], [], []
    device = next(lm.model.parameters()).device
    # transformers 5 renamed past_key_values to cache (the old name still works, with a warning)
    cache_kw = "cache" if "cache" in inspect.signature(lm.model.forward).parameters \
        else "past_key_values"
    try:
        for pi, prompt in enumerate(prompts):
            ids = _encode(lm, prompt, pi, chat).to(device)
            bar = None
            if progress:
                from tqdm.auto import tqdm
                bar = tqdm(total=max_new_tokens - 1, desc=f"prompt {pi + 1}/{len(prompts)}",
                           unit="tok", file=sys.stderr, leave=False)
            n = 0
            with torch.inference_mode():
                out = lm.model(input_ids=ids, use_cache=True)
                nxt = int(out.logits[0, -1].argmax())
                ctx = int(ids.shape[1])
                for t in range(max_new_tokens - 1):
                    if stop_at_eos and nxt in lm.eos_ids:
                        break
                    rec.routed.fill(-1)
                    rec.active = True
                    cache = out[cache_kw] if cache_kw in out else out.past_key_values
                    out = lm.model(input_ids=torch.tensor([[nxt]], device=device),
                                   use_cache=True, **{cache_kw: cache})
                    rec.active = False
                    if (rec.routed < 0).any():
                        raise RuntimeError("a MoE layer did not run for a decode token")
                    routed.append(rec.routed.copy())
                    context.append(ctx + t)
                    if hidden_writer is not None or predictor is not None:
                        hidden = rec.hidden
                        assert hidden is not None         # captured when either needs it
                        if hidden_writer is not None:
                            hidden_writer.add(pi, t, hidden, rec.routed)
                        if predictor is not None:
                            predicted.append(predictor.predict(hidden[None])[0])
                    nxt = int(out.logits[0, -1].argmax())
                    n += 1
                    if bar is not None:
                        bar.update(1)
            if bar is not None:
                bar.close()
            if n == 0:
                warnings.warn(f"prompt {pi} ended at once (end-of-sequence); left out of the "
                              "trace", stacklevel=2)
                continue
            pids.append(pi)
            counts.append(n)
    finally:
        rec.active = False
        rec.remove()
    if not pids:
        raise CopeInputError("no prompt produced a decode token (each ended at once)",
                             field="prompts")
    N = len(routed)
    pred = np.stack(predicted) if predictor is not None else np.empty((N, g.n_layers, 0), np.int16)
    meta = None if predictor is None else {
        "kind": "mlp", **{k: v for k, v in predictor.meta.items() if k != "model"}}
    text = (f"collected from {lm.path} ({lm.family}), greedy decode, up to {max_new_tokens} new "
            f"tokens per prompt")
    return Trace(model=g, prompt_ids=np.asarray(pids, np.int32),
                 prompt_start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                 context=np.asarray(context, np.int32), routed=np.stack(routed),
                 predicted=pred.astype(np.int16), source="collected",
                 description=f"{description.strip()}; {text}" if description.strip() else text,
                 predictor=meta)
