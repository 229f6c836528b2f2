"""The one llama.cpp command builder (issue 61): settings in, argv out, hand-worked; the tensor
pattern llama.cpp's own --n-cpu-moe uses, written once and matching the tensors it should; a
llama-bench run's arguments read back to the same settings; and no other string of the package
spells a routed-expert pattern."""
from __future__ import annotations

import ast
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cope_core.llamacpp import LlamaFlags
from cope_core.llamacpp.placement.command import (
    EXPERT_TENSORS,
    FIT_EXPERT_TENSORS,
    FIT_OVERFLOW,
    IK_EXPERT_TENSORS,
    all_layers,
    block_pattern,
    n_cpu_moe_patterns,
    override_regex,
)
from cope_core.placement import LayerPlan

ROOT = Path(__file__).resolve().parents[1]


def test_a_placement_with_its_cache_is_written_in_the_servers_order():
    f = LlamaFlags.placed(49, 8, 20, cache_mib=512, cpu_share=0.5)
    assert f.argv() == ["-ngl", "99", "-fit", "off", "-t", "8", "--n-cpu-moe", "20",
                        "--moe-cache-mib", "512", "--moe-cache-cpu-share", "0.5"]
    assert f.command() == ("llama-server -m MODEL.gguf -ngl 99 -fit off -t 8 --n-cpu-moe 20 "
                           "--moe-cache-mib 512 --moe-cache-cpu-share 0.5")
    # no --n-cpu-moe when None, written when 0; -ngl one past a deeper model's blocks
    assert LlamaFlags.placed(120, 4).text() == "-ngl 121 -fit off -t 4"
    assert LlamaFlags.placed(48, 4, 0).text() == "-ngl 99 -fit off -t 4 --n-cpu-moe 0"
    assert all_layers(98) == 99 and all_layers(99) == 100


def test_the_default_and_the_cpu_only_command():
    assert LlamaFlags.default(4096).command() == "llama-server -m MODEL.gguf -c 4096"
    assert LlamaFlags.cpu_only(16).command("m.gguf") == "llama-server -m m.gguf -ngl 0 -t 16"


def test_a_layer_plan_as_n_cpu_moe_and_as_one_override():
    plan = LayerPlan(n_cpu=3, n_gpu=3, dense_layers=1)      # blocks 1..3 of 0..6 on the CPU
    short, explicit = LlamaFlags.of_plan(plan, 8)
    assert short.text() == "-ngl 99 -fit off -t 8 --n-cpu-moe 4"
    assert explicit.text() == ("-ngl 99 -fit off -t 8 -ot "
                               r"'^blk\.([1-3])\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'")
    # the shell gives llama.cpp the pattern unquoted; its regex matches exactly those blocks
    regex = shlex.split(explicit.text())[-1].rsplit("=", 1)[0]
    hit = {b for b in range(7) if re.search(regex, f"blk.{b}.ffn_up_exps.weight")}
    assert hit == {1, 2, 3}
    _, plain = LlamaFlags.of_plan(LayerPlan(n_cpu=0, n_gpu=6, dense_layers=0), 8)
    assert plain.text() == "-ngl 99 -fit off -t 8"


def test_the_pattern_matches_the_tensors_n_cpu_moe_moves():
    """llama.cpp's LLM_FFN_EXPS_REGEX with ``blk\\.N`` before it: every projection of block N's
    routed experts, fused or channel-wise, weights and scales (regex_search, no anchor), and
    nothing of block 30 for block 3, or of the dense FFN or the shared expert."""
    pat = re.compile(block_pattern(3))
    for name in ("blk.3.ffn_up_exps.weight", "blk.3.ffn_gate_exps.weight",
                 "blk.3.ffn_down_exps.scale", "blk.3.ffn_gate_up_exps.weight",
                 "blk.3.ffn_up_chexps.weight"):
        assert pat.search(name), name
    for name in ("blk.30.ffn_up_exps.weight", "blk.3.ffn_up.weight",
                 "blk.3.ffn_up_shexp.weight", "blk.13.ffn_down_exps.weight"):
        assert not pat.search(name), name
    assert n_cpu_moe_patterns(2) == (block_pattern(0), block_pattern(1))
    assert override_regex((0, 1)).endswith(EXPERT_TENSORS)
    # fit's spelling names the same tensors
    for name in ("blk.3.ffn_gate_up_exps.weight", "blk.3.ffn_up_exps.weight", "blk.3.x"):
        assert bool(re.search(r"blk\.3" + FIT_EXPERT_TENSORS, name)) == bool(pat.search(name))


