"""``cope export`` and ``cope_core.export``: the policy record and the runtime formats.

The runtime checks are independent re-statements of what each runtime does with the output:
llama.cpp's ``-ot`` regex is searched over every tensor name of the model (enumerated here from
GGUF naming) and compared with llama.cpp's own ``--n-cpu-moe`` rule; KTransformers' rules are
applied first-match over every ``model.layers.N`` experts module; the SGLang-KT tensor is loaded
as the runtime loads it and put through its frequency selection (top-k over all MoE layers).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_tools import expert_tensor, gguf_names
from tiny import make_policy, tiny_geometry, tiny_profile, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError, UnsupportedByRuntime
from cope_core.estimate.predict import predict
from cope_core.export import (
    FORMATS,
    build_policy,
    policy_json,
    read_policy,
    render,
    write_policy,
)
from cope_core.export.vllm import vllm_offload
from cope_core.geometry import CATALOG, GIB, MIB, get_model
from cope_core.matrix import CANDIDATE_IDS
from cope_core.placement import int_set_regex, layer_plan
from cope_core.platforms import platform_spec
from cope_core.trace.data import Trace

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
PER_EXPERT = [c for c in CANDIDATE_IDS if c != "layer_partition"]
# llama.cpp's own pattern for --n-cpu-moe (common/common.h, LLM_FFN_EXPS_REGEX), per block i
LLAMA_NCMOE = r"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps"


# --- helpers ------------------------------------------------------------------------------------
def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, out, err, *needles):
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cope: error:"), err
    assert "Traceback" not in err + out
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def with_dense(trace: Trace, dense: int) -> Trace:
    g = dataclasses.replace(trace.model, dense_layers=dense)
    return dataclasses.replace(trace, model=g)


def llama_flags(text: str) -> tuple[int, str | None]:
    # the layer partition's --n-cpu-moe line is the one before its explicit override's (the
    # MoE-cache search leads a best pick and follows a chosen candidate as a comment)
    lines = text.splitlines()
    short = lines[lines.index("# or the same placement as an explicit tensor override:") - 1]
    n = int(re.findall(r"--n-cpu-moe (\d+)", short)[-1])
    m = re.search(r"-ot '([^']*)=CPU'", text)
    return n, (m.group(1) if m else None)


def popularity_fill(cal: Trace, K: int) -> list[list[int]]:
    """Reference fill: per layer, count tokens routed to each expert; most first, ties low id."""
    out = []
    for layer in range(cal.model.n_layers):
        counts = Counter(int(e) for e in cal.routed[:, layer, :].ravel())
        order = sorted(range(cal.model.n_experts), key=lambda e: (-counts[e], e))
        out.append(order[:K])
    return out


def spec_profile():
    """The tiny profile with a complete roofline spec, so that HRM runs too."""
    prof = tiny_profile()
    return dataclasses.replace(prof, platform={**prof.platform,
                                               "spec": platform_spec("h100").to_dict()})


@pytest.fixture
def files(tmp_path):
    """This module's files (in place of conftest's): a tiny trace, a calibration trace (its
    tokens reversed) and a profile whose platform carries a spec, as the exports need."""
    t, c, p = tmp_path / "trace.parquet", tmp_path / "cal.parquet", tmp_path / "profile.parquet"
    tr = tiny_trace()
    parquet_io.write_trace(tr, t)
    cal = dataclasses.replace(tr, routed=tr.routed[::-1].copy(),
                              predicted=tr.predicted[::-1].copy(), context=tr.context[::-1].copy())
    parquet_io.write_trace(cal, c)
    parquet_io.write_profile(spec_profile(), p)
    return {"trace": t, "cal": c, "profile": p, "dir": tmp_path}


def build_args(f, *extra):
    return ["export", "--trace", f["trace"], "--calibration", f["cal"], "--profile", f["profile"],
            *extra]


# --- block-number regex -------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.sets(st.integers(0, 250), min_size=1))
def test_int_set_regex_matches_exactly_the_set(values):
    pat = int_set_regex(values)
    assert "," not in pat and "=" not in pat
    rx = re.compile(rf"^{pat}$")
    for i in range(1200):
        assert bool(rx.match(str(i))) == (i in values), (i, pat)
    for v in values:  # no leading zeros
        assert not rx.match("0" + str(v))


# --- llama.cpp ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["deepseek-v2-lite", "qwen3-30b-a3b", "gpt-oss-20b",
                                  "mixtral-8x7b", "olmoe-1b-7b"])
@pytest.mark.parametrize("fused,scales", [(False, False), (True, False), (False, True)])
def test_llamacpp_regex_matches_exactly_the_cpu_blocks_expert_tensors(name, fused, scales):
    # scale tensors of quantized experts follow their weights, as with llama.cpp's --n-cpu-moe
    g = CATALOG[name]
    names = gguf_names(g, fused=fused, biases=name == "gpt-oss-20b", scales=scales)
    for K in sorted({0, 1, g.n_experts // 4, g.n_experts // 2 + 1, g.n_experts - 1}):
        text = render(make_policy(g, K, "layer_partition"), "llama.cpp").text
        n_cpu_moe, pattern = llama_flags(text)
        n_gpu = K * g.n_layers // g.n_experts
        n_cpu = g.n_layers - n_gpu
        cpu_blocks = set(range(g.dense_layers, g.dense_layers + n_cpu))
        want = {n for n in names if n.split(".")[0] == "blk" and int(n.split(".")[1]) in cpu_blocks
                and re.search(r"\.ffn_(gate|up|down|gate_up)_exps\.", n)}
        assert want == {n for n in names if expert_tensor(n) in cpu_blocks}
        # --n-cpu-moe counts blocks from 0 with the dense prefix
        assert n_cpu_moe == (g.dense_layers + n_cpu if n_cpu else 0)
        ncmoe = {n for n in names
                 if any(re.search(LLAMA_NCMOE.format(i=i), n) for i in range(n_cpu_moe))}
        assert ncmoe == want
        if n_cpu == 0:
            assert pattern is None
            continue
        assert "," not in pattern and "=" not in pattern
        rx = re.compile(pattern)
        assert {n for n in names if rx.search(n)} == want, (name, K)


def test_llamacpp_n_with_and_without_dense_prefix(capsys):
    # DeepSeek-V2-Lite: L=26, E=64, 1 dense block; K=16 -> N_gpu = floor(416/64) = 6, N_cpu = 20
    text = render(make_policy(CATALOG["deepseek-v2-lite"], 16, "layer_partition"), "llama.cpp").text
    assert llama_flags(text)[0] == 21
    assert "blocks 1-20" in text and "blocks 21-26" in text
    # Qwen3-30B-A3B: L=48, E=128, no dense block; K=29 -> N_gpu = floor(1392/128) = 10
    text = render(make_policy(CATALOG["qwen3-30b-a3b"], 29, "layer_partition"), "llama.cpp").text
    assert llama_flags(text)[0] == 38
    assert "-ngl 99" in text and "-fit off" in text and "-t 8" in text


def test_llamacpp_per_expert_candidate_names_nearest_and_gap():
    g = CATALOG["deepseek-v2-lite"]
    pol = make_policy(g, 16, "mutable_per_layer/parallel")
    r = render(pol, "llama.cpp")
    assert not r.exact and r.deployed == "layer_partition"
    assert "CANNOT express mutable_per_layer/parallel" in r.text
    # table: candidate index i -> (i + 1) ms; mutable_per_layer/parallel is index 5, lp index 0
    assert "chosen mutable_per_layer/parallel 6.000 ms/token · 166.7 tokens/s; layer_partition " \
           "1.000 ms/token · 1000.0 tokens/s; gap -5.000 ms (-83.3%)" in r.text
    assert llama_flags(r.text)[0] == 21
    with pytest.raises(CopeInputError, match="llama.cpp cannot express"):
        render(pol, "llama.cpp", strict=True)


@pytest.mark.parametrize("cand,K,exact", [
    ("fixed/parallel", 64, True), ("fixed/ready_first", 64, True), ("fixed/parallel", 0, True),
    ("fixed/wait_then_gpu", 0, False), ("mutable_per_layer/parallel", 64, False)])
def test_whole_layer_equivalents_are_exact(cand, K, exact):
    r = render(make_policy(CATALOG["deepseek-v2-lite"], K, cand), "llama.cpp")
    assert r.exact is exact
    assert llama_flags(r.text)[0] == (0 if K == 64 else 27)


# --- KTransformers ------------------------------------------------------------------------------
def first_match(rules, name):
    for rule in rules:
        if re.search(rule["match"]["name"], name):
            return rule
    return None


@pytest.mark.parametrize("name,K", [("deepseek-v2-lite", 16), ("deepseek-v2-lite", 0),
                                    ("deepseek-v2-lite", 64), ("qwen3-30b-a3b", 2),
                                    ("mixtral-8x7b", 3), ("qwen1.5-moe-a2.7b", 30)])
def test_ktransformers_rules_place_every_layer(name, K):
    # the shipped rule files' forms: KTransformersExperts (V2 for Qwen3-MoE, served by
    # balance_serve), KExpertsCPU on the CPU, KExpertsMarlin on cuda:0 for GPU experts
    g = CATALOG[name]
    text = render(make_policy(g, K, "layer_partition"), "ktransformers").text
    assert "legacy KTransformers (<= 0.4.1)" in text and "--format sglang-kt" in text
    rules = yaml.safe_load(text)
    n_gpu = K * g.n_layers // g.n_experts
    n_cpu = g.n_layers - n_gpu
    assert ("CUDA graphs off" in text) == (n_gpu > 0)
    module = "block_sparse_moe.experts" if name == "mixtral-8x7b" else "mlp.experts"
    cls = ("ktransformers.operators.experts.KTransformersExpertsV2" if name.startswith("qwen3")
           else "ktransformers.operators.experts.KTransformersExperts")
    for block in range(g.dense_layers + g.n_layers + 30):
        rule = first_match(rules, f"model.layers.{block}.{module}")
        if block < g.dense_layers or block >= g.dense_layers + g.n_layers:
            assert rule is None, block
            continue
        kw = rule["replace"]["kwargs"]
        on_cpu = block < g.dense_layers + n_cpu
        assert (kw["generate_device"], kw["generate_op"]) == \
            (("cpu", "KExpertsCPU") if on_cpu else ("cuda:0", "KExpertsMarlin")), block
        assert rule["replace"]["class"] == cls
        assert rule["recursive"] is False
        for other in (f"model.layers.{block}.mlp", f"model.layers.{block}.{module}.0",
                      f"model.layers.{block}.mlp.shared_experts",
                      f"x.model.layers.{block}.{module}"):
            assert first_match(rules, other) is None, other


@pytest.mark.parametrize("name,K,needle", [
    ("olmoe-1b-7b", 16, "no model class for OLMoE"),
    ("qwen3.5-35b-a3b", 16, "no model class for Qwen3.5"),
    ("gpt-oss-20b", 8, "no model class for gpt-oss"),
    ("qwen3-30b-a3b", 29, "GPU-resident expert layers cannot be expressed"),
])
def test_ktransformers_refuses_what_legacy_ktransformers_cannot_run(name, K, needle):
    with pytest.raises(CopeInputError, match=needle) as e:
        render(make_policy(CATALOG[name], K, "layer_partition"), "ktransformers")
    assert "--format sglang-kt" in str(e.value) and "\n" not in str(e.value)


def test_ktransformers_per_expert_candidate_explained():
    r = render(make_policy(CATALOG["deepseek-v2-lite"], 29, "fixed/cost_selected"), "ktransformers")
    assert not r.exact and "CANNOT express fixed/cost_selected" in r.text
    assert "gap -4.000 ms (-80.0%)" in r.text  # fixed/cost_selected: index 4 -> 5 ms; lp 1 ms
    assert yaml.safe_load(r.text)  # comments do not break the YAML


# --- SGLang-KT ----------------------------------------------------------------------------------
def load_pt(r, tmp_path):
    """The scores SGLang-KT reads: ``logical_count`` summed over its buffer dimension."""
    (name, data), = r.files
    path = tmp_path / "loc.pt"
    path.write_bytes(data)
    loaded = torch.load(path, weights_only=True)
    assert isinstance(loaded, dict) and set(loaded) == {"logical_count"}
    counts = loaded["logical_count"]
    assert counts.dim() == 3 and counts.shape[0] == 1
    return name, counts.sum(dim=0)


def kt_selection(t, moe_rows, n):
    """SGLang-KT's frequency placement: the n highest scores over all MoE layers."""
    flat = t[moe_rows].reshape(-1)
    idx = torch.topk(flat, k=n).indices
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[idx] = True
    return mask.reshape(len(moe_rows), -1)


