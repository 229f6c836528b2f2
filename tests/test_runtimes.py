"""COPE's exports fed to the runtimes' own code (scripts/runtimes.sh sets them up, cached).

* llama.cpp b11434 for real: tiny random-weight Hugging Face MoE models (Mixtral, Qwen3-MoE,
  DeepSeek-V2) are converted to GGUF with llama.cpp's own ``convert_hf_to_gguf.py``, and the
  exported command lines run verbatim with ``llama-completion`` in place of ``llama-server`` and
  the model path substituted, plus ``-n 4 -p ... -no-cnv -v`` to generate four tokens with the
  debug log. The log must name exactly the intended expert tensors as overridden to CPU. The
  tiny models carry a SentencePiece tokenizer: llama.cpp's GPT-2 vocabulary routine identifies a
  BPE tokenizer by a hash of known models' tokenizations, which a tiny tokenizer cannot have, so
  the conversion routes that routine to llama.cpp's own SentencePiece one.
* vLLM 0.33.0 for real: the exported flags go through vLLM's ``EngineArgs`` parser (no engine).
* Legacy KTransformers (<= 0.4.1) does not install on this CPU machine (CUDA extensions): its
  checks are replayed here from the source, cited in docs/export.md — the rule matcher of
  kvcache-ai/ktransformers@95009ea6 ``archive/ktransformers/optimize/optimize.py``
  (``gen_optimize_config``: ``re.search``, first matching rule wins, ``recursive: False`` stops
  the descent) over the module names of real transformers models. SGLang-KT's own code (the
  sglang-kt 0.7.2 wheel's parser and expert placement) runs in tests/test_sglang_kt.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from llama_tools import CACHE, LLAMA, convert, missing_runtime, sentencepiece_tokenizer

from cope_core.export import Policy, render
from cope_core.llamacpp import CacheRecord
from cope_core.matrix import CANDIDATE_IDS

VLLM_PY = CACHE / "venv-vllm-0.33.0" / "bin" / "python"

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _policy(g, K: int, candidate: str = "layer_partition") -> Policy:
    """A policy record at ``K`` with distinct predictions (no replay needed for placement)."""
    rng = np.random.default_rng(0)
    resident = tuple(tuple(int(e) for e in rng.permutation(g.n_experts)[:K])
                     for _ in range(g.n_layers))
    table = {c: 1000.0 * (i + 1) for i, c in enumerate(CANDIDATE_IDS)}
    return Policy(model=g, candidate=candidate, experts_per_layer=K, resident_experts=resident,
                  predictions_us={"cope": table, "atomic": dict(table), "hrm": None},
                  platform={"gpu": "test"}, cpu_threads=2, gpu_share=100.0,
                  vram={"budget_gib": None, "needed_gib": 1.0, "context": 4096,
                        "workspace_gib": 0.5})


def _tiny(family: str, folder: Path, **overrides):
    """A tiny model of ``family`` saved in ``folder`` (named for its family) and its geometry."""
    from cope_core.trace.sources.collect import load_model
    from cope_core.trace.sources.tiny_models import build_tiny_model
    build_tiny_model(family, folder, layers=4, seed=0, **overrides)
    return load_model(folder).geometry


# --- llama.cpp ----------------------------------------------------------------------------------
LLAMA_FAMILIES = {"mixtral": {}, "qwen3_moe": {},
                  # llama.cpp reads DeepSeek-V2 without a Q LoRA only at the 27 blocks of -Lite
                  "deepseek_v2": {"q_lora_rank": 16}}


def _gguf_tensors(path: Path) -> list[str]:
    code = ("import sys, json; from gguf import GGUFReader; "
            "print(json.dumps([t.name for t in GGUFReader(sys.argv[1]).tensors]))")
    env = dict(os.environ, PYTHONPATH=str(LLAMA / "src" / "gguf-py"))
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       env=env, timeout=120, check=True)
    return json.loads(r.stdout)


@pytest.fixture(scope="module", params=sorted(LLAMA_FAMILIES))
def gguf_model(request, tmp_path_factory):
    if not (LLAMA / "bin" / "llama-completion").is_file():
        missing_runtime("llama.cpp b11434 is not built")
    family = request.param
    folder = tmp_path_factory.mktemp("llama") / f"tiny-{family}"
    g = _tiny(family, folder, vocab_size=320, **LLAMA_FAMILIES[family])
    sentencepiece_tokenizer(folder)
    gguf = folder.parent / f"{family}.gguf"
    convert(folder, gguf)
    return family, g, gguf, _gguf_tensors(gguf)


def _run_exported(text: str, gguf: Path) -> list[tuple[int, set[str]]]:
    """Run every ``llama-server`` line of an export; (exit status, tensors overridden to CPU)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("llama-server "):
            continue
        argv = shlex.split(line)
        # the MoE-cache flags are in b11480+/b12191, not in b11434: they go through a replay of
        # their argument rules (test_moe_cache.py); b11434 parses and places the rest for real
        for flag in CACHE_FLAGS:
            if flag in argv:
                i = argv.index(flag)
                del argv[i:i + 2]
        argv[0] = str(LLAMA / "bin" / "llama-completion")
        argv[argv.index("MODEL.gguf")] = str(gguf)
        argv += ["-n", "4", "-p", "the cat sat", "-no-cnv", "-v"]
        r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=300,
                           env=dict(os.environ, LD_LIBRARY_PATH=str(LLAMA / "bin")))
        moved = set(re.findall(r"tensor (\S+) \(.*\) buffer type overridden to CPU",
                               r.stdout + r.stderr))
        out.append((r.returncode, moved))
    return out


