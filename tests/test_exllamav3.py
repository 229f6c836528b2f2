"""The exllamav3 format against exllamav3 1.6.5's own code (the PyPI wheel, unpacked by
scripts/runtimes.sh; the package itself JIT-compiles a CUDA extension at import, so it is never
imported): its ``add_args`` is executed from ``exllamav3/model_init.py`` to parse the exported
line, and the placement lines of ``exllamav3/modules/block_sparse_mlp_cpu.py`` (checked to be
there verbatim) are applied to the written statistics file."""
from __future__ import annotations

import ast
import json
import shlex
from argparse import ArgumentParser
from types import SimpleNamespace

import pytest
from llama_tools import CACHE, missing_runtime
from tiny import make_policy

from cope_core.cli.main import main
from cope_core.errors import UnsupportedByRuntime
from cope_core.export import render
from cope_core.export.exllamav3 import MODULE_KEYS
from cope_core.geometry import get_model

EXL3 = CACHE / "exllamav3-1.6.5" / "exllamav3"
PLACEMENT = ("counts = json.load(open(stats_path)).get(self.key)",
             "perm = sorted(range(self.num_experts), key = lambda e: -counts[e])",
             "first = self.num_experts - split_k")


@pytest.fixture(scope="module")
def exl3():
    if not (EXL3 / "model_init.py").is_file():
        missing_runtime("exllamav3 1.6.5 is not unpacked")
    src = (EXL3 / "model_init.py").read_text()
    fn = next(n for n in ast.parse(src).body
              if isinstance(n, ast.FunctionDef) and n.name == "add_args")
    ns = {"ArgumentParser": ArgumentParser, "SimpleNamespace": SimpleNamespace}
    exec(compile(ast.Module([fn], []), str(EXL3 / "model_init.py"), "exec"), ns)
    placement = (EXL3 / "modules" / "block_sparse_mlp_cpu.py").read_text()
    assert all(line in placement for line in PLACEMENT)   # the replay below is their code
    return ns["add_args"]


def parse(add_args, line: str):
    """The exported command's environment and exllamav3's parse of its arguments."""
    words = shlex.split(line)
    env = {}
    while "=" in words[0]:
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    assert words[:2] == ["python", "examples/chat.py"]
    p = ArgumentParser()
    add_args(p)
    return env, p.parse_args(words[2:])


def gpu_experts(counts: list[int], E: int, split_k: int) -> set[int]:
    """exllamav3's placement: the list permuted hot-to-cold, the GPU keeps [0, E - split_k)."""
    perm = sorted(range(E), key=lambda e: -counts[e])
    first = E - split_k
    return set(perm[:first])


def _line(text: str) -> str:
    return next(x for x in text.splitlines() if "examples/chat.py" in x)


@pytest.mark.parametrize("name,K", [("qwen3-30b-a3b", 29), ("mixtral-8x7b", 3),
                                    ("deepseek-v3", 100), ("qwen3.5-35b-a3b", 255)])
def test_fixed_parallel_runs_exactly_with_the_resident_experts(exl3, name, K, tmp_path):
    g = get_model(name)
    policy = make_policy(g, K, "fixed/parallel")
    r = render(policy, "exllamav3", stats_path=str(tmp_path / "s.json"))
    assert r.exact
    env, args = parse(exl3, _line(r.text))
    assert env == {"EXL3_MOE_CPU_SWAP": "0", "EXL3_MOE_CPU_SPLIT_STATS": str(tmp_path / "s.json")}
    assert args.moe_cpu_split == g.n_experts - K and args.moe_cpu_offload == 0
    assert args.moe_cpu_threads == policy.cpu_threads
    (path, data), = r.files
    stats = json.loads(data)
    key = dict(MODULE_KEYS)[next(p for p, _ in MODULE_KEYS if name.startswith(p))]
    assert list(stats) == [key.format(block=g.dense_layers + i) for i in range(g.n_layers)]
    for layer, row in enumerate(policy.resident_experts):
        counts = stats[key.format(block=g.dense_layers + layer)]
        assert gpu_experts(counts, g.n_experts, args.moe_cpu_split) == set(row)


def test_module_keys_are_the_architectures_own(exl3):
    arch = EXL3 / "architecture"
    assert 'key = f"model.layers.{idx}.block_sparse_moe"' in (arch / "mixtral.py").read_text()
    for f in ("qwen3_moe.py", "deepseek_v3.py", "glm4_moe.py", "gpt_oss.py"):
        text = (arch / f).read_text()
        assert 'key_prefix: str = "model"' in text and '.layers.{idx}.mlp"' in text, f
    assert 'key_prefix = "model.language_model"' in (arch / "qwen3_5.py").read_text()