@pytest.mark.parametrize("name,K", [("deepseek-v2-lite", 16), ("qwen3-30b-a3b", 29),
                                    ("deepseek-v2-lite", 0), ("olmoe-1b-7b", 64)])
def test_sglang_tensor_shape_rows_total(tmp_path, name, K):
    g = CATALOG[name]
    pol = make_policy(g, K, "fixed/parallel", seed=3)
    r = render(pol, "sglang-kt", pt_path="x/loc.pt")
    assert r.exact
    fname, t = load_pt(r, tmp_path)
    assert fname == "x/loc.pt" and "--init-expert-location x/loc.pt" in r.text
    assert f"--kt-num-gpu-experts {K} " in r.text
    assert "--kt-expert-placement-strategy frequency" in r.text
    assert t.dtype == torch.float32 and tuple(t.shape) == (g.dense_layers + g.n_layers, g.n_experts)
    assert set(torch.unique(t).tolist()) <= {0.0, 1.0}
    assert float(t[: g.dense_layers].sum()) == 0.0
    assert float(t.sum()) == K * g.n_layers
    for layer, row in enumerate(pol.resident_experts):
        assert torch.nonzero(t[g.dense_layers + layer]).ravel().tolist() == sorted(row)
    moe = list(range(g.dense_layers, g.dense_layers + g.n_layers))
    assert torch.equal(kt_selection(t, moe, K * g.n_layers), t[moe].bool())


