"""One builder for every llama.cpp-family command line (issue 70, part 3): ik_llama.cpp as a
dialect of :class:`LlamaFlags` (its placement replayed as ik_llama.cpp parses it), fit's
placement held as data and printed, cut or whole, from it (and a record's line read back to the
same data), llama-bench's command line and its value-list sweeps from settings, and the tables
that print a record's flags spelled for the record's build."""
from __future__ import annotations

import copy
import inspect
import json
import pickle
import re
from dataclasses import replace

import pytest
from ik_tools import ik_place
from llama_tools import expert_tensor, gguf_names

from cope_core.app.llamacpp_view import best_table
from cope_core.cli.cache_report import json_rows
from cope_core.geometry import GIB, get_model
from cope_core.llamacpp import Build, LlamaFlags
from cope_core.llamacpp.answer.baseline import short_args
from cope_core.llamacpp.answer.cache_record import BestConfig, CacheRecord, Versus
from cope_core.llamacpp.bench.bench_run import BenchBuild, bench_command
from cope_core.llamacpp.placement.command import IK_EXPERT_TENSORS, override_regex
from cope_core.llamacpp.placement.fit import FIT_MARGIN, FitArgs, FitDefault, fit_default
from cope_core.llamacpp.placement.vram import (
    Placement,
    device_memory,
    llama_model_of,
    read_llama_model,
)
from cope_core.models import resolve_model

IK = "ik_llama.cpp"
HEADER = "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"


# --- ik_llama.cpp ------------------------------------------------------------------------------
def test_ik_llamacpp_is_a_dialect_of_the_same_flags():
    """-ngl 999 (its own value), no -fit off (fit is off there; ``-fit`` does not parse),
    ``-ncmoe`` for --n-cpu-moe, its own expert pattern for the explicit override."""
    base = LlamaFlags.placed(48, 8, dialect=IK)
    assert base.argv() == ["-ngl", "999", "-t", "8"]
    assert replace(base, n_cpu_moe=5).argv() == ["-ngl", "999", "-t", "8", "-ncmoe", "5"]
    exact = replace(base, cpu_blocks=(0, 1, 2))
    assert exact.argv() == ["-ngl", "999", "-t", "8", "-ot",
                            r"blk\.([0-2])\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)=CPU"]
    assert exact.command() == ("llama-server -m MODEL.gguf -ngl 999 -t 8 -ot "
                               r"'blk\.([0-2])\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)"
                               "=CPU'")
    assert override_regex((0, 1, 2), IK).endswith(IK_EXPERT_TENSORS)
    assert LlamaFlags.expert_override("(...)", IK) == \
        r"blk\.(...)\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)"
    # fit is a switch there; its margin, the MoE cache and its llama-bench are not written
    assert replace(base, fit=True).argv() == ["-ngl", "999", "--fit", "-t", "8"]
    for bad in (replace(base, fit=True, fit_margin_mib=1024), replace(base, cache_mib=512),
                replace(base, op_offload=False)):
        with pytest.raises(ValueError, match="ik_llama.cpp"):
            bad.argv()
    with pytest.raises(ValueError, match="ik_llama.cpp"):
        base.argv("bench")
    with pytest.raises(ValueError, match="dialect"):
        LlamaFlags(dialect="llama.cpp-fork")


@pytest.mark.parametrize("n_cpu", [0, 1, 3])
def test_an_ik_line_places_what_it_says_as_ik_llamacpp_parses_it(n_cpu):
    """The exact override puts the first MoE blocks' experts on the CPU, -ncmoe N the last N
    (replayed as ik_llama.cpp parses and places them, tests/ik_tools.py)."""
    g = get_model("deepseek-v2-lite")
    names = gguf_names(g, scales=True)
    blocks = tuple(range(g.dense_layers, g.dense_layers + n_cpu))
    base = LlamaFlags.placed(g.dense_layers + g.n_layers, 8, dialect=IK)
    placed = ik_place(replace(base, cpu_blocks=blocks).command(), names)
    assert {expert_tensor(n) for n in placed} == set(blocks)
    last = ik_place(replace(base, n_cpu_moe=n_cpu).command(), names)
    end = g.dense_layers + g.n_layers
    assert {expert_tensor(n) for n in last} == set(range(end - n_cpu, end))


