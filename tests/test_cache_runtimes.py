"""The FreeToken and fastllm formats through the runtimes' own argument parsers (FreeToken 0.2.1's
``freetoken.server.args.parse_args``, fastllm's ``ftllm.cli.args_parser`` of ftllm 1.9.0), set up
by scripts/runtimes.sh in folders of their own and run in a subprocess with them on PYTHONPATH."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from llama_tools import CACHE, missing_runtime
from tiny import make_policy

from cope_core.export import render
from cope_core.geometry import get_model
from cope_core.placement import CpuSide, layer_plan

pytestmark = pytest.mark.slow       # a subprocess per parse, the runtimes' imports included

FREETOKEN, FTLLM = CACHE / "freetoken-0.2.1", CACHE / "ftllm-1.9.0"
PROBE = {
    "freetoken": """
import json, sys
from freetoken.server.args import parse_args
c = parse_args(sys.argv[1:])[0]
print(json.dumps({k: getattr(c, k) for k in ("moe_strategy", "moe_cache_size", "moe_cache_scope",
                                             "moe_cache_policy", "moe_cpu_threads")}))
""",
    "fastllm": """
import json, sys
from ftllm.cli import args_parser
a = args_parser().parse_args(sys.argv[1:])
print(json.dumps({k: getattr(a, k) for k in ("command", "model", "device", "threads",
                                             "moe_device", "moe_device_layers",
                                             "moe_cuda_cache")}))
""",
}


def parsed(fmt: str, line: str, model_dir) -> dict:
    folder = FREETOKEN if fmt == "freetoken" else FTLLM
    if not folder.is_dir():
        missing_runtime(f"the {fmt} parser is not set up")
    argv = shlex.split(line)[2:] if fmt == "freetoken" else shlex.split(line)[1:]
    argv = [str(model_dir) if a == "MODEL" else a for a in argv]
    r = subprocess.run([sys.executable, "-c", PROBE[fmt], *argv], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(folder)))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 128,
        "num_experts_per_tok": 8, "hidden_size": 2048, "moe_intermediate_size": 768,
        "num_hidden_layers": 48}))
    return d


def _line(text: str, start: str) -> str:
    return next(x for x in text.splitlines() if x.startswith(start))


G = get_model("qwen3-30b-a3b")


@pytest.mark.parametrize("candidate,K,strategy,exact", [
    ("fixed/parallel", 128, "fused", True), ("fixed/wait_then_gpu", 128, "fused", True),
    ("fixed/parallel", 0, "cpu", True), ("fixed/parallel", 29, "hybrid", False),
    ("mutable_cross_layer/cost_selected", 29, "hybrid", False),
    ("mutable_per_layer/wait_then_gpu", 29, "offload", False),
    ("layer_partition", 64, "hybrid", False)])
def test_freetoken_parses_what_is_exported(model_dir, candidate, K, strategy, exact):
    r = render(make_policy(G, K, candidate), "freetoken")
    got = parsed("freetoken", _line(r.text, "ft serve"), model_dir)
    assert got["moe_strategy"] == strategy and got["moe_cpu_threads"] == 8
    assert r.exact is exact and r.deployed is None
    if strategy in ("hybrid", "offload"):
        slots = K * G.n_layers if candidate != "layer_partition" else 64 * G.n_layers // 128 * 128
        assert got["moe_cache_size"] == slots
        assert got["moe_cache_scope"] == "unified" and got["moe_cache_policy"] == "lru"
        assert "outside the Policy Matrix" in r.summary


@pytest.mark.parametrize("candidate,K", [("fixed/parallel", 128), ("fixed/parallel", 0),
                                         ("layer_partition", 64), ("layer_partition", 0),
                                         ("fixed/parallel", 29),
                                         ("mutable_cross_layer/parallel", 29)])
def test_fastllm_parses_what_is_exported(model_dir, candidate, K):
    policy = make_policy(G, K, candidate)
    r = render(policy, "fastllm")
    got = parsed("fastllm", _line(r.text, "ftllm server"), model_dir)
    assert got["command"] == "server" and got["model"] == str(model_dir)
    assert got["device"] == "cuda" and got["threads"] == 8
    if candidate == "layer_partition":
        n = layer_plan(G, K, CpuSide.LAST).n_cpu
        assert r.exact and (got["moe_device"], got["moe_device_layers"]) == (
            ("cpu", n) if n else ("", -1))
    elif K == 128:
        assert r.exact and got["moe_device"] == "" and got["moe_cuda_cache"] == 0
    elif K == 0:
        assert r.exact and got["moe_device"] == "cpu" and got["moe_device_layers"] == -1
    else:
        assert not r.exact and got["moe_device"] == "cpu"
        assert got["moe_cuda_cache"] == int(K * G.per_k_bytes // 2**20) * 2**20