def test_sglang_layer_partition_mask_and_ratio(tmp_path):
    g = CATALOG["deepseek-v2-lite"]
    r = render(make_policy(g, 16, "layer_partition"), "sglang-kt")
    _, t = load_pt(r, tmp_path)
    rows = t.sum(dim=1).tolist()
    assert rows == [0.0] + [0.0] * 20 + [64.0] * 6
    ratio = float(re.search(r"--kt-gpu-experts-ratio (\S+)", r.text).group(1))
    total = int(g.n_layers * g.n_experts * ratio)  # what the runtime computes
    assert total == 6 * 64
    assert torch.equal(kt_selection(t, list(range(1, 27)), total), t[1:].bool())


def test_sglang_mutable_and_other_executions(tmp_path):
    g = CATALOG["qwen3-30b-a3b"]
    pol = make_policy(g, 29, "mutable_cross_layer/wait_then_gpu")
    r = render(pol, "sglang-kt")
    assert not r.exact and r.deployed == "fixed/parallel"
    assert "CANNOT express mutable_cross_layer/wait_then_gpu" in r.text
    assert "one pool of K*L slots" in r.text
    _, t = load_pt(r, tmp_path)  # the same initial fill, as fixed residency
    assert float(t.sum()) == 29 * 48
    with pytest.raises(CopeInputError, match="SGLang-KT cannot express"):
        render(pol, "sglang-kt", strict=True)
    r = render(make_policy(g, 29, "fixed/ready_first"), "sglang-kt")
    assert not r.exact and "execution 'ready_first'" in r.text