CACHE_FLAGS = ("--moe-cache-mib", "--moe-cache-cpu-share")


def test_llamacpp_cache_line_places_the_host_layers_of_its_n_cpu_moe(gguf_model):
    family, g, gguf, tensors = gguf_model
    best = {"candidate": "llamacpp_cache/classlru", "build": "b12191", "cpu_layers": 2,
            "n_cpu_moe": g.dense_layers + 2, "cache_mib": 64, "cpu_share": 0.5, "slots": 10,
            "tpot_us": 900.0, "hits": 1.0, "uploads": 1.0, "cpu_misses": 1.0}
    rec = {"expert_budget_gib": 1.0, "configurations": 7, "cache_start": "server",
           "best": [best], "versus": [{"name": "llamacpp_cache/classlru", "tpot_us": 900.0,
                                       "tpot_ci_us": None, "cache_faster": None}]}
    text = render(dataclasses.replace(_policy(g, 2), llamacpp_cache=CacheRecord.from_dict(rec)),
                  "llama.cpp").text
    # the policy's own candidate leads (ea3955c); the cache's configuration is a line of its own
    # (as a comment, the best alternative), so it is read with the comment sign taken off
    lines = [line.lstrip("# ") for line in text.splitlines()]
    lead = [line for line in lines
            if line.startswith("llama-server ") and "--moe-cache-mib" in line][0]
    assert "--moe-cache-mib 64 --moe-cache-cpu-share 0.5" in lead
    cpu_blocks = {g.dense_layers, g.dense_layers + 1}
    want = {t for t in tensors if re.match(r"blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.", t)
            and int(t.split(".")[1]) in cpu_blocks}
    code, moved = _run_exported(lead, gguf)[0]
    assert code == 0 and moved == want, (family, sorted(moved ^ want))


def test_llamacpp_runs_the_exported_lines_and_moves_exactly_the_cpu_experts(gguf_model):
    family, g, gguf, tensors = gguf_model
    for K in (0, 2, 4, g.n_experts):
        text = render(_policy(g, K), "llama.cpp").text
        n_gpu = K * g.n_layers // g.n_experts
        cpu_blocks = set(range(g.dense_layers, g.dense_layers + g.n_layers - n_gpu))
        want = {t for t in tensors if re.match(r"blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.", t)
                and int(t.split(".")[1]) in cpu_blocks}
        assert (len(want) > 0) == (len(cpu_blocks) > 0), (family, K)
        # the file runs one server (the --n-cpu-moe line); its -ot twin is a comment, run too
        assert len(_run_exported(text, gguf)) == 1
        twin = text.replace("# llama-server ", "llama-server ")
        runs = _run_exported(twin, gguf)
        assert len(runs) == 2         # the --n-cpu-moe line and the -ot line
        for code, moved in runs:
            assert code == 0, (family, K)
            assert moved == want, (family, K, sorted(moved ^ want))


# --- vLLM ---------------------------------------------------------------------------------------
VLLM_PROBE = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
ea = EngineArgs.from_cli_args(parser.parse_args(sys.argv[1:]))
print(json.dumps({"offload_backend": ea.offload_backend, "cpu_offload_gb": ea.cpu_offload_gb,
                  "cpu_offload_params": sorted(ea.cpu_offload_params)}))