# --- fit's placement ---------------------------------------------------------------------------
def test_fits_placement_is_data_printed_as_llama_fit_params_prints_it():
    m = read_llama_model(HEADER)
    fd = fit_default(m, 12 * GIB + FIT_MARGIN, n_ctx=4096)
    f = fd.flags
    assert isinstance(fd.args, FitArgs) and fd.args.flags is f
    assert (f.n_ctx, f.n_gpu_layers) == (4096, 49) and len(f.cpu_overrides) == 18
    # the line: -c, -ngl, then every pattern to the CPU in one double-quoted -ot list
    assert fd.args == '-c 4096 -ngl 49 -ot "' + ",".join(p + "=CPU" for p in f.cpu_overrides) \
        + '"'
    # its patterns place what the port placed: llama.cpp's count of the GPU's memory agrees
    assert device_memory(m, Placement(f.n_gpu_layers, f.cpu_overrides), 4096).total / GIB == \
        pytest.approx(fd.device_gib)
    # shortened from the data, not from the text
    assert short_args(fd.args) == f.fit_params_line(2) + " (18 patterns)"
    assert short_args(fd.args).startswith(
        f'-c 4096 -ngl 49 -ot "{f.cpu_overrides[0]}=CPU,{f.cpu_overrides[1]}=CPU,…" ')
    assert short_args(fd.args, keep=18) == fd.args


def test_a_hand_made_fit_line_and_its_short_form():
    moe = r"\.ffn_(up|down|gate_up|gate)_(ch|)exps"
    f = LlamaFlags(n_ctx=4096, n_gpu_layers=49,
                   cpu_overrides=(r"blk\.8\.ffn_down.*", r"blk\.9" + moe, r"blk\.10" + moe))
    line = FitArgs(f)
    assert line == (r'-c 4096 -ngl 49 -ot "blk\.8\.ffn_down.*=CPU,'
                    r'blk\.9\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU,'
                    r'blk\.10\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU"')
    assert line.short() == (r'-c 4096 -ngl 49 -ot "blk\.8\.ffn_down.*=CPU,'
                            r'blk\.9\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU,…" (3 patterns)')
    assert FitArgs(LlamaFlags(n_gpu_layers=0)) == "-ngl 0"          # a build before --fit


def test_a_records_fit_line_reads_back_to_the_same_data():
    m = llama_model_of(resolve_model("olmoe-1b-7b"))
    fd = fit_default(m, 8 * GIB + FIT_MARGIN, n_ctx=4096)     # a partial layer: ffn_down first
    assert fd.flags.cpu_overrides[0] == r"blk\.8\.ffn_down.*"
    d = json.loads(json.dumps(fd.to_dict()))
    assert type(d["args"]) is str and d["args"] == fd.args
    again = FitDefault.from_dict(d)
    assert again == fd and again.flags == fd.flags and isinstance(again.args, FitArgs)
    for twin in (pickle.loads(pickle.dumps(fd)), copy.deepcopy(fd)):
        assert twin == fd and twin.args.flags == fd.flags
    for bad in ("-c 4096 -ngl 49 -ot 'x=CUDA0'", "-c 4096 -fit off", '-ngl  2'):
        with pytest.raises(ValueError):
            FitDefault.from_dict({**d, "args": bad})


# --- llama-bench -------------------------------------------------------------------------------
BUILD = BenchBuild("/opt/llama/llama-bench", "version: 11434 (abc)", 11434, "abc", frozenset())