# --- vLLM ---------------------------------------------------------------------------------------
def test_vllm_offload_from_geometry():
    g = CATALOG["deepseek-v2-lite"]  # 16.5 MiB experts, 64 per layer, 26 MoE layers
    off = vllm_offload(make_policy(g, 16))
    assert off.needed_bytes == 48 * 26 * g.expert_bytes == int(20592 * MIB)
    assert off.cpu_offload_gb == 20.11  # 20.109375 GiB rounded up
    # vLLM walks w13 (704 MiB) then w2 (352 MiB) per layer until int(20.11 GiB) is reached
    assert off.full_layers == 19 and off.partial_w13
    assert off.offloaded_bytes == int((19 * 1056 + 704) * MIB)
    r = render(make_policy(g, 16), "vllm")
    assert not r.exact and r.deployed is None
    assert "--offload-backend uva --cpu-offload-gb 20.11 --cpu-offload-params experts" in r.text
    assert "blocks 1-19 and the w13_weight of block 20" in r.text
    with pytest.raises(CopeInputError, match="vLLM cannot express"):
        render(make_policy(g, 16, "layer_partition"), "vllm", strict=True)
    assert render(make_policy(g, 64, "fixed/parallel"), "vllm", strict=True).exact


# --- the policy record --------------------------------------------------------------------------
def test_policy_contents_match_prediction(files):
    tr, cal = parquet_io.read_trace(files["trace"]), parquet_io.read_trace(files["cal"])
    prof = parquet_io.read_profile(files["profile"])
    pol = build_policy(tr, prof, cal, experts_per_layer=2, cpu_threads=4,
                       created="2025-01-01T00:00:00+00:00")
    assert [list(r) for r in pol.resident_experts] == popularity_fill(cal, 2)
    for est in ("cope", "atomic", "hrm"):
        df = predict(tr, prof, 2, calibration=cal, cpu_threads=4, estimator=est)
        assert pol.predictions_us[est] == dict(zip(df.candidate, df.tpot_us))
    df = predict(tr, prof, 2, calibration=cal, cpu_threads=4).sort_values("tpot_us", kind="stable")
    assert pol.candidate == df.candidate.iloc[0] and pol.chosen_by == "best" and pol.rank == 1
    d = pol.to_dict()
    assert d["runner_up"] == {"candidate": df.candidate.iloc[1], "tpot_us": df.tpot_us.iloc[1]}
    assert d["margin_pct"] == pytest.approx((df.tpot_us.iloc[1] - df.tpot_us.iloc[0])
                                            / df.tpot_us.iloc[0] * 100)
    assert d["operating_point"] == {"cpu_threads": 4, "gpu_share": 50.0}
    assert d["experts_per_layer"] == 2
    assert d["candidate"]["residency"] == pol.candidate.split("/")[0]
    inputs = d["provenance"]["inputs"]
    for role, key in (("trace", "trace"), ("calibration", "cal"), ("profile", "profile")):
        assert inputs[role] == {"path": str(files[key]),
                                "sha256": hashlib.sha256(files[key].read_bytes()).hexdigest()}
    assert d["provenance"]["created"] == "2025-01-01T00:00:00+00:00"
    # a chosen candidate that is not the winner: runner-up is the winner, margin negative
    slowest = df.candidate.iloc[-1]
    pol = build_policy(tr, prof, cal, experts_per_layer=2, cpu_threads=4, candidate=slowest)
    assert pol.chosen_by == "user" and pol.rank == 13
    assert pol.runner_up == (df.candidate.iloc[0], df.tpot_us.iloc[0])
    assert pol.margin_pct == pytest.approx((df.tpot_us.iloc[0] - df.tpot_us.iloc[-1])
                                           / df.tpot_us.iloc[-1] * 100) and pol.margin_pct < 0


