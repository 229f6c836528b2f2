"""The sglang-kt format against the sglang-kt 0.7.2 wheel's own code and the kt-kernel 0.7.2 it
pins (PyPI wheels, files unpacked by scripts/runtimes.sh; the packages are never imported, their
import chain needs CUDA): the exported line goes through the ``--kt-*``, ``--model-path`` and
``--init-expert-location`` arguments of ``ServerArgs.add_cli_args`` (``server_args.py``), and the
parsed arguments through ``compute_initial_expert_location_metadata``
(``eplb/expert_location.py``), ``_init_kt_gpu_experts_masks`` (``layers/moe/kt_ep_wrapper.py``)
and kt-kernel's ``generate_gpu_experts_masks`` (``kt_kernel/experts_base.py``), each executed from
the source with a real transformers config; the ``--kt-method`` must be in kt-kernel's
``INFERENCE_METHODS`` (``kt_kernel/experts.py``)."""
from __future__ import annotations

import ast
import logging
import shlex
from argparse import ArgumentParser
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest
from llama_tools import CACHE, missing_runtime
from tiny import make_policy

from cope_core.export import render
from cope_core.geometry import get_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SGKT = CACHE / "sglang-kt-0.7.2"
SERVER_ARGS = SGKT / "sglang" / "srt" / "server_args.py"
OPTIONS = ("--model-path", "--init-expert-location")      # and every --kt-* / --record-kt-*


def _tree(path: Path) -> ast.Module:
    if not path.is_file():
        missing_runtime("sglang-kt 0.7.2 is not unpacked")
    return ast.parse(path.read_text())


