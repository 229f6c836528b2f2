"""Next-layer predictor: hidden-state folders, baselines and recall, training on a tiny model."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
from tiny import tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.trace.baselines import (
    baseline_predictions,
    popularity_lists,
    predict_trace,
    recall_at_k,
)
from cope_core.trace.sources.hidden import HiddenStateWriter, read_hidden_states
from cope_core.trace.sources.predictor import (
    Predictor,
    _build_module,
    _split,
    load_predictor,
    train_predictor,
)


# --- numpy parts, by hand -----------------------------------------------------------------------
def test_popularity_lists_rank_by_count_then_lower_id():
    routed = np.array([[[0, 1], [2, 3]], [[1, 2], [3, 0]], [[1, 0], [3, 2]]], np.int16)
    pop = popularity_lists(routed, 4, 3)
    # layer 0 counts: 0:2, 1:3, 2:1, 3:0 ; layer 1 counts: 0:1, 2:2, 3:3
    assert pop.tolist() == [[1, 0, 2], [3, 2, 0]]


def test_baselines_and_recall_by_hand():
    # two prompts: tokens 0-1 and 2; 3 layers, top-2 of 4
    routed = np.array([
        [[0, 1], [2, 3], [0, 1]],
        [[0, 2], [3, 1], [1, 2]],
        [[1, 3], [0, 1], [2, 3]],
    ], np.int16)
    starts = np.array([0, 2, 3])
    popular = np.array([[0, 1], [3, 1], [2, 1]], np.int16)
    prev = baseline_predictions(routed, starts, "previous-token", popular)
    # first token of each prompt falls back to popularity; last layer always empty
    assert prev[0].tolist() == [[3, 1], [2, 1], [-1, -1]]
    assert prev[1].tolist() == [[2, 3], [0, 1], [-1, -1]]
    assert prev[2].tolist() == [[3, 1], [2, 1], [-1, -1]]
    pop = baseline_predictions(routed, starts, "popularity", popular)
    assert (pop[:, 0] == [3, 1]).all() and (pop[:, 1] == [2, 1]).all()
    # recall of pair 0->1: token0 {3,1}&{2,3}=1, token1 {2,3}&{3,1}=1, token2 {3,1}&{0,1}=1
    # pair 1->2: token0 {2,1}&{0,1}=1, token1 {0,1}&{1,2}=1, token2 {2,1}&{2,3}=1
    np.testing.assert_allclose(recall_at_k(prev, routed), [0.5, 0.5])
    # a perfect prediction has recall 1; padding (-1) never counts
    oracle = np.full((3, 3, 3), -1, np.int16)
    oracle[:, :-1, :2] = routed[:, 1:]
    np.testing.assert_allclose(recall_at_k(oracle, routed), [1.0, 1.0])
    oracle[0, 0] = [-1, -1, -1]
    np.testing.assert_allclose(recall_at_k(oracle, routed), [2 / 3, 1.0])
    with pytest.raises(CopeInputError, match="method"):
        baseline_predictions(routed, starts, "oracle", popular)


def test_predict_trace_fills_predicted_and_round_trips(tmp_path):
    tr = tiny_trace()
    out = predict_trace(tr, "previous-token")
    assert out.predictor["method"] == "previous-token"
    pop = popularity_lists(tr.routed, 6, 2)
    for p in range(tr.n_prompts):
        a, b = tr.prompt_start[p], tr.prompt_start[p + 1]
        assert (out.predicted[a, :-1] == pop[1:]).all()
        assert (out.predicted[a + 1:b, :-1] == tr.routed[a:b - 1, 1:]).all()
    assert (out.predicted[:, -1] == -1).all()
    parquet_io.write_trace(out, tmp_path / "p.parquet")
    back = parquet_io.read_trace(tmp_path / "p.parquet")
    np.testing.assert_array_equal(back.predicted, out.predicted)
    assert main(["trace", "predict", str(tmp_path / "p.parquet"), "--method", "popularity",
                 "-o", str(tmp_path / "q.parquet")]) == 0
    q = parquet_io.read_trace(tmp_path / "q.parquet")
    assert (q.predicted[:, :-1] == pop[None, 1:]).all()


def test_split_is_by_prompt_and_disjoint():
    tr, va = _split(10, 0.25, seed=3)
    assert len(va) == 2 and len(tr) == 8 and not set(tr) & set(va)
    assert sorted(set(tr) | set(va)) == list(range(10))
    with pytest.raises(CopeInputError, match="at least 2 prompts"):
        _split(1, 0.25, 0)


# --- hidden-state folders -----------------------------------------------------------------------
def _fake_folder(path, hidden=8, prompts=3, tokens=4, layers=3, seed=0, chunk=5):
    from tiny import tiny_geometry
    g = tiny_geometry().with_layers(layers)
    rng = np.random.default_rng(seed)
    with HiddenStateWriter(path, g, chunk=chunk, dtype="float32") as w:
        for p in range(prompts):
            for t in range(tokens):
                routed = np.stack([rng.permutation(6)[:2] for _ in range(layers)])
                w.add(p, t, rng.normal(size=(layers, hidden)), routed)
    return g


def test_hidden_state_folder_streams_shards_and_reads_back(tmp_path):
    _fake_folder(tmp_path / "hs", chunk=5)
    index = json.loads((tmp_path / "hs" / "index.json").read_text())
    assert [s["tokens"] for s in index["shards"]] == [5, 5, 2]
    hs = read_hidden_states(tmp_path / "hs")
    assert hs.hidden.shape == (12, 3, 8) and hs.routed.shape == (12, 3, 2)
    assert hs.prompt.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]
    with pytest.raises(CopeInputError, match="already exists"):
        _fake_folder(tmp_path / "hs")


def test_failed_collection_leaves_no_folder(tmp_path):
    from tiny import tiny_geometry
    with pytest.raises(RuntimeError):
        with HiddenStateWriter(tmp_path / "hs", tiny_geometry()) as w:
            w.add(0, 0, np.zeros((3, 4)), np.zeros((3, 2), np.int16) + [[0, 1]])
            raise RuntimeError("model crashed")
    assert list(tmp_path.iterdir()) == []


def test_bad_hidden_states_are_one_line_errors(tmp_path):
    _fake_folder(tmp_path / "a", hidden=8)
    _fake_folder(tmp_path / "b", hidden=6)
    with pytest.raises(CopeInputError, match="do not match") as e:
        train_predictor([read_hidden_states(tmp_path / "a"), read_hidden_states(tmp_path / "b")])
    assert "\n" not in str(e.value) and str(tmp_path / "b") in str(e.value)
    with pytest.raises(CopeInputError, match="index.json"):
        read_hidden_states(tmp_path)
    idx = tmp_path / "a" / "index.json"
    data = json.loads(idx.read_text())
    data["hidden"] = 9
    idx.write_text(json.dumps(data))
    with pytest.raises(CopeInputError, match="expected"):
        read_hidden_states(tmp_path / "a")
    from tiny import tiny_geometry
    with HiddenStateWriter(tmp_path / "c", tiny_geometry()) as w:
        with pytest.raises(CopeInputError, match="float32"):
            w.add(0, 0, np.full((3, 4), 1e6), np.tile([0, 1], (3, 1)))


def _hand_predictor(seed: int) -> Predictor:
    """An untrained predictor for tiny_geometry (3 layers, top-2 of 6), hidden 4, 5 units."""
    import torch
    from tiny import tiny_geometry
    torch.manual_seed(seed)
    return Predictor(_build_module(2, 4, 5, 6), tiny_geometry(), {"width": 2, "seed": seed})


def test_predictor_save_creates_missing_parent_folders_and_writes_atomically(tmp_path):
    pred = _hand_predictor(0)
    path = tmp_path / "new" / "sub" / "p.safetensors"
    pred.save(path)
    back = load_predictor(path)
    x = np.random.default_rng(0).normal(size=(7, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(back.predict(x), pred.predict(x))
    assert back.meta["format"] == "cope.predictor/1" and back.meta["seed"] == 0
    assert sorted(q.name for q in path.parent.iterdir()) == ["p.safetensors"]  # no temp left
    with pytest.raises(CopeInputError, match="already exists"):
        pred.save(path)
    _hand_predictor(1).save(path, overwrite=True)
    assert load_predictor(path).meta["seed"] == 1
    assert sorted(q.name for q in path.parent.iterdir()) == ["p.safetensors"]


def test_predictor_save_refuses_a_folder_and_an_unwritable_parent(tmp_path):
    pred = _hand_predictor(0)
    (tmp_path / "d").mkdir()
    with pytest.raises(CopeInputError) as e:
        pred.save(tmp_path / "d", overwrite=True)
    assert str(e.value) == f"{tmp_path / 'd'}: is a directory, expected a file path to write"
    (tmp_path / "f").write_text("a file, not a folder")
    with pytest.raises(CopeInputError) as e:
        pred.save(tmp_path / "f" / "p.safetensors")
    assert str(e.value).startswith(f"{tmp_path / 'f' / 'p.safetensors'}: cannot write (")
    assert "\n" not in str(e.value)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["d", "f"]
    assert list((tmp_path / "d").iterdir()) == []


def test_predictor_save_that_fails_keeps_the_old_file(tmp_path, monkeypatch):
    import safetensors.torch
    path = tmp_path / "p.safetensors"
    _hand_predictor(0).save(path)
    old = path.read_bytes()

    def half_written(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    with pytest.raises(CopeInputError) as e:
        _hand_predictor(1).save(path, overwrite=True)
    assert str(e.value) == f"{path}: cannot write ([Errno 28] No space left on device)"
    assert path.read_bytes() == old and [q.name for q in tmp_path.iterdir()] == ["p.safetensors"]


# --- training on a tiny real model --------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_hidden(tmp_path_factory):
    pytest.importorskip("transformers")
    from cope_core.trace.sources.collect import collect, load_model
    from cope_core.trace.sources.tiny_models import WORDS, build_tiny_model
    root = tmp_path_factory.mktemp("pred")
    lm = load_model(build_tiny_model("mixtral", root / "m", layers=4, seed=1))
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(16)]
    with HiddenStateWriter(root / "hs", lm.geometry, chunk=64) as w:
        tr = collect(lm, prompts, 17, hidden_writer=w, stop_at_eos=False, progress=False)
    return root, tr


@pytest.mark.slow
def test_predictor_beats_both_baselines_on_held_out_prompts(tiny_hidden):
    root, tr = tiny_hidden
    hs = read_hidden_states(root / "hs")
    pred, res = train_predictor(hs, epochs=40, seed=0)
    assert res.train_prompts + res.val_prompts == 16 and res.val_prompts == 4
    assert res.val_tokens == 4 * 16
    assert res.recall > res.recall_previous_token + 0.1
    assert res.recall > res.recall_popularity + 0.1
    # the reported baseline numbers are the plain baselines on exactly the held-out prompts
    _, va = _split(16, 0.25, 0)
    rows = np.concatenate([np.flatnonzero(hs.prompt == p) for p in va])
    starts = np.arange(0, len(rows) + 1, 16)
    tr_rows = np.setdiff1d(np.arange(len(hs.prompt)), rows)
    popular = popularity_lists(hs.routed[tr_rows], 8, 2)
    prev = baseline_predictions(hs.routed[rows], starts, "previous-token", popular)
    assert res.recall_previous_token == pytest.approx(recall_at_k(prev, hs.routed[rows]).mean())
    # save / load gives the same predictions
    pred.save(root / "p.safetensors", overwrite=True)
    back = load_predictor(root / "p.safetensors")
    x = hs.hidden[:5].astype(np.float32)
    np.testing.assert_array_equal(back.predict(x), pred.predict(x))
    assert back.meta["recall"] == pytest.approx(res.recall)


@pytest.mark.slow
def test_cli_predictor_train_json(tiny_hidden, tmp_path, capsys):
    root, _ = tiny_hidden
    out = tmp_path / "p.safetensors"
    assert main(["predictor", "train", "--hidden-states", str(root / "hs"), "--epochs", "3",
                 "-o", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res) >= {"recall", "recall_previous_token", "recall_popularity", "per_pair"}
    assert len(res["per_pair"]["predictor"]) == 3 and out.is_file()
    assert main(["predictor", "train", "--hidden-states", str(root / "hs"), "-o", str(out)]) == 2
    bad = tmp_path / "not-a-predictor.safetensors"
    bad.write_bytes(b"garbage")
    with pytest.raises(CopeInputError, match="not a COPE predictor"):
        load_predictor(bad)