def test_hrm_skipped_without_usable_spec():
    prof = tiny_profile()
    prof = dataclasses.replace(prof, platform={k: v for k, v in prof.platform.items()
                                               if k != "spec"})
    pol = build_policy(tiny_trace(), prof, tiny_trace(), experts_per_layer=1)
    assert pol.predictions_us["hrm"] is None and "no platform spec" in pol.estimator_notes["hrm"]
    assert pol.to_dict()["predicted_tpot_us"]["hrm"] is None
    assert read_policy_roundtrip(pol).predictions_us["hrm"] is None
    # the tiny profile's spec lacks most fields: HRM is skipped, the export still works
    pol = build_policy(tiny_trace(), tiny_profile(), tiny_trace(), experts_per_layer=1)
    assert pol.predictions_us["hrm"] is None and "unusable" in pol.estimator_notes["hrm"]
    # a spec given explicitly is used
    pol = build_policy(tiny_trace(), tiny_profile(), tiny_trace(), experts_per_layer=1,
                       spec=platform_spec("l40s"))
    df = predict(tiny_trace(), tiny_profile(), 1, calibration=tiny_trace(), estimator="hrm",
                 spec=platform_spec("l40s"))
    assert pol.predictions_us["hrm"] == dict(zip(df.candidate, df.tpot_us))
    assert pol.estimator_notes == {}


