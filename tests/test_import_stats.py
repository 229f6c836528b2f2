"""Importing foreign traces, trace statistics and the calibrated synthetic generator."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny import tiny_geometry, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.geometry import get_model
from cope_core.trace.fit import coverage_curve, fit_skew_to_counts, fit_synth, transfer_curve
from cope_core.trace.sources.importers import import_trace
from cope_core.trace.stats import fixed_hit_rate, reuse, skew, trace_stats
from cope_core.trace.synth import synthesize

REAL = Path(__file__).resolve().parents[2] / "shared" / "realdata" / "mixtral-8x7b-instruct-decode"
real_data = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} is not present")


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _records(prompt, tokens, layers=3, skip=(), **extra):
    out = []
    for l in range(layers):
        for t in range(tokens):
            if (t, l) not in skip:
                out.append({"problem_id": prompt, "layer": l, "token_idx": t,
                            "experts": [(t + l) % 6, (t + l + 1) % 6], **extra})
    return out


# --- JSON lines ---------------------------------------------------------------------------------
def test_jsonl_cuts_each_prompt_at_its_first_incomplete_token(tmp_path):
    g = tiny_geometry()                                   # 3 layers, top-2 of 6
    recs = _records(0, 5, skip={(3, 1)}) + _records(1, 2) + _records(2, 2, skip={(0, 2)})
    tr, rep = import_trace("jsonl", [_jsonl(tmp_path / "a.jsonl", recs)], g, context_start=7)
    assert tr.prompt_ids.tolist() == [0, 1]              # prompt 2 has no complete token
    assert tr.tokens_per_prompt.tolist() == [3, 2]
    assert [(p.tokens_seen, p.tokens_kept, p.cut_at, p.records_dropped) for p in rep.prompts] == \
        [(5, 3, 3, 5), (2, 2, None, 0), (2, 0, 0, 5)]
    assert rep.records_dropped == 10 and [p.prompt for p in rep.dropped] == [2]
    assert len(recs) == tr.n_tokens * 3 + rep.records_dropped   # every record kept or reported
    assert tr.routed[4].tolist() == [[1, 2], [2, 3], [3, 4]]   # prompt 1, token 1
    assert tr.context.tolist() == [7, 8, 9, 7, 8]
    assert not rep.context_recorded and "not recorded" in tr.description
    assert tr.source == "imported" and tr.predicted.shape[2] == 0
    assert any("cut at token 3" in line for line in rep.lines())


def test_jsonl_orders_by_gating_probs_and_keeps_recorded_context(tmp_path):
    g = tiny_geometry().with_layers(1)
    recs = [{"dataset": "d", "problem_id": 4, "layer": 0, "token": 0, "experts": [1, 5],
             "gating_probs": [0.3, 0.7], "context": 12},
            {"dataset": "d", "problem_id": 4, "layer": 0, "token": 1, "experts": [2, 0],
             "gating_probs": [0.6, 0.4], "context": 13},
            {"dataset": "e", "problem_id": 4, "layer": 0, "token": 0, "experts": [3, 4],
             "context": 40}]
    tr, rep = import_trace("jsonl", [_jsonl(tmp_path / "a.jsonl", recs)], g)
    assert tr.routed[:, 0].tolist() == [[5, 1], [2, 0], [3, 4]]
    assert tr.prompt_ids.tolist() == [0, 1] and tr.context.tolist() == [12, 13, 40]
    assert rep.context_recorded


@pytest.mark.parametrize("record, says", [
    ({"layer": 0, "token_idx": 0, "experts": [0, 1]}, "missing field 'prompt' or 'problem_id'"),
    ({"problem_id": 0, "token_idx": 0, "experts": [0, 1]}, "missing field 'layer'"),
    ({"problem_id": 0, "layer": 0, "experts": [0, 1]}, "missing field 'token_idx' or 'token'"),
    ({"problem_id": 0, "layer": 0, "token_idx": 0}, "missing field 'experts'"),
    ({"problem_id": 0, "layer": 3, "token_idx": 0, "experts": [0, 1]},
     "expected an integer in 0..2"),
    ({"problem_id": 0, "layer": 0, "token_idx": 0, "experts": [0]}, "expected a list of 2"),
    ({"problem_id": 0, "layer": 0, "token_idx": 0, "experts": [0, 9]},
     "expected an integer in 0..5"),
    ({"problem_id": 0, "layer": 0, "token_idx": 1, "experts": [2, 2]}, "line 2: repeats an expert"),
])
def test_jsonl_bad_records_are_one_line_errors(tmp_path, record, says):
    path = _jsonl(tmp_path / "bad.jsonl", _records(0, 1)[:1] + [record])
    with pytest.raises(CopeInputError, match=says.replace("(", r"\(")) as e:
        import_trace("jsonl", [path], tiny_geometry())
    assert "\n" not in str(e.value) and "bad.jsonl" in str(e.value)


def test_jsonl_conflicting_duplicate_and_invalid_json(tmp_path):
    recs = _records(0, 1) + [{"problem_id": 0, "layer": 0, "token_idx": 0, "experts": [4, 5]}]
    with pytest.raises(CopeInputError, match="line 4: second, different record"):
        import_trace("jsonl", [_jsonl(tmp_path / "a.jsonl", recs)], tiny_geometry())
    (tmp_path / "b.jsonl").write_text('{"problem_id": 0,\n')
    with pytest.raises(CopeInputError, match="line 1 is not valid JSON"):
        import_trace("jsonl", [tmp_path / "b.jsonl"], tiny_geometry())


@pytest.mark.parametrize("name, value, shown", [
    ("prompt", [1, 2], "[1, 2]"),
    ("problem_id", {"id": 3}, "{'id': 3}"),
    ("prompt", True, "True"),
    ("prompt", None, "None"),
    ("dataset", ["gsm8k"], "['gsm8k']"),
])
def test_jsonl_prompt_id_that_is_not_a_string_or_number(tmp_path, capsys, name, value, shown):
    bad = {"problem_id": 0, "layer": 0, "token_idx": 1, "experts": [0, 1], name: value}
    path = _jsonl(tmp_path / "bad.jsonl", _records(0, 1)[:1] + [bad])
    with pytest.raises(CopeInputError) as e:
        import_trace("jsonl", [path], tiny_geometry())
    assert str(e.value) == (f"{path}: field '{name}': line 2: got {shown}, expected a string "
                            f"or a number")
    assert main(["trace", "import", "--format", "jsonl", str(path), "--model", "mixtral-8x7b",
                 "--layers", "3", "-o", str(tmp_path / "out.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"field '{name}': line 2: got {shown}, expected a string or a number" in err
    assert not (tmp_path / "out.parquet").exists()


def test_jsonl_prompt_ids_may_be_strings_or_numbers(tmp_path):
    recs = [{"prompt": p, "layer": 0, "token_idx": 0, "experts": [0, 1], "dataset": d}
            for p, d in (("q7", None), (7, None), (7, "x"), (2.5, 4))]
    tr, rep = import_trace("jsonl", [_jsonl(tmp_path / "a.jsonl", recs)],
                           tiny_geometry().with_layers(1))
    assert tr.prompt_ids.tolist() == [0, 1, 2, 3]
    assert [p.source for p in rep.prompts] == ["a.jsonl: q7", "a.jsonl: 7", "a.jsonl: x/7",
                                               "a.jsonl: 4/2.5"]


# --- numpy --------------------------------------------------------------------------------------
def test_npz_import_cuts_at_missing_ids(tmp_path):
    g = tiny_geometry()
    a = np.array([[[0, 1], [2, 3], [4, 5]], [[1, 2], [3, -1], [5, 0]], [[2, 3], [4, 5], [0, 1]]])
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "b.npz", routed=a[[0, 2]], context=np.array([30, 31]))
    np.savez(tmp_path / "c.npz", x=a[[2]], y=a[[0, 0]] * 0 + [[0, 1], [1, 2], [2, 3]])
    tr, rep = import_trace("npz", [tmp_path / "a.npy", tmp_path / "b.npz", tmp_path / "c.npz"], g)
    assert tr.tokens_per_prompt.tolist() == [1, 2, 1, 2]
    assert [p.cut_at for p in rep.prompts] == [1, None, None, None]
    assert rep.prompts[0].records_dropped == 5            # token 1's other two layers + token 2
    assert not rep.context_recorded  # one prompt lacks context, so none is trusted
    np.testing.assert_array_equal(tr.routed[1:3], a[[0, 2]])
    np.save(tmp_path / "bad.npy", a[:, :2])
    with pytest.raises(CopeInputError, match=r"expected integers \[tokens, 3, 2\]"):
        import_trace("npz", [tmp_path / "bad.npy"], g)
    (tmp_path / "x.npz").write_bytes(b"nope")
    with pytest.raises(CopeInputError, match="not a numpy"):
        import_trace("npz", [tmp_path / "x.npz"], g)


# --- statistics ---------------------------------------------------------------------------------
def _hit_rate_reference(trace, K):
    """Plain loops: each layer keeps its K most routed experts (ties to the lower id)."""
    L, E, k = trace.model.n_layers, trace.model.n_experts, trace.model.top_k
    hits = 0
    for l in range(L):
        counts = [sum(e in trace.routed[t, l] for t in range(trace.n_tokens)) for e in range(E)]
        resident = sorted(range(E), key=lambda e: (-counts[e], e))[:K]
        hits += sum(int(e in resident) for t in range(trace.n_tokens) for e in trace.routed[t, l])
    return hits / (trace.n_tokens * L * k)


def test_stats_by_hand_on_the_tiny_trace():
    tr = tiny_trace()
    np.testing.assert_allclose(skew(tr), [0.4, 0.3, 0.3])
    np.testing.assert_allclose(reuse(tr), [0.5, 0.5, 1 / 3])
    st = trace_stats(tr)
    np.testing.assert_allclose(st.recall, [0.6, 0.5])
    np.testing.assert_allclose(st.hit_rate, [_hit_rate_reference(tr, K) for K in range(7)])
    assert st.hit_rate[0] == 0 and st.hit_rate[-1] == 1
    d = st.to_dict()
    assert d["mean"]["skew"] == pytest.approx(1 / 3) and d["mean"]["uniform_skew"] == 1 / 6
    text = st.format()
    assert "optimistic" in text and "0.600" in text


def test_stats_with_calibration_and_on_synthetic_extremes():
    g = get_model("olmoe-1b-7b").with_layers(2)
    flat = synthesize(g, prompts=2, tokens=40, seed=1, skew=0.0, reuse=0.0)
    steep = synthesize(g, prompts=2, tokens=40, seed=1, skew=3.0, reuse=0.9)
    assert skew(steep).min() > skew(flat).max()
    assert reuse(steep).min() > 0.85 > 0.3 > reuse(flat).max()
    # the calibration trace sets the popularity order
    cal = trace_stats(flat, calibration=steep)
    np.testing.assert_allclose(cal.hit_rate, fixed_hit_rate(flat, range(65), steep))
    with pytest.raises(CopeInputError, match="calibration geometry"):
        trace_stats(flat, calibration=tiny_trace())


def test_cli_stats_json_and_table(tmp_path, capsys):
    parquet_io.write_trace(tiny_trace(), tmp_path / "t.parquet")
    assert main(["trace", "stats", str(tmp_path / "t.parquet"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ks"] == list(range(7)) and d["recall"] == pytest.approx([0.6, 0.5])
    assert main(["trace", "stats", str(tmp_path / "t.parquet")]) == 0
    assert "hit rate vs K" in capsys.readouterr().out
    assert main(["trace", "stats", str(tmp_path / "missing.parquet")]) == 2


# --- calibrated synthesis -----------------------------------------------------------------------
def test_fit_recovers_the_generator_parameters():
    g = get_model("qwen1.5-moe-a2.7b").with_layers(4)      # 60 experts, top-4
    real = synthesize(g, prompts=6, tokens=80, seed=11, skew=1.2, reuse=0.35,
                      predictor_accuracy=0.6)
    f = fit_synth(real, seed=2)
    assert f.skew == pytest.approx(1.2, abs=0.15)
    assert f.reuse == pytest.approx(0.35, abs=0.08)
    assert f.predictor_accuracy == pytest.approx(0.6, abs=0.03)
    assert f.max_gap < 0.02


def test_fit_with_a_fixed_skew_fits_only_reuse():
    g = get_model("qwen1.5-moe-a2.7b").with_layers(4)
    real = synthesize(g, prompts=6, tokens=80, seed=11, skew=1.2, reuse=0.35,
                      predictor_accuracy=None)
    f = fit_synth(real, seed=2, skew=0.9)
    assert f.skew == 0.9
    assert f.reuse == pytest.approx(0.35, abs=0.1)
    with pytest.raises(CopeInputError, match="skew"):
        fit_synth(real, skew=-1.0)


def test_coverage_curve_by_hand():
    # rows normalised on their own: [3, 1] -> .75, .25 ; [0, 2] -> 1, 0 (sorted)
    assert coverage_curve([[3, 1], [0, 2]]).tolist() == [0.0, 0.875, 1.0]
    assert coverage_curve([1, 1, 2]).tolist() == pytest.approx([0.0, 0.5, 0.75, 1.0])
    for bad in ([[0, 0]], [[1, -1]], [[1, np.nan]]):
        with pytest.raises(CopeInputError, match="counts"):
            coverage_curve(bad)


def test_transfer_curve_keeps_the_fraction_of_experts():
    c = np.array([0.0, 0.5, 0.75, 0.9, 1.0])           # 4 experts
    t = transfer_curve(c, 8)
    assert t[[0, 2, 4, 6, 8]].tolist() == c.tolist()    # same fractions, same share
    assert t[1] == pytest.approx(0.25) and t[3] == pytest.approx(0.625)


@pytest.mark.slow
def test_skew_fit_recovers_the_generator_skew():
    g = get_model("olmoe-1b-7b")
    probe = synthesize(g.with_layers(4), prompts=1, tokens=4000, seed=5, skew=0.8, reuse=0.0,
                       predictor_accuracy=None)
    counts = np.stack([np.bincount(probe.routed[:, l].ravel(), minlength=g.n_experts)
                       for l in range(4)])
    f = fit_skew_to_counts(coverage_curve(counts), g, seed=1)
    assert f.skew == pytest.approx(0.8, abs=0.05)
    assert f.max_gap < 0.02
    with pytest.raises(CopeInputError, match="65 points"):
        fit_skew_to_counts(np.zeros(9), g)


# --- the real Mixtral decode trace --------------------------------------------------------------
@real_data
def test_real_mixtral_import(tmp_path, capsys):
    files = sorted(str(p) for p in REAL.glob("*.jsonl"))
    out = tmp_path / "mixtral.parquet"
    assert main(["trace", "import", "--format", "jsonl", *files, "--model", "mixtral-8x7b",
                 "-o", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    tr = parquet_io.read_trace(out)
    assert tr.n_prompts == 4 and tr.model.name == "mixtral-8x7b"
    # the README's decode-token counts, each cut at its first token missing a layer
    assert [p["tokens_seen"] for p in rep["prompts"]] == [168, 79, 83, 255]
    assert all(p["cut_at"] == p["tokens_kept"] for p in rep["prompts"])
    lines = sum(1 for f in files for _ in open(f))
    assert lines == tr.n_tokens * 32 + rep["records_dropped"]
    first = json.loads(open(files[0]).readline())
    assert tr.routed[0, 0].tolist() == first["experts"]   # gsm8k problem 0, token 0, layer 0
    st = trace_stats(tr)
    assert 0.125 < st.mean_skew < 0.3 and 0.25 < st.mean_reuse < 0.6


@real_data
@pytest.mark.slow
def test_synth_fit_reproduces_the_real_hit_rate_curve(tmp_path, capsys):
    files = sorted(str(p) for p in REAL.glob("*.jsonl"))
    real = tmp_path / "real.parquet"
    assert main(["trace", "import", "--format", "jsonl", *files, "--model", "mixtral-8x7b",
                 "-o", str(real)]) == 0
    syn = tmp_path / "syn.parquet"
    assert main(["synth", "--fit", str(real), "--seed", "5", "-o", str(syn)]) == 0
    assert "fitted skew" in capsys.readouterr().out
    r, s = parquet_io.read_trace(real), parquet_io.read_trace(syn)
    assert s.n_prompts == r.n_prompts and s.predictor is None
    gap = np.abs(fixed_hit_rate(s, range(9)) - fixed_hit_rate(r, range(9)))
    assert gap.max() <= 0.05, gap


def test_synth_fit_cli_defaults_and_errors(tmp_path, capsys):
    g = get_model("olmoe-1b-7b").with_layers(2)
    real = synthesize(g, prompts=3, tokens=30, seed=4, skew=0.8, reuse=0.4, predictor_accuracy=0.5)
    parquet_io.write_trace(real, tmp_path / "real.parquet")
    out = tmp_path / "syn.parquet"
    assert main(["synth", "--fit", str(tmp_path / "real.parquet"), "--seed", "1",
                 "--tokens", "12", "-o", str(out)]) == 0
    s = parquet_io.read_trace(out)
    assert (s.n_prompts, s.n_tokens, s.model.n_layers) == (3, 36, 2)   # prompts from the trace
    assert s.predictor["accuracy"] == pytest.approx(0.5, abs=0.05)    # fitted from its recall
    assert "fitted to" in s.description
    capsys.readouterr()
    assert main(["synth", "--prompts", "2", "--tokens", "2", "--seed", "0",
                 "-o", str(tmp_path / "x.parquet")]) == 2
    assert "--model, --prompts and --tokens are required" in capsys.readouterr().err
    assert main(["synth", "--fit", str(tmp_path / "real.parquet"), "--model", "mixtral-8x7b",
                 "--seed", "0", "-o", str(tmp_path / "y.parquet")]) == 2
    assert "routes top-2 of 8" in capsys.readouterr().err