def test_layer_partition_and_k_zero_move_whole_layers(exl3):
    g = get_model("qwen3-30b-a3b")
    lp = make_policy(g, 40, "layer_partition")
    _, args = parse(exl3, _line(render(lp, "exllamav3").text))
    assert args.moe_cpu_offload == lp.layer_plan.n_cpu and args.moe_cpu_split == 0
    r = render(make_policy(g, 0, "fixed/parallel"), "exllamav3")
    _, args = parse(exl3, _line(r.text))
    assert r.exact and args.moe_cpu_offload == g.n_layers     # -mcs would cap E at E - 1


def test_other_candidates_run_the_same_fill_as_fixed_parallel(exl3):
    g = get_model("mixtral-8x7b")
    r = render(make_policy(g, 4, "mutable_per_layer/cost_selected"), "exllamav3")
    assert not r.exact and r.deployed == "fixed/parallel"
    assert "exllamav3 CANNOT express mutable_per_layer/cost_selected" in r.text
    _, args = parse(exl3, _line(r.text))
    assert args.moe_cpu_split == 4


def test_models_exllamav3_cannot_load_are_refused():
    with pytest.raises(UnsupportedByRuntime, match="no architecture"):
        render(make_policy(get_model("olmoe-1b-7b"), 8), "exllamav3")


def test_memory_in_exllamav3_terms():
    g = get_model("qwen3-30b-a3b")
    text = render(make_policy(g, 29), "exllamav3", exl3_bits=4.0).text
    per = 3 * 2048 * 768 * 4 / 8                       # bytes of one expert at 4 bits
    assert f"{per / 2**20:.2f} MiB per expert" in text
    k = min(int(29 * g.per_k_bytes // (g.n_layers * per)), g.n_experts)
    assert f"holds K = {k} EXL3 experts per layer: -mcs {g.n_experts - k}" in text
    assert "give --exl3-bits" in render(make_policy(g, 29), "exllamav3").text


def test_cli_writes_the_stats_file_next_to_the_output(tmp_path, capsys):
    out = tmp_path / "run.sh"
    code = main(["export", "--trace", "data/examples/qwen3-30b-a3b-trace.parquet",
                 "--calibration", "data/examples/qwen3-30b-a3b-calibration.parquet",
                 "--profile", "data/examples/qwen3-30b-a3b-rtx4090-analytic.parquet",
                 "--vram-gib", "16", "--format", "exllamav3", "-o", str(out), "--exl3-bits", "4"])
    cap = capsys.readouterr()
    assert code == 0 and out.is_file() and (tmp_path / "run.json").is_file()
    assert f"EXL3_MOE_CPU_SPLIT_STATS={tmp_path / 'run.json'}" in cap.out
    assert main(["export", "--from-policy", "x.json", "--format", "exllamav3"]) == 2
    assert "give -o OUT" in capsys.readouterr().err


# --- SGLang-KT's --kt-method (a replay: sglang-kt does not install on this CPU machine) ----------
#: kt-kernel's inference methods, kvcache-ai/ktransformers 95009ea kt-kernel/python/experts.py
KT_INFERENCE_METHODS = {"AMXINT4", "AMXINT8", "RAWINT4", "FP8", "BF16", "FP8_PERCHANNEL",
                        "GPTQ_INT4", "SYCL_GPTQ_INT4", "MXFP4", "MXFP8", "LLAMAFILE", "MOE_INT4",
                        "MOE_INT8"}


def test_sglang_kt_selects_the_kernel_the_profile_priced(tmp_path):
    from cope_core import parquet_io
    bf16 = render(make_policy(get_model("qwen3-30b-a3b"), 29), "sglang-kt",
                  pt_path=str(tmp_path / "a.pt"))
    gguf_g = parquet_io.read_trace("data/examples/gguf-qwen3-30b-a3b-q4_k_m-trace.parquet").model
    gguf = render(make_policy(gguf_g, 100), "sglang-kt", pt_path=str(tmp_path / "b.pt"))
    for r, want in ((bf16, "BF16"), (gguf, "LLAMAFILE")):
        line = next(x for x in r.text.splitlines() if x.startswith("python -m sglang"))
        words = shlex.split(line)
        method = words[words.index("--kt-method") + 1]
        assert method == want and method in KT_INFERENCE_METHODS
        assert "AMXINT4 would run a 4-bit AMX kernel the profile did not price" in r.text
    g = get_model("qwen3-30b-a3b")
    want_gib = g.n_layers * g.n_experts * g.expert_bytes / 2**30
    assert f"host RAM for routed experts: {want_gib:.2f} GiB" in bf16.text
    assert "kvcache-ai/ktransformers#2084" in bf16.text