def _functions(path: Path, ns: dict, *names: str) -> dict:
    """Define ``names`` from ``path``'s source alone in the namespace ``ns``."""
    fns = [n for n in _tree(path).body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(f.name for f in fns) == sorted(names)
    exec(compile(ast.Module(fns, []), str(path), "exec"), ns)
    return ns


def _is_option(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "add_argument" and node.value.args
            and isinstance(node.value.args[0], ast.Constant)):
        return False
    name = node.value.args[0].value
    return name.startswith(("--kt-", "--record-kt-")) or name in OPTIONS


@pytest.fixture(scope="module")
def sglang_kt():
    """The parser of sglang-kt's options the export uses, and the code that reads them."""
    cls = next(n for n in _tree(SERVER_ARGS).body
               if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    defaults = {}
    for n in cls.body:       # the dataclass defaults the add_argument calls refer to
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value:
            try:
                defaults[n.target.id] = ast.literal_eval(n.value)
            except ValueError:
                pass
    add = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    calls = [n for n in ast.walk(add) if _is_option(n)]
    parser = ArgumentParser()
    exec(compile(ast.Module(calls, []), str(SERVER_ARGS), "exec"),
         {"parser": parser, "ServerArgs": SimpleNamespace(**defaults)})
    kt = SGKT / "kt_kernel"
    methods = next(n.value for n in _tree(kt / "experts.py").body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "INFERENCE_METHODS")
    common = {"torch": torch, "Optional": Optional, "logger": logging.getLogger("sglang-kt")}
    gen = _functions(kt / "experts_base.py", dict(common), "generate_gpu_experts_masks")
    wrapper = _functions(SGKT / "sglang" / "srt" / "layers" / "moe" / "kt_ep_wrapper.py",
                         dict(common, dist=torch.distributed, _KT_GPU_EXPERTS_MASKS=None,
                              get_tensor_model_parallel_rank=lambda: 0,
                              generate_gpu_experts_masks=gen["generate_gpu_experts_masks"]),
                         "_init_kt_gpu_experts_masks")

    class Metadata:          # which of SGLang's expert-location initialisers is taken
        init_trivial = staticmethod(lambda *a, **k: "trivial")
        init_by_mapping = staticmethod(lambda *a, **k: "by_mapping")
        init_by_eplb = staticmethod(lambda *a, **k: "by_eplb")

    loader = _functions(SGKT / "sglang" / "srt" / "eplb" / "expert_location.py",
                        dict(common, json=__import__("json"), Path=Path,
                             ExpertLocationMetadata=Metadata, ServerArgs=object,
                             ModelConfig=object),
                        "compute_initial_expert_location_metadata",
                        "_should_use_trivial_mapping_for_kt")
    return SimpleNamespace(
        parser=parser, methods=eval(compile(ast.Expression(methods), str(kt), "eval")),
        wrapper=wrapper, location=loader["compute_initial_expert_location_metadata"])


def _launch(sglang_kt, text: str, hf):
    """The exported launch line parsed by sglang-kt, with the model's config attached."""
    words = shlex.split(next(x for x in text.splitlines() if "sglang.launch_server" in x))
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    args = sglang_kt.parser.parse_args(words[3:])        # exits on an unknown or bad option
    return SimpleNamespace(**vars(args), get_hf_config=lambda: hf)


def _gpu_mask(sglang_kt, args):
    sglang_kt.wrapper["_KT_GPU_EXPERTS_MASKS"] = None    # the runtime computes it once
    return sglang_kt.wrapper["_init_kt_gpu_experts_masks"](args)


FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("candidate,K", [("fixed/parallel", 3), ("layer_partition", 5),
                                         ("fixed/cost_selected", 5)])
def test_sglang_kt_places_exactly_the_resident_experts(sglang_kt, family, candidate, K,
                                                        tmp_path):
    from cope_core.models.hf_config import geometry_from_config
    from cope_core.trace.sources.tiny_models import tiny_config
    hf = tiny_config(family, 5)
    g = geometry_from_config(hf.to_dict())
    policy = make_policy(g, K, candidate)
    pt = tmp_path / "dir with space" / "loc.pt"
    r = render(policy, "sglang-kt", pt_path=str(pt))
    (path, data), = r.files
    pt.parent.mkdir()
    Path(path).write_bytes(data)
    args = _launch(sglang_kt, r.text, hf)
    assert args.init_expert_location == str(pt)
    assert args.kt_expert_placement_strategy == "frequency"
    assert args.kt_method in sglang_kt.methods
    assert args.kt_cpuinfer == policy.cpu_threads and not args.kt_enable_dynamic_expert_update
    # the file is read as activation counts, CPU weights keep the trivial mapping
    assert sglang_kt.location(args, None, 0) == "trivial"
    mask = _gpu_mask(sglang_kt, args)
    assert tuple(mask.shape) == (g.dense_layers + g.n_layers, g.n_experts)
    assert mask[:g.dense_layers].all()          # dense blocks: the runtime's "all on the GPU"
    for layer in range(g.n_layers):
        got = set(torch.nonzero(mask[g.dense_layers + layer]).ravel().tolist())
        if candidate == "layer_partition":
            on_gpu = g.dense_layers + layer in policy.layer_plan.gpu_blocks
            assert got == (set(range(g.n_experts)) if on_gpu else set()), layer
        else:
            assert got == set(policy.resident_experts[layer]), layer


def test_sglang_kt_without_counts_offloads_nothing(sglang_kt):
    """The default ``cope advise`` prices: with neither count flag no mask and no KT layer."""
    from cope_core.trace.sources.tiny_models import tiny_config
    args = sglang_kt.parser.parse_args(["--model-path", "M", "--kt-weight-path", "W"])
    assert args.kt_num_gpu_experts is None and args.kt_gpu_experts_ratio is None
    assert args.kt_method == "AMXINT4" and args.kt_expert_placement_strategy == "uniform"
    hf = tiny_config("qwen3_moe", 3)
    assert _gpu_mask(sglang_kt, SimpleNamespace(**vars(args), get_hf_config=lambda: hf)) is None


def test_sglang_kt_reads_qwen35s_nested_text_config(sglang_kt, tmp_path):
    """Qwen3.5-MoE keeps its layers and experts in ``text_config``, which the runtime unwraps."""
    g = get_model("qwen3.5-35b-a3b")
    hf = transformers.Qwen3_5MoeConfig(text_config={"num_hidden_layers": g.n_layers,
                                                    "num_experts": g.n_experts})
    assert getattr(hf, "num_hidden_layers", None) is None
    policy = make_policy(g, 40, "fixed/parallel")
    r = render(policy, "sglang-kt", pt_path=str(tmp_path / "q.pt"))
    (path, data), = r.files
    Path(path).write_bytes(data)
    mask = _gpu_mask(sglang_kt, _launch(sglang_kt, r.text, hf))
    assert [set(torch.nonzero(row).ravel().tolist()) for row in mask] == [
        set(row) for row in policy.resident_experts]