def read_policy_roundtrip(pol):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "p.json"
        write_policy(pol, p)
        return read_policy(p)


def test_json_round_trip(files):
    tr, cal = parquet_io.read_trace(files["trace"]), parquet_io.read_trace(files["cal"])
    prof = spec_profile()
    prof = dataclasses.replace(prof, model=dataclasses.replace(prof.model, dense_layers=2))
    tr2 = with_dense(tr, 2)
    need = tr2.model.vram_for_experts_per_layer(0) / 2**30    # K = 0, a budget nothing else fits
    pol = build_policy(tr2, prof, with_dense(cal, 2), vram_gib=need + 1e-9)
    again = read_policy_roundtrip(pol)
    assert policy_json(again) == policy_json(pol)
    assert again.to_dict() == pol.to_dict()
    for fmt in FORMATS:
        try:
            assert render(again, fmt).text == render(pol, fmt).text
        except UnsupportedByRuntime:      # exllamav3 has no architecture for the tiny model
            with pytest.raises(UnsupportedByRuntime):
                render(again, fmt)


def test_vram_budget_sets_k():
    g = tiny_geometry()
    need = g.vram_for_experts_per_layer(4) / GIB
    pol = build_policy(tiny_trace(), tiny_profile(), tiny_trace(), vram_gib=need)
    assert pol.experts_per_layer == 4 and pol.vram["budget_gib"] == need
    with pytest.raises(CopeInputError, match="exactly one"):
        build_policy(tiny_trace(), tiny_profile(), tiny_trace(), vram_gib=1.0, experts_per_layer=1)


# --- CLI ----------------------------------------------------------------------------------------
def test_cli_json_then_from_policy(capsys, files):
    out_json = files["dir"] / "p.json"
    code, out, err = run(capsys, *build_args(files, "-K", "2", "--format", "json", "-o", out_json))
    assert code == 0 and "wrote" in out
    saved = json.loads(out_json.read_text())
    assert saved["schema"] == "cope.policy/1"
    for fmt in ("llama.cpp", "ktransformers", "vllm"):
        code, direct, _ = run(capsys, *build_args(files, "-K", "2", "--format", fmt))
        assert code == 0
        code, again, _ = run(capsys, "export", "--from-policy", out_json, "--format", fmt)
        assert code == 0 and again == direct
    code, out, _ = run(capsys, "export", "--from-policy", out_json, "--format", "json")
    assert out == out_json.read_text()


def test_cli_sglang_writes_pt_next_to_output(capsys, files):
    out = files["dir"] / "deploy" / "kt.sh"
    code, stdout, err = run(capsys, *build_args(files, "-K", "2", "--candidate", "fixed/parallel",
                                                "--format", "sglang-kt", "-o", out))
    assert code == 0
    pt = out.with_suffix(".pt")
    assert pt.is_file() and out.read_text() == stdout
    assert f"--init-expert-location {pt}" in stdout
    t = torch.load(pt, weights_only=True)["logical_count"]
    assert tuple(t.shape) == (1, 3, 6) and float(t.sum()) == 6.0
    # refused without --force, and nothing is half-written
    before = pt.read_bytes()
    one_line_error(*run(capsys, *build_args(files, "-K", "1", "--format", "sglang-kt", "-o", out)),
                   "already exists")
    assert pt.read_bytes() == before
    code, *_ = run(capsys, *build_args(files, "-K", "1", "--format", "sglang-kt", "-o", out,
                                       "--force"))
    assert code == 0 and float(torch.load(pt, weights_only=True)["logical_count"].sum()) == 3.0


def test_cli_warns_when_not_exact(capsys, files):
    code, out, err = run(capsys, *build_args(files, "-K", "2", "--candidate", "fixed/parallel",
                                             "--format", "llama.cpp"))
    assert code == 0 and "CANNOT express" in out
    assert err.startswith("cope: warning: llama.cpp cannot express fixed/parallel")


