"""Trace collection from tiny random-weight Hugging Face MoE models of every supported family.

Each test model is built on the fly, saved with ``save_pretrained`` together with a small
tokenizer trained here, and loaded back through the collector like a user's folder. The routed
ids the collector records are compared with a routing computed independently in this file from
the router modules' own logits (captured with hooks during the same decode), following each
family's published rule.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from cope_core import parquet_io  # noqa: E402
from cope_core.cli.main import main  # noqa: E402
from cope_core.errors import CopeInputError  # noqa: E402
from cope_core.trace.sources.collect import collect, load_model, read_prompts  # noqa: E402
from cope_core.trace.sources.hidden import HiddenStateWriter, read_hidden_states  # noqa: E402
from cope_core.trace.sources.predictor import train_predictor  # noqa: E402
from cope_core.trace.sources.tiny_models import (  # noqa: E402, F401
    FAMILIES,
    WORDS,
    build_tiny_model,
    build_tokenizer,
    tiny_config,
)

PROMPTS = ["the cat sat on a mat", "experts route every token", "the router picks the best",
           "two of eight small feed forward blocks"]


# --- the independent reference: each family's routing rule applied to the router logits --------
def reference_routing(family: str, config, router, logits: np.ndarray) -> list[int]:
    """Routed ids, best score first (ties to the lower id), from one token's router logits."""
    k, E = config.num_experts_per_tok, logits.shape[0]
    x = logits.astype(np.float64)
    if family in ("deepseek_v2",):
        s = np.exp(x - x.max())
        s /= s.sum()
        groups = s.reshape(config.n_group, -1).max(axis=1)
        keep = np.argsort(-groups, kind="stable")[:config.topk_group]
        mask = np.zeros(config.n_group, bool)
        mask[keep] = True
        key = np.where(np.repeat(mask, E // config.n_group), s, 0.0)
    elif family == "deepseek_v3":
        s = 1.0 / (1.0 + np.exp(-x))
        c = s + router.e_score_correction_bias.detach().double().numpy()
        groups = np.sort(c.reshape(config.n_group, -1), axis=1)[:, -2:].sum(axis=1)
        keep = np.argsort(-groups, kind="stable")[:config.topk_group]
        mask = np.zeros(config.n_group, bool)
        mask[keep] = True
        key = np.where(np.repeat(mask, E // config.n_group), c, 0.0)
    else:  # softmax routers and GPT-OSS's top-k of logits rank experts alike
        key = x
    return np.lexsort((np.arange(E), -key))[:k].tolist()


def _capture_router_logits(lm):
    """Hooks recording each router call's logits for single-token (decode) calls."""
    seen: list[list[np.ndarray]] = [[] for _ in lm.layers]
    handles = []
    for j, m in enumerate(lm.layers):
        def hook(module, args, output, j=j):
            logits = output[0].reshape(-1, output[0].shape[-1])
            if logits.shape[0] == 1:
                seen[j].append(logits[0].detach().float().numpy().copy())
        handles.append(m.router.register_forward_hook(hook))
    return seen, handles


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {f: build_tiny_model(f, root / f) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_ids_equal_the_models_routing(family, model_dirs, tmp_path):
    if family == "qwen2_moe":   # its dense block 1 sits between MoE blocks 0 and 2
        with pytest.warns(UserWarning, match=r"blocks \[0, 2\] of 3, interleaved"):
            lm = load_model(model_dirs[family])
    else:
        lm = load_model(model_dirs[family])
    seen, handles = _capture_router_logits(lm)
    hs_path = tmp_path / "hs"
    try:
        with HiddenStateWriter(hs_path, lm.geometry, chunk=3) as w:
            tr = collect(lm, PROMPTS[:2], 6, hidden_writer=w, stop_at_eos=False, progress=False)
    finally:
        for h in handles:
            h.remove()
    g, cfg = lm.geometry, lm.model.config
    # dense blocks are not MoE layers: DeepSeek's first_k_dense_replace, Qwen2's mlp_only_layers
    dense = {"deepseek_v2": 1, "deepseek_v3": 1, "qwen2_moe": 1}.get(family, 0)
    assert (g.n_layers, g.dense_layers, g.n_experts, g.top_k) == (3 - dense, dense, 8, 2)
    assert tr.source == "collected" and tr.n_prompts == 2 and tr.n_tokens == 10
    assert tr.tokens_per_prompt.tolist() == [5, 5]
    n_prompt_tokens = [len(lm.tokenizer(p).input_ids) for p in PROMPTS[:2]]
    assert tr.context.tolist() == [n + t for n in n_prompt_tokens for t in range(5)]
    assert all(len(s) == tr.n_tokens for s in seen)
    ref = np.array([[reference_routing(family, cfg, lm.layers[j].router, seen[j][t])
                     for j in range(g.n_layers)] for t in range(tr.n_tokens)])
    np.testing.assert_array_equal(tr.routed, ref)
    if family == "deepseek_v3":  # the bias and the group limit must have changed some choices
        plain = np.array([[np.argsort(-seen[j][t], kind="stable")[:2].tolist()
                           for j in range(g.n_layers)] for t in range(tr.n_tokens)])
        assert (np.sort(plain, axis=2) != np.sort(ref, axis=2)).any()
    # the streamed hidden states are the routers' inputs: they reproduce the logits
    hs = read_hidden_states(hs_path)
    assert len(json.loads((hs_path / "index.json").read_text())["shards"]) == 4  # 10 rows, 3 each
    np.testing.assert_array_equal(hs.routed, tr.routed)
    assert hs.token.tolist() == [t for _ in range(2) for t in range(5)]
    for j, m in enumerate(lm.layers):
        w = m.router.weight.detach().float().numpy()
        b = getattr(m.router, "bias", None)
        logits = hs.hidden[:, j].astype(np.float32) @ w.T + (0 if b is None else b.detach().numpy())
        np.testing.assert_allclose(logits, np.stack(seen[j]), atol=0.05, rtol=0.01)


def _greedy(lm, ids):
    with torch.no_grad():
        return int(lm.model(input_ids=ids).logits[0, -1].argmax())


def test_collect_stops_at_eos_and_skips_empty_prompts(model_dirs):
    lm = load_model(model_dirs["mixtral"])
    full = collect(lm, PROMPTS[:1], 5, stop_at_eos=False, progress=False)
    ids = lm.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    first = _greedy(lm, ids)
    second = _greedy(lm, torch.cat([ids, torch.tensor([[first]])], 1))
    assert first != second  # true for this seed; the cases below need it
    # EOS = the second generated token: one decode token (the one that consumed `first`)
    tr = collect(dataclasses.replace(lm, eos_ids=frozenset({second})), PROMPTS[:1], 5,
                 progress=False)
    assert tr.n_tokens == 1
    np.testing.assert_array_equal(tr.routed[0], full.routed[0])
    # EOS = the prefill's token: the prompt yields nothing and is left out, with a warning
    stop_first = dataclasses.replace(lm, eos_ids=frozenset({first}))
    with pytest.raises(CopeInputError, match="no prompt produced a decode token"), \
            pytest.warns(UserWarning, match="ended at once"):
        collect(stop_first, PROMPTS[:1], 3, progress=False)
    other = next(i for i, p in enumerate(PROMPTS)
                 if _greedy(lm, lm.tokenizer(p, return_tensors="pt").input_ids) != first)
    with pytest.warns(UserWarning, match="prompt 0 ended at once"):
        tr2 = collect(stop_first, [PROMPTS[0], PROMPTS[other]], 3, progress=False)
    assert tr2.prompt_ids.tolist() == [1]


def test_collect_with_predictor_fills_predicted(model_dirs, tmp_path):
    lm = load_model(model_dirs["olmoe"])
    with HiddenStateWriter(tmp_path / "hs", lm.geometry) as w:
        collect(lm, PROMPTS, 5, hidden_writer=w, stop_at_eos=False, progress=False)
    hs = read_hidden_states(tmp_path / "hs")
    pred, _ = train_predictor(hs, epochs=2, hidden_units=8)
    pred.save(tmp_path / "p.safetensors")
    with HiddenStateWriter(tmp_path / "hs2", lm.geometry) as w:
        tr = collect(lm, PROMPTS[:2], 4, hidden_writer=w, predictor=pred, stop_at_eos=False,
                     progress=False)
    hs2 = read_hidden_states(tmp_path / "hs2")
    assert tr.has_predictions and tr.predictor["kind"] == "mlp"
    assert (tr.predicted[:, -1] == -1).all()
    np.testing.assert_array_equal(tr.predicted, pred.predict(hs2.hidden.astype(np.float32)))


def test_cli_collect_writes_trace_and_hidden_states(model_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:2]) + "\n")
    out, hs = tmp_path / "t.parquet", tmp_path / "hs"
    args = ["trace", "collect", "--model", str(model_dirs["qwen3_moe"]), "--prompts", str(prompts),
            "--max-new-tokens", "4", "--ignore-eos", "--hidden-states", str(hs), "-o", str(out)]
    assert main(args) == 0
    tr = parquet_io.read_trace(out)
    assert tr.source == "collected" and tr.n_tokens == 6 and tr.model.name == "qwen3_moe"
    assert read_hidden_states(hs).hidden.shape == (6, 3, 32)
    assert main(args) == 2  # no overwrite without --force
    assert "already exists" in capsys.readouterr().err
    assert main(args + ["--force"]) == 0


def test_bad_inputs_are_one_line_errors(model_dirs, tmp_path, capsys):
    with pytest.raises(CopeInputError, match="config.json"):
        load_model(tmp_path)
    dense = tmp_path / "llama"
    tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=16,
                                       num_hidden_layers=1, num_attention_heads=2)
                        ).save_pretrained(dense)
    with pytest.raises(CopeInputError, match="model_type 'llama' is not a supported MoE family"):
        load_model(dense)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(CopeInputError, match="empty"):
        read_prompts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"other": 1}\n')
    with pytest.raises(CopeInputError, match="line 2"):
        read_prompts(bad)
    ok = tmp_path / "ok.txt"
    ok.write_text("one\n\ntwo words\n")
    assert read_prompts(ok) == ["one", "two words"]
    capsys.readouterr()
    for prompts, says in ((empty, "prompt file is empty"), (ok, "not a supported MoE family")):
        rc = main(["trace", "collect", "--model", str(dense), "--prompts", str(prompts),
                   "--max-new-tokens", "3", "-o", str(tmp_path / "x.parquet")])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith("cope: error:") and says in err
    assert not (tmp_path / "x.parquet").exists()


def test_order_falls_back_to_routing_weights_without_router_logits(model_dirs, monkeypatch):
    from cope_core.trace.sources import collect as collect_mod
    lm = load_model(model_dirs["mixtral"])
    normal = collect(lm, PROMPTS[:2], 5, stop_at_eos=False, progress=False)
    # Mixtral's weights are the renormalised top-k softmax: same order as the logits
    monkeypatch.setattr(collect_mod._Recorder, "_router_hook",
                        lambda self, j: (lambda module, args, output: None))
    fallback = collect(lm, PROMPTS[:2], 5, stop_at_eos=False, progress=False)
    np.testing.assert_array_equal(fallback.routed, normal.routed)


def test_chat_without_template_is_an_input_error(model_dirs):
    lm = load_model(model_dirs["olmoe"])
    with pytest.raises(CopeInputError, match="chat template"):
        collect(lm, PROMPTS[:1], 3, chat=True, progress=False)