def test_a_bench_run_is_written_from_its_settings():
    args = LlamaFlags.placed(49, 8, 12).argv("bench")
    assert bench_command(BUILD, "m.gguf", args, repetitions=3, n_gen=32) == [
        "/opt/llama/llama-bench", "-m", "m.gguf", "-p", "0", "-n", "32", "-r", "3", "-o", "json",
        "-ngl", "99", "-ncmoe", "12", "-t", "8"]
    fit = LlamaFlags(fit=True, fit_margin_mib=1024, threads=8, n_ubatch=128, op_offload=False)
    assert LlamaFlags.bench_command("llama-bench", "m.gguf", fit.argv("bench"), n_prompt=512,
                                    n_gen=0, repetitions=1, output="jsonl") == [
        "llama-bench", "-m", "m.gguf", "-p", "512", "-n", "0", "-r", "1", "-o", "jsonl",
        "-fitt", "1024", "-t", "8", "-ub", "128", "-nopo", "1"]
    for kw in (dict(n_prompt=-1, n_gen=8, repetitions=1), dict(n_prompt=0, n_gen=0, repetitions=1),
               dict(n_prompt=0, n_gen=8, repetitions=0),
               dict(n_prompt=0, n_gen=8, repetitions=1, output="xml")):
        with pytest.raises(ValueError):
            LlamaFlags.bench_command("llama-bench", "m.gguf", [], **kw)


def test_a_sweep_is_one_value_list_per_flag_over_a_whole_grid():
    grid = [LlamaFlags(n_gpu_layers=99, threads=2, n_cpu_moe=n, n_ubatch=ub, op_offload=o)
            for n in (0, 2, 4) for ub in (32, 128, 512) for o in (True, False)]
    assert LlamaFlags.sweep(grid) == ["-ngl", "99", "-ncmoe", "0,2,4", "-t", "2",
                                      "-ub", "32,128,512", "-nopo", "0,1"]
    assert LlamaFlags.sweep([LlamaFlags(threads=t) for t in (1, 2, 3)]) == ["-t", "1,2,3"]
    assert LlamaFlags.sweep([LlamaFlags.placed(49, 8, 12)]) == LlamaFlags.placed(49, 8, 12).argv(
        "bench")
    with pytest.raises(ValueError, match="grid"):           # llama-bench would run 4, not 2
        LlamaFlags.sweep([LlamaFlags(threads=1, n_cpu_moe=0), LlamaFlags(threads=2, n_cpu_moe=2)])
    with pytest.raises(ValueError, match="some configurations"):
        LlamaFlags.sweep([LlamaFlags(threads=1), LlamaFlags(threads=1, n_cpu_moe=2)])
    with pytest.raises(ValueError, match="no configuration"):
        LlamaFlags.sweep([])


# --- a record's flags in the tables -------------------------------------------------------------
def _record(build: str) -> CacheRecord:
    best = (BestConfig("llamacpp_cache/classlru", "b12191", 4, 5, 1056, 0.95, 63, 128581.7, 9.3,
                       3.25, 11.5),
            BestConfig("layer_partition", "", 3, 4, 0, 0.0, 0, 139425.6, 0.0, 0.0, 0.0))
    return CacheRecord(3.0, 120, "server", best, (Versus("llamacpp_cache/classlru", 128581.7,
                                                         None, None),), build=build)


@pytest.mark.parametrize("build,says,not_says", [
    ("", "-fit off -t 2 --n-cpu-moe 4", "-ot"),            # the newest: as always
    ("b7000", "-ngl 99 -t 2 --n-cpu-moe 4", "-fit"),       # before --fit
    ("b6000", r"-ot '^blk\.([0-3])\.ffn_", "--n-cpu-moe"),  # before --n-cpu-moe
])
def test_the_tables_spell_a_records_flags_for_its_build(build, says, not_says):
    rec = _record(build)
    g4 = type("G", (), {"dense_layers": 1, "n_layers": 4})()       # 5 blocks
    table = best_table(rec, g4, 2)
    plain = table["llama-server flags"].iloc[1]
    assert says in plain and not_says not in plain
    assert plain == Build(int(build[1:]) if build else rec.assumed.number, "t").spell(
        rec.best[1].flags(5, 2)).text()
    # cope predict --json's rows (the cache rows) go through the same spelling
    kw = {"answer": None} if "answer" in inspect.signature(json_rows).parameters else {}
    trace = type("T", (), {"model": g4})()
    (row,) = json_rows(rec=rec, trace=trace, K=16, cpu_threads=2, **kw)
    assert row["flags"] == rec.assumed.spell(rec.best[0].flags(5, 2)).text()
    assert ("-fit off" in row["flags"]) == (build == "")
    assert re.search(r"--n-cpu-moe 5\b", row["flags"]) is not None or build == "b6000"