def test_llama_bench_runs_and_their_server_line():
    ncmoe = LlamaFlags.placed(49, 8, 12)
    assert ncmoe.argv("bench") == ["-ngl", "99", "-ncmoe", "12", "-t", "8"]
    fit = LlamaFlags(fit=True, fit_margin_mib=1024, threads=8)
    assert fit.argv("bench") == ["-fitt", "1024", "-t", "8"]
    assert fit.command("m.gguf") == "llama-server -m m.gguf --fit on -fitt 1024 -t 8"
    assert LlamaFlags.cpu_only(4).argv("bench") == ["-ngl", "0", "-t", "4"]
    with pytest.raises(ValueError, match="llama-bench"):
        LlamaFlags.placed(49, 8, 12, cache_mib=64).argv("bench")
    with pytest.raises(ValueError, match="tool"):
        ncmoe.argv("cli")


@given(st.one_of(
    st.builds(lambda n, t, k: LlamaFlags.placed(n, t, k), st.integers(1, 200),
              st.integers(1, 256), st.integers(0, 200)),
    st.builds(lambda t: LlamaFlags.cpu_only(t), st.integers(1, 256)),
    st.builds(lambda m, t: LlamaFlags(fit=True, fit_margin_mib=m, threads=t),
              st.integers(0, 1 << 16), st.integers(1, 256)),
    st.builds(lambda t, u, o: LlamaFlags(threads=t, n_ubatch=u, op_offload=o),
              st.integers(1, 256), st.integers(1, 4096), st.booleans())))
def test_a_bench_run_reads_back_to_its_settings(flags):
    assert LlamaFlags.from_bench_argv(flags.argv("bench")) == flags


def _pattern_literals(path: Path) -> list[str]:
    """String constants (docstrings left out) that spell a routed-expert tensor pattern."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and re.search(r"_\(ch\|\)exps|_exps\\\.\(weight|ffn_\w*\(|ffn_down\.\*", n.value)]


def test_the_tensor_pattern_is_written_once():
    """Only the command builder spells a tensor pattern of the llama.cpp family (mainline's and
    fit's routed experts, fit's partial layers, ik_llama.cpp's experts); every other module
    builds on it."""
    found = {str(p.relative_to(ROOT)): lits for p in (ROOT / "cope_core").rglob("*.py")
             if (lits := _pattern_literals(p))}
    assert set(found) == {"cope_core/llamacpp/placement/command.py"}, found
    assert sorted(found["cope_core/llamacpp/placement/command.py"]) == sorted(
        [EXPERT_TENSORS, FIT_EXPERT_TENSORS, IK_EXPERT_TENSORS,
         *(v for k, v in FIT_OVERFLOW.items() if k != "moe")])


def test_the_batch_flags():
    f = LlamaFlags(n_gpu_layers=99, n_cpu_moe=20, n_batch=4096, n_ubatch=2048, op_offload=False)
    assert f.text() == "-ngl 99 --n-cpu-moe 20 -b 4096 -ub 2048 --no-op-offload"
    # llama-bench takes them too, op offload as -nopo 1, after the flags it always had
    assert f.argv("bench") == ["-ngl", "99", "-ncmoe", "20", "-b", "4096", "-ub", "2048",
                               "-nopo", "1"]
    assert LlamaFlags.from_bench_argv(f.argv("bench")) == replace(f, fit=False)
    with pytest.raises(ValueError, match="llama-bench"):
        LlamaFlags(n_ctx=4096).argv("bench")