@pytest.mark.parametrize("argv,needle", [
    (["-K", "2", "--candidate", "fixed/paralel", "--format", "json"], "unknown candidate"),
    (["-K", "7", "--format", "json"], "out of range"),
    (["-K", "-1", "--format", "json"], "out of range"),
    (["--vram-gib", "nan", "--format", "json"], "finite"),
    (["-K", "2", "--candidate", "fixed/parallel", "--format", "llama.cpp", "--strict"],
     "llama.cpp cannot express fixed/parallel"),
    (["-K", "2", "--candidate", "mutable_per_layer/parallel", "--format", "ktransformers",
      "--strict"], "cannot express"),
    (["-K", "2", "--candidate", "mutable_per_layer/parallel", "--format", "sglang-kt", "-o",
      "x.sh", "--strict"], "SGLang-KT cannot express"),
    (["-K", "2", "--candidate", "layer_partition", "--format", "vllm", "--strict"],
     "vLLM cannot express"),
    (["-K", "2", "--format", "sglang-kt"], "give -o OUT"),
    (["-K", "2", "--format", "onnx"], "invalid choice"),
    (["-K", "2", "--vram-gib", "3", "--format", "json"], "not allowed"),
])
def test_cli_bad_input_one_line_exit_2(capsys, files, argv, needle, monkeypatch):
    monkeypatch.chdir(files["dir"])
    one_line_error(*run(capsys, *build_args(files, *argv)), needle)


def test_cli_missing_inputs_and_mixed_modes(capsys, files):
    one_line_error(*run(capsys, "export", "--format", "json"), "missing --trace, --profile")
    one_line_error(*run(capsys, "export", "--trace", files["trace"], "--profile", files["profile"],
                        "--format", "json"), "--vram-gib")
    one_line_error(*run(capsys, "export", "--from-policy", "p.json", "--trace", files["trace"],
                        "--format", "json"), "drop --trace")
    one_line_error(*run(capsys, "export", "--from-policy", files["dir"] / "nope.json",
                        "--format", "json"), "file not found")


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(schema="cope.policy/2"), "schema"),
    (lambda d: d.update(margin_pct=d["margin_pct"] + 1), "margin_pct"),
    (lambda d: d["resident_experts"][0].append(5), "resident_experts"),
    (lambda d: d["predictions_us"]["cope"].pop("fixed/parallel"), "predictions_us.cope"),
    (lambda d: d["candidate"].update(id="fixed/fast"), "unknown candidate"),
    (lambda d: d.update(experts_per_layer=9), "out of range"),
    (lambda d: d["model"].pop("top_k"), "model"),
    (lambda d: d["vram"].pop("needed_gib"), "vram.needed_gib"),
])
def test_cli_bad_policy_file(capsys, files, edit, needle):
    p = files["dir"] / "p.json"
    run(capsys, *build_args(files, "-K", "2", "--format", "json", "-o", p))
    data = json.loads(p.read_text())
    edit(data)
    p.write_text(json.dumps(data))
    one_line_error(*run(capsys, "export", "--from-policy", p, "--format", "llama.cpp"), needle)
    p.write_text("{not json")
    one_line_error(*run(capsys, "export", "--from-policy", p, "--format", "json"), "not a readable")


def test_shipped_example_deepseek(capsys):
    """The README's worked example: DeepSeek-V2-Lite at K = 16 (1 dense block)."""
    d = EXAMPLES
    code, out, err = run(capsys, "export", "--trace", d / "deepseek-v2-lite-trace.parquet",
                         "--calibration", d / "deepseek-v2-lite-calibration.parquet",
                         "--profile", d / "deepseek-v2-lite-a100-analytic.parquet", "-K", "16",
                         "--candidate", "layer_partition", "--format", "llama.cpp")
    assert code == 0 and err == ""
    n, pattern = llama_flags(out)
    assert n == 21 and re.search(pattern, "blk.20.ffn_down_exps.weight")
    assert not re.search(pattern, "blk.21.ffn_down_exps.weight")
    assert not re.search(pattern, "blk.0.ffn_down.weight")
    assert layer_plan(CATALOG["deepseek-v2-lite"], 16).n_cpu == 20


