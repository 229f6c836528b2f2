"""Importers of the serving runtimes' own routing records
(cope_core.trace.sources.importers.runtimes), on the dumps in tests/data/import
(scripts/make_import_fixtures.py: the vLLM ones written by vLLM's own output classes and
encoder, the SGLang one following its recorder's code)."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.geometry import get_model
from cope_core.parquet_io import read_trace
from cope_core.trace.sources.importers.runtimes import import_sglang, import_vllm

DATA = Path(__file__).parent / "data" / "import"
G = get_model("deepseek-v2-lite").with_layers(3)   # 4 blocks, the first dense; top-6 of 64
SGLANG = DATA / "expert_distribution_recorder_1700000000.0_0.pt"


def _vllm_completions(path: Path) -> list[tuple[int, int, np.ndarray | None]]:
    """(P, G, routed_experts) of every completion, decoded independently of the importer."""
    out = []
    for line in path.read_text().splitlines():
        obj = json.loads(line)
        for c in obj.get("outputs", obj.get("choices", [])):
            P = len(c.get("prompt_token_ids") or obj.get("prompt_token_ids"))
            r = c["routed_experts"]
            if isinstance(r, str):
                r = np.load(io.BytesIO(base64.b64decode(r)))
            out.append((P, len(c["token_ids"]), None if r is None else np.asarray(r)))
    return out


def test_vllm_offline_request_outputs():
    tr, rep = import_vllm([DATA / "vllm-offline.jsonl"], G)
    comps = _vllm_completions(DATA / "vllm-offline.jsonl")
    assert [(P, g) for P, g, _ in comps] == [(5, 4), (5, 3), (3, 6), (4, 1)]
    # decode token t is row P + t, the dense block dropped; request 1 is cut at token 3, where
    # the capture left MoE block 2 blank; request 2 had no routing at all
    want = [comps[0][2][5:8, 1:], comps[1][2][5:7, 1:], comps[2][2][3:6, 1:]]
    np.testing.assert_array_equal(tr.routed, np.concatenate(want))
    assert tr.prompt_start.tolist() == [0, 3, 5, 8]
    assert tr.context.tolist() == [5, 6, 7, 5, 6, 3, 4, 5]
    assert [(p.tokens_seen, p.tokens_kept, p.cut_at, p.prefill_dropped) for p in rep.prompts] \
        == [(3, 3, None, 5), (2, 2, None, 5), (5, 3, 3, 3)]
    assert rep.prefill_dropped == 13 and rep.context_recorded
    assert any("request 2 output 0: routed_experts is null" in n for n in rep.notes)
    assert "13 prefill tokens left out" in tr.description and tr.source == "imported"


def test_vllm_openai_responses_and_saved_arrays():
    tr, rep = import_vllm([DATA / "vllm-openai.jsonl", DATA / "vllm-request.npz"], G)
    comps = _vllm_completions(DATA / "vllm-openai.jsonl")
    z = np.load(DATA / "vllm-request.npz")
    want = [comps[0][2][6:, 1:], comps[1][2][2:, 1:], z["routed_experts"][4:, 1:]]
    assert [len(w) for w in want] == [4, 2, 4]
    np.testing.assert_array_equal(tr.routed, np.concatenate(want))
    assert tr.context.tolist() == [6, 7, 8, 9, 2, 3, 4, 5, 6, 7]
    assert rep.prefill_dropped == 6 + 2 + 4


def test_vllm_bare_npy_needs_the_prompt_length(tmp_path):
    arr = np.load(DATA / "vllm-request.npz")["routed_experts"]
    np.save(tmp_path / "r.npy", arr)
    with pytest.raises(CopeInputError, match="prompt-tokens"):
        import_vllm([tmp_path / "r.npy"], G)
    tr, _ = import_vllm([tmp_path / "r.npy"], G, prompt_tokens=4)
    np.testing.assert_array_equal(tr.routed, arr[4:, 1:])


@pytest.mark.parametrize("edit,says", [
    (lambda o: o["outputs"][0].update(routed_experts=[[[1, 2]]]), "expected top_k = 6"),
    (lambda o: o["outputs"][0].update(token_ids=list(range(40))), "rows for 5 prompt and 40"),
    (lambda o: o["outputs"][0].update(routed_experts="not base64!"), "not base64 .npy"),
    (lambda o: o["outputs"][0]["routed_experts"][6][1].__setitem__(0, 99), "out of range"),
    (lambda o: o.pop("prompt_token_ids") and o["outputs"][0].pop("token_ids"),
     "cannot tell prefill from decode"),
])
def test_vllm_bad_records(tmp_path, edit, says):
    obj = json.loads((DATA / "vllm-offline.jsonl").read_text().splitlines()[0])
    edit(obj)
    (tmp_path / "bad.jsonl").write_text(json.dumps(obj) + "\n")
    with pytest.raises(CopeInputError) as info:
        import_vllm([tmp_path / "bad.jsonl"], G)
    assert says in str(info.value) and "bad.jsonl" in str(info.value)
    assert "\n" not in str(info.value)


def test_vllm_layer_count_must_match():
    with pytest.raises(CopeInputError, match="4 layers, expected 5 MoE layers or 6 blocks"):
        import_vllm([DATA / "vllm-offline.jsonl"], G.with_layers(5))


def test_sglang_per_token_dump():
    tr, rep = import_sglang([SGLANG], G)
    dump = torch.load(SGLANG, weights_only=True)
    p2l = dump["last_physical_to_logical_map"].numpy()
    decode = [r for r in dump["records"] if r["forward_mode"] == 2]
    rows = np.stack([r["topk_ids_of_layer"][:, 0, :6].numpy() for r in decode])  # [T, 4, 6]
    logical = np.take_along_axis(p2l[None], rows.clip(0), axis=2)[:, 1:]      # MoE blocks
    # prompt A: 4 decode passes; prompt B: 3, the last with a blank layer -> cut at token 2
    np.testing.assert_array_equal(tr.routed, logical[:6])
    assert (rows >= G.n_experts).any(), "the fixture exercises the physical-to-logical map"
    assert tr.prompt_start.tolist() == [0, 4, 6]
    assert tr.context.tolist() == [5, 6, 7, 8, 6, 7]
    assert [(p.tokens_seen, p.tokens_kept, p.cut_at, p.prefill_dropped) for p in rep.prompts] \
        == [(4, 4, None, 5), (3, 2, 2, 6)]


def _dump(tmp_path, records, p2l=None) -> Path:
    path = tmp_path / "d.pt"
    torch.save({"records": records, "last_physical_to_logical_map": p2l}, path)
    return path


def _pass(mode, positions, lens=None, T_ids=None):
    T = len(positions) if T_ids is None else T_ids
    ids = torch.full((4, T, 8), -1, dtype=torch.int32)
    ids[1:, :, :6] = torch.arange(6, dtype=torch.int32)
    return dict(forward_pass_id=0, forward_mode=mode, positions=positions,
                extend_seq_lens=lens, topk_ids_of_layer=ids, input_ids=list(range(T)))


@pytest.mark.parametrize("records,says", [
    ([_pass(1, [0, 1, 0], [2, 1])], "2 requests in one pass"),
    ([_pass(1, [0]), _pass(2, [1, 5])], "2 tokens in a decode pass"),
    ([_pass(1, [0]), _pass(2, [3])], "decode at position 3, expected position 1"),
    ([_pass(2, [0])], "expected a prefill first"),
    ([_pass(1, [4])], "prefill continues at position 4"),
    ([_pass(7, [0])], "forward_mode 7"),
])
def test_sglang_dumps_it_cannot_attribute(tmp_path, records, says):
    with pytest.raises(CopeInputError) as info:
        import_sglang([_dump(tmp_path, records)], G)
    assert says in str(info.value) and "d.pt" in str(info.value)


def test_sglang_refuses_pickled_objects(tmp_path):
    torch.save({"records": [object()]}, tmp_path / "evil.pt")  # weights_only refuses to load it
    with pytest.raises(CopeInputError, match="not a torch.save file of plain data"):
        import_sglang([tmp_path / "evil.pt"], G)


def test_cli_import_vllm_and_sglang(tmp_path, capsys):
    out = tmp_path / "v.parquet"
    assert main(["trace", "import", "--format", "vllm", str(DATA / "vllm-offline.jsonl"),
                 "--model", "deepseek-v2-lite", "--layers", "3", "-o", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["prefill_dropped"] == 13 and rep["tokens"] == 8
    assert read_trace(out).n_prompts == 3
    assert main(["trace", "import", "--format", "sglang", str(SGLANG), "--model",
                 "deepseek-v2-lite", "--layers", "3", "-o", str(tmp_path / "s.parquet")]) == 0
    text = capsys.readouterr().out
    assert "prompt 1 (" in text and "cut at token 2" in text and "6 prefill tokens left out" \
        in text