"""


def test_vllm_parses_the_exported_flags(tmp_path):
    if not VLLM_PY.is_file():
        missing_runtime("vLLM 0.33.0 is not set up")
    from cope_core.export.vllm import vllm_offload
    from cope_core.geometry import CATALOG
    for name, K in (("qwen3-30b-a3b", 29), ("deepseek-v2-lite", 19)):
        pol = _policy(CATALOG[name], K)
        line = next(x for x in render(pol, "vllm").text.splitlines() if x.startswith("vllm "))
        argv = shlex.split(line)
        assert argv[:3] == ["vllm", "serve", "MODEL"]
        # the model path substituted by a local folder: vLLM resolves a name on the Hub
        r = subprocess.run([str(VLLM_PY), "-c", VLLM_PROBE, "--model", str(tmp_path), *argv[3:]],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))
        assert r.returncode == 0, r.stderr[-2000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got == {"offload_backend": "uva",
                       "cpu_offload_gb": pytest.approx(vllm_offload(pol).cpu_offload_gb),
                       "cpu_offload_params": ["experts"]}


# --- legacy KTransformers: the rule matcher over real module names -----------------------------
SHIPPED_EXPERTS_RULE = {  # the experts rule of the shipped file the export goes in front of
    "deepseek_v2": r"^model\.layers\..*\.mlp\.experts$",
    "qwen3_moe": r"^model\.layers\..*\.mlp\.experts$",
}
# Mixtral is left out here: legacy KTransformers builds it from its own transformers-4 copy
# (archive/ktransformers/models/modeling_mixtral.py, "block_sparse_moe"), not transformers 5's
# class ("mlp"); tests/test_export.py checks the rules against those names.


def _matched(module, rules, prefix=""):
    """(module name, rule index) for every module a rule replaces, the way gen_optimize_config
    walks them: the first rule whose name regex re.search-matches wins; recursive: False stops."""
    name = prefix[:-1]
    for i, rule in enumerate(rules):
        if re.search(rule["match"]["name"], name) is not None:
            yield name, i
            if rule.get("recursive", True) is False:
                return
            break
    for child_name, child in module._modules.items():
        if child is not None:
            yield from _matched(child, rules, prefix + child_name + ".")


@pytest.mark.parametrize("family,K", [("deepseek_v2", 4), ("deepseek_v2", 0), ("qwen3_moe", 1)])
def test_ktransformers_rules_match_exactly_the_intended_experts(tmp_path, family, K):
    import transformers as tf
    import yaml

    from cope_core.trace.sources.tiny_models import tiny_config
    g = _tiny(family, tmp_path / f"tiny-{family}")
    text = render(_policy(g, K), "ktransformers").text
    ours = yaml.safe_load(text)
    rules = ours + [{"match": {"name": SHIPPED_EXPERTS_RULE[family]},
                     "replace": {"class": "shipped"}, "recursive": False}]
    model = tf.AutoModelForCausalLM.from_config(tiny_config(family, 4))
    experts = {n for n, _ in model.named_modules() if n.endswith(".experts")}
    assert len(experts) == g.n_layers
    n_gpu = K * g.n_layers // g.n_experts
    cpu_blocks = set(range(g.dense_layers, g.dense_layers + g.n_layers - n_gpu))
    matched = dict(_matched(model, rules))
    assert set(matched) == experts             # every experts module, nothing else
    for name, i in matched.items():
        block = int(name.split(".")[2])
        assert i < len(ours), name              # ours come first and win
        kw = ours[i]["replace"]["kwargs"]
        assert kw["generate_device"] == ("cpu" if block in cpu_blocks else "cuda:0"), name


# --- vLLM's own output classes write the routing dumps the importer reads -----------------------
def test_vllm_writes_the_import_fixtures(tmp_path):
    """scripts/make_import_fixtures.py run with vLLM's Python gives exactly the committed
    tests/data/import files (RequestOutput/CompletionOutput, CompletionResponse, numpy2base64)."""
    if not VLLM_PY.is_file():
        missing_runtime("vLLM 0.33.0 is not set up")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([str(VLLM_PY), str(root / "scripts" / "make_import_fixtures.py"), "vllm",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))
    assert r.returncode == 0, r.stderr[-2000:]
    data = root / "tests" / "data" / "import"
    for name in ("vllm-offline.jsonl", "vllm-openai.jsonl"):
        got = [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
        assert got == [json.loads(x) for x in (data / name).read_text().splitlines()], name
    a, b = np.load(tmp_path / "vllm-request.npz"), np.load(data / "vllm-request.npz")
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])