def test_policy_carries_the_interval_and_confidence(tmp_path):
    from tiny import tiny_profile, tiny_trace

    from cope_core.export import build_policy, read_policy, render, write_policy
    tr = tiny_trace()
    policy = build_policy(tr, tiny_profile(), tr, experts_per_layer=2)
    df = predict(tr, tiny_profile(), 2, calibration=tr)
    row = df[df["candidate"] == policy.candidate].iloc[0]
    assert policy.interval_us() == pytest.approx((row.tpot_lo_us, row.tpot_hi_us))
    assert policy.win_probability() == pytest.approx(row.win_probability)
    write_policy(policy, tmp_path / "p.json")
    back = read_policy(tmp_path / "p.json")
    assert back.interval_us() == policy.interval_us()
    assert back.confidence["draws"] == 1000 and back.confidence["sources"] == ["prompts",
                                                                                "profile"]
    for fmt in ("llama.cpp", "ktransformers", "vllm"):
        text = render(back, fmt).text
        lo, hi = policy.interval_us()
        assert f"# 95 % interval [{lo / 1e3:.3f} ms, {hi / 1e3:.3f} ms]/token" in text
    # a record written before the confidence existed still reads, with nothing to say
    import json
    data = json.loads((tmp_path / "p.json").read_text())
    del data["confidence"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert read_policy(old).interval_us() is None
    assert "95 % interval" not in render(read_policy(old), "llama.cpp").text
    data["confidence"] = {"tpot_ci_us": {policy.candidate: [5.0, 1.0]}}
    old.write_text(json.dumps(data))
    with pytest.raises(CopeInputError, match="confidence.tpot_ci_us"):
        read_policy(old)


@pytest.mark.parametrize("fmt", ["llama.cpp", "ik_llama.cpp", "fastllm", "exllamav3"])
def test_an_explicit_candidate_is_the_first_command_in_every_format(fmt):
    """``--candidate`` leads every format (issue 37: the llama.cpp export led with the cache's
    best, so a script taking the first llama-server line ran what the user did not choose);
    COPE's own pick still leads with llama.cpp's best, the chosen candidate's line follows."""
    from cope_core.llamacpp import CacheRecord
    g = get_model("qwen3-30b-a3b")
    best = {"candidate": "llamacpp_cache/classlru", "build": "b12191", "cpu_layers": 30,
            "n_cpu_moe": 30, "cache_mib": 999, "cpu_share": 0.5, "slots": 10, "tpot_us": 900.0,
            "hits": 1.0, "uploads": 1.0, "cpu_misses": 1.0}
    rec = CacheRecord.from_dict({
        "expert_budget_gib": 1.0, "configurations": 7, "cache_start": "server", "best": [best],
        "versus": [{"name": "llamacpp_cache/classlru", "tpot_us": 900.0, "tpot_ci_us": None,
                    "cache_faster": None}]})
    for chosen_by in ("user", "best"):
        pol = dataclasses.replace(make_policy(g, 32, "layer_partition"), chosen_by=chosen_by,
                                  llamacpp_cache=rec)
        text = render(pol, fmt).text
        first = next(line for line in text.splitlines() if line and not line.startswith("#"))
        plan = pol.layer_plan
        if fmt == "llama.cpp" and chosen_by == "best":
            assert "--moe-cache-mib 999" in first
            continue
        assert "--moe-cache-mib" not in first
        want = {"llama.cpp": f"--n-cpu-moe {plan.n_cpu_moe}", "exllamav3": f"-mcl {plan.n_cpu}",
                "ik_llama.cpp": "-ot", "fastllm": "--moe_device_layers"}[fmt]
        assert want in first
        if fmt == "llama.cpp":      # the best alternative follows, commented
            assert "# llama-server -m MODEL.gguf -ngl 99 -fit off -t 8 --n-cpu-moe 30 " \
                   "--moe-cache-mib 999 --moe-cache-cpu-share 0.5" in text
