"""llama-bench's results read in every format and scored against a prediction
(``cope evaluate --llama-bench``): real outputs of llama.cpp b11434 (tests/data/llama-bench,
and a live run when the Vulkan build is set up), rows matched by hand to their placements, the
scores by hand, and bad files."""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from llama_tools import LLAMA_VULKAN, missing_runtime, write_tiny_moe

from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.llamacpp import Build, placement_tpot, read_llama_bench
from cope_core.llamacpp.answer.prompt import PromptRun, prompt_time
from cope_core.llamacpp.bench.bench_eval import (
    BenchMatch,
    match_bench_rows,
    model_tensor_bytes,
    placement_of,
    score_bench_rows,
)
from cope_core.llamacpp.bench.bench_file import BenchRow
from cope_core.llamacpp.placement.vram import LlamaModel, read_llama_model
from cope_core.machine import compose_machine
from cope_core.models import resolve_model
from cope_core.placement import LayerPlan
from cope_core.profile.analytic import analytic_profile

DATA = Path(__file__).parent / "data" / "llama-bench"
FORMATS = ("json", "jsonl", "csv", "md")
#: the fixtures' model: write_tiny_moe at these sizes (deterministic, seed 0)
TINY = dict(hidden=128, inter=256, heads=4, kv_heads=2, head_dim=32, vocab=512)
SETUP = "bash scripts/runtimes.sh (its llama.cpp Vulkan section: scripts/runtimes_vulkan.sh)"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_moe(tmp_path_factory.mktemp("bench") / "tiny-moe.gguf", **TINY)


@pytest.fixture(scope="module")
def machine(tiny):
    g = resolve_model(str(tiny))
    spec = compose_machine(gpu="rtx3090", cpu="xeon-gold-6430").spec
    return read_llama_model(tiny), g, analytic_profile(g, spec, cpu_threads=[1, 2])


def row(m: LlamaModel, **kw) -> BenchRow:
    """A decode row of ``m`` on a GPU, every block offloaded, 2 threads, as llama-bench writes."""
    base = dict(line=1, model_filename="m.gguf", model_type="qwen3moe ?B F16",
                model_size=float(model_tensor_bytes(m)), model_size_tol=0.0, backends="Vulkan",
                gpu_info="llvmpipe", n_threads=2, n_gpu_layers=99, n_cpu_moe=0, overrides=(),
                no_kv_offload=False, type_k="f16", type_v="f16", n_batch=2048, n_ubatch=512,
                flash_attn=-1, n_prompt=0, n_gen=8, n_depth=0, avg_ts=100.0, stddev_ts=1.0)
    return BenchRow(**{**base, **kw})


# --- placements, by hand ----------------------------------------------------------------------
EXPS = r"blk\.{}\.ffn_(up|down|gate)_exps"


@pytest.mark.parametrize("kw,blocks", [
    (dict(), ()),                                                     # all experts on the GPU
    (dict(n_cpu_moe=2), (0, 1)),                                      # -ncmoe 2: blocks 0, 1
    (dict(n_cpu_moe=9), (0, 1, 2, 3)),                                # more than the blocks
    (dict(n_gpu_layers=-1, overrides=(("exps", "CPU"),)), (0, 1, 2, 3)),   # -ot exps=CPU
    (dict(overrides=((EXPS.format(3), "CPU"),)), (3,)),               # the last block, by -ot
    # an -ot to the GPU matches before llama-bench's --n-cpu-moe patterns: block 0 stays
    (dict(n_cpu_moe=2, overrides=((EXPS.format(0), "Vulkan0"),)), (1,)),
    (dict(overrides=(("blk\\.[01]\\.ffn_.*_exps", "Vulkan_Host"),)), (0, 1)),  # pinned host
])
def test_placements_by_hand(machine, kw, blocks):
    m, _, _ = machine
    assert placement_of(row(m, **kw), m) == (blocks, "")


@pytest.mark.parametrize("kw,why", [
    (dict(n_gpu_layers=4), "-ngl 4 keeps blocks on the CPU"),          # blocks + 1 = 5 needed
    (dict(n_gpu_layers=0), "-ngl 0 keeps blocks on the CPU"),
    (dict(overrides=(("blk\\.1\\.ffn_down_exps", "CPU"),)), "block 1's routed experts are split"),
    (dict(overrides=(("attn_q", "CPU"),)), "put blk.0.attn_q.weight in host memory"),
    (dict(overrides=(("output", "CPU"),)), "put output_norm.weight in host memory"),
])
def test_placements_cope_does_not_price_say_why(machine, kw, why):
    m, _, _ = machine
    blocks, reason = placement_of(row(m, **kw), m)
    assert blocks == () and why in reason


def test_n_cpu_moe_counts_the_dense_prefix():
    """Block 0 dense, blocks 1-3 MoE: -ncmoe 2 puts MoE layer 0 (block 1) on the CPU, the
    placement placement.py names --n-cpu-moe 2 for one MoE layer on the CPU."""
    t = [("token_embd.weight", 10), ("output.weight", 10), ("blk.0.ffn_up.weight", 10)]
    t += [(f"blk.{b}.ffn_{p}_exps.weight", 10) for b in (1, 2, 3) for p in ("gate", "up", "down")]
    m = LlamaModel("m.gguf", "qwen3moe", tuple(t), 4, 4096, 8, 64, 512, 4, 2, 32, ((64, 64),) * 4)
    assert placement_of(row(m, n_cpu_moe=2), m) == ((1,), "")
    assert LayerPlan(n_cpu=1, n_gpu=2, dense_layers=1).n_cpu_moe == 2


# --- matching and prediction, by hand ---------------------------------------------------------
def test_rows_match_and_predict_with_placement_tpot(machine):
    m, g, prof = machine
    rows = [row(m, line=1), row(m, line=2, n_cpu_moe=2, n_gen=16, n_depth=32, n_threads=1),
            row(m, line=3, overrides=(("exps", "CPU"),)),
            row(m, line=4, n_prompt=512, n_gen=0), row(m, line=5, n_prompt=16, n_gen=8),
            row(m, line=6, model_size=123.0), row(m, line=7, n_threads=8),
            row(m, line=8, gpu_info="", backends="Vulkan"), row(m, line=9, no_kv_offload=True),
            row(m, line=10, n_threads=None)]
    got = match_bench_rows(rows, m, g, prof)
    assert [x.matched for x in got] == [True] * 3 + [False] * 7
    assert [x.n_cpu for x in got[:3]] == [0, 2, 4]
    assert [x.context for x in got[:3]] == [4.5, 40.5, 4.5]       # d + (n_gen + 1) / 2
    for x, threads in zip(got[:3], (2, 1, 2)):
        us = placement_tpot(prof, g, [x.n_cpu], x.context, cpu_threads=threads)[0]
        assert x.predicted_ts == pytest.approx(1e6 / us, rel=1e-12)
        assert x.error_pct == pytest.approx(100 * (x.predicted_ts / 100.0 - 1))
    why = [x.reason for x in got[3:]]
    assert why[0].startswith("pp512 is prompt processing: priced from the machine's peaks, so "
                             "it needs --gpu")
    assert why[1].startswith("pp16+tg8 times prompt and decode together")
    assert "another model file" in why[2] and "at 8 threads ([1, 2])" in why[3]
    assert "no GPU" in why[4] and "-nkvo" in why[5] and "--threads" in why[6]
    # a markdown table without threads: --threads says them
    assert match_bench_rows(rows[9:], m, g, prof, cpu_threads=1)[0].matched


def test_prompt_rows_are_priced_by_the_prompt_model_and_scored_apart(machine):
    """With the machine's peaks, a pp row is its placement's prompt time at its -ub, -b, op
    offload and depth (on the build it names); decode and prompt rows are scored apart."""
    m, g, prof = machine
    spec = compose_machine(gpu="rtx3090", cpu="xeon-gold-6430").spec
    rows = [row(m, line=1), row(m, line=2, n_cpu_moe=2),
            row(m, line=3, n_prompt=512, n_gen=0, n_cpu_moe=2, n_ubatch=128, avg_ts=900.0),
            row(m, line=4, n_prompt=512, n_gen=0, n_cpu_moe=2, n_ubatch=512, avg_ts=1500.0),
            row(m, line=5, n_prompt=512, n_gen=0, n_cpu_moe=2, no_op_offload=True,
                n_depth=256, build="abc1234 (6000)", avg_ts=700.0)]
    got = match_bench_rows(rows, m, g, prof, spec=spec)
    assert all(x.matched for x in got)
    for x in got[2:]:
        r = x.row
        run = PromptRun(r.n_prompt, r.n_depth, r.n_ubatch, r.n_batch,
                        op_offload=not r.no_op_offload, threads=2)
        build = Build(6000, "t") if r.line == 5 else None
        assert x.predicted_ts == pytest.approx(prompt_time(g, spec, 2, run, build).tokens_per_s)
        assert x.context == r.n_depth + 256
    ev = score_bench_rows(got)
    assert len(ev.matched) == 5 and ev.prompt is not None and ev.prompt.matched == 3
    tg = [x for x in got[:2]]
    assert ev.mean_abs_error_pct == pytest.approx(
        100 * sum(abs(x.predicted_ts / x.row.avg_ts - 1) for x in tg) / 2)
    assert ev.prompt.mean_abs_error_pct == pytest.approx(
        100 * sum(abs(x.predicted_ts / x.row.avg_ts - 1) for x in got[2:]) / 3)
    assert ev.to_dict()["prompt"]["matched"] == 3
    assert "prompt" not in score_bench_rows(got[:2]).to_dict()


def _scored(pred, meas):
    m = LlamaModel("m.gguf", "qwen3moe", (), 1, 1, 1, 1, 1, 1, 1, 1, ())
    return score_bench_rows([BenchMatch(row(m, line=i + 1, avg_ts=b), "", 0, (), 1.0, a)
                       for i, (a, b) in enumerate(zip(pred, meas))])


def test_scores_by_hand():
    ev = _scored([10.0, 20.0, 30.0], [12.0, 25.0, 20.0])
    # ranks 1,2,3 against 1,3,2: 1 - 6 * (0 + 1 + 1) / (3 * 8) = 0.5
    assert ev.spearman == pytest.approx(0.5)
    assert (ev.pick, ev.best) == (2, 1)
    assert ev.regret_pct == pytest.approx(25.0)                   # 25 / 20 - 1
    assert ev.mean_abs_error_pct == pytest.approx((2 / 12 + 5 / 25 + 10 / 20) / 3 * 100)
    assert _scored([10.0, 20.0], [5.0, 30.0]).regret_pct == 0.0     # the pick was the fastest
    assert _scored([10.0], [5.0]).spearman is None                  # one row: no ranking
    empty = score_bench_rows([])
    assert empty.pick is None and empty.regret_pct is None


# --- real files of llama.cpp b11434 -----------------------------------------------------------
def _fixture_rows(name: str) -> tuple[BenchRow, ...]:
    return read_llama_bench(DATA / name)


@pytest.mark.parametrize("run", ["cpu", "offload"])
def test_every_format_reads_the_same_rows(run):
    """The JSON, JSONL, CSV and markdown outputs of the same command (each its own run, so
    its own timings) give the same configurations."""
    ref = _fixture_rows(f"{run}.json")
    assert ref and all(r.samples_ts and len(r.samples_ts) == 2 for r in ref)
    for r in ref:
        assert r.avg_ts == pytest.approx(np.mean(r.samples_ts), rel=1e-5)
    for fmt in FORMATS[1:]:
        got = _fixture_rows(f"{run}.{fmt}")
        assert len(got) == len(ref)
        for a, b in zip(ref, got):
            assert (b.test, b.n_cpu_moe, b.overrides) == (a.test, a.n_cpu_moe, a.overrides)
            assert abs(b.model_size - a.model_size) <= b.model_size_tol and b.avg_ts > 0
            if fmt == "md":
                assert b.n_gpu_layers in (None, a.n_gpu_layers) and b.model_filename == ""
            else:
                assert (b.n_threads, b.n_gpu_layers, b.model_filename) == (
                    a.n_threads, a.n_gpu_layers, a.model_filename)


def test_offload_rows_match_their_placements(machine):
    """The real offload rows (-ngl 99 -ncmoe 0,1,2 by -ot token_embd=CPU (where it is anyway)
    and exps=CPU, on the software Vulkan device) are matched to 0, 1, 2 MoE layers on the CPU,
    and all 4 under exps=CPU; the CPU-only rows are not."""
    m, g, prof = machine
    for fmt in FORMATS:
        got = match_bench_rows(_fixture_rows(f"offload.{fmt}"), m, g, prof, cpu_threads=2)
        assert [(x.row.n_cpu_moe, x.row.ot) for x in got] == [
            (n, ot) for n in (0, 1, 2) for ot in ("token_embd=CPU", "exps=CPU")], fmt
        assert [x.n_cpu for x in got] == [0, 4, 1, 4, 2, 4], fmt
        cpu = match_bench_rows(_fixture_rows(f"cpu.{fmt}"), m, g, prof, cpu_threads=2)
        assert not any(x.matched for x in cpu), fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_scores_a_real_file(tiny, fmt, capsys):
    code = main(["evaluate", "--llama-bench", str(DATA / f"offload.{fmt}"), "--model", str(tiny),
                 "--gpu", "rtx3090", "--threads", "2", "--json"])
    out = json.loads(capsys.readouterr().out)     # strictly valid JSON
    assert code == 0 and out["matched"] == 6 and out["unmatched"] == 0
    assert [r["n_cpu_moe_layers"] for r in out["rows"]] == [0, 4, 1, 4, 2, 4]
    assert out["regret_pct"] >= 0 and out["pick_line"] in [r["line"] for r in out["rows"]]
    main(["evaluate", "--llama-bench", str(DATA / f"cpu.{fmt}"), "--model", str(tiny),
          "--gpu", "rtx3090", "--threads", "2"])
    text = capsys.readouterr().out
    assert "unmatched rows (not guessed)" in text and "nothing scored" in text


def test_cli_prices_a_real_prompt_file_with_the_machines_peaks(tiny, capsys):
    """A real llama-bench pp64 file (Vulkan lavapipe; -ncmoe 0 and 2, -ub 16 and 32, op offload
    on and off): with --gpu every prompt row is priced and scored apart from decode rows."""
    argv = ["evaluate", "--llama-bench", str(DATA / "prompt.json"), "--model", str(tiny),
            "--gpu", "rtx3090", "--threads", "2"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matched"] == 8 and out["unmatched"] == 0
    assert out["prompt"]["matched"] == 8 and out["mean_abs_error_pct"] is None
    assert [r["n_cpu_moe_layers"] for r in out["rows"]] == [0] * 4 + [2] * 4
    assert all(r["predicted_ts"] > 0 and r["context"] == 32 for r in out["rows"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "8 matched prompt rows: mean absolute error" in text and "\n0 matched" not in text


def test_a_prompt_refit_is_fitted_written_and_read_back(tiny, tmp_path, capsys):
    """``--refit`` (issue 71): the prompt rates refitted on the real prompt rows, the record
    written once (never over a file), and read back only for the GPU it was measured on."""
    out = tmp_path / "refit.json"
    argv = ["evaluate", "--llama-bench", str(DATA / "prompt.json"), "--model", str(tiny),
            "--gpu", "rtx3090", "--threads", "2", "--refit", str(out)]
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)["prompt_refit"]
    assert r["rows"] == 8 and set(r["fields"]) == {"gpu_prompt_efficiency",
                                                    "host_copy_bandwidth"}
    assert r["error_after_pct"] < r["error_before_pct"] and r["held_out_error_pct"] is not None
    rec = json.loads(out.read_text())
    assert rec["schema"] == "cope.prompt-refit/1" and rec["gpu"] == "rtx3090"
    # the record's rates price the rows as the fit said
    from cope_core.llamacpp import read_prompt_refit
    m = read_llama_model(tiny)
    g = resolve_model(str(tiny))
    spec = read_prompt_refit(str(out), compose_machine(gpu="rtx3090", cpu="xeon-gold-6430").spec)
    ev = match_bench_rows(read_llama_bench(DATA / "prompt.json"), m, g,
                          analytic_profile(g, spec, cpu_threads=[2]), spec=spec)
    got = np.mean([abs(x.predicted_ts / x.row.avg_ts - 1) for x in ev]) * 100
    assert got == pytest.approx(r["error_after_pct"], rel=1e-6)
    # never over a file; another GPU's record is refused by name
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(out) in err and "refusing to overwrite" in err
    with pytest.raises(CopeInputError, match="measured on 'rtx3090'"):
        read_prompt_refit(str(out), compose_machine(gpu="rtx4090", cpu="xeon-gold-6430").spec)


# --- bad files ----------------------------------------------------------------------------------
BAD = [
    ("", "empty file"),
    ('[\n  {\n    "n_gen": 8\n  }\n]\n', "field 'model_filename': line 2: missing"),
    ('[\n  {\n', "line 3: expected llama-bench's -o json output"),
    ('{"model_filename": "m"}\n{\n', "field 'model_type': line 1: missing"),
    ("a,b\n1,2\n", "line 1: expected llama-bench's output"),
    ("| model | size | test | t/s |\n| --- | ---: | ---: | ---: |\n"
     "| qwen3moe | 6.65 MiB | tg8 | fast |\n", "field 't/s': line 3: expected '<mean> ± <std>'"),
    ("| model | size | test | t/s |\n| --- | ---: | ---: | ---: |\n"
     "| qwen3moe | 6.65 MiB | xx8 | 1.00 ± 0.10 |\n", "field 'test': line 3: expected pp<N>"),
    ("| model | size | t/s |\n|---|---|---|\n", "field 'test': line 1: missing column"),
    # a batch of no tokens (issue 70): markdown shows -ub and -b when not the defaults
    ("| model | size | n_ubatch | test | t/s |\n| --- | ---: | ---: | ---: | ---: |\n"
     "| qwen3moe | 6.65 MiB | 0 | tg8 | 1.00 ± 0.10 |\n",
     "field 'n_ubatch': line 3: expected a whole number >= 1, got '0'"),
    ("| model | size | n_batch | test | t/s |\n| --- | ---: | ---: | ---: | ---: |\n"
     "| qwen3moe | 6.65 MiB | -2048 | tg8 | 1.00 ± 0.10 |\n",
     "field 'n_batch': line 3: expected a whole number >= 1, got '-2048'"),
]


@pytest.mark.parametrize("text,where", BAD)
def test_bad_files_are_one_line_naming_file_line_and_field(tmp_path, text, where):
    p = tmp_path / "bench.txt"
    p.write_text(text)
    with pytest.raises(CopeInputError) as e:
        read_llama_bench(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(p)) and where in msg


@pytest.mark.parametrize("field,value,expected", [
    ("n_gen", "eight", "expected a whole number"), ("avg_ts", 0, "> 0"),
    ("avg_ts", "nan", "finite"), ("tensor_buft_overrides", "exps", "pattern=BUFFER"),
    ("tensor_buft_overrides", "exps(=CPU", "regular expression"),
    ("no_kv_offload", "yes", "true/false"),
    # counts out of range (issue 70): no negative tokens, no empty batch
    ("n_prompt", -1, "expected a whole number >= 0, got -1"),
    ("n_gen", "-8", "expected a whole number >= 0, got '-8'"),
    ("n_ubatch", 0, "expected a whole number >= 1, got 0"),
    ("n_batch", -512, "expected a whole number >= 1, got -512"),
    # the load mode (issue 71): llama-bench's names only
    ("load_mode", "pinned", "expected one of auto, none, mmap")])
def test_bad_fields_of_a_real_row(tmp_path, field, value, expected, tiny, capsys):
    obj = json.loads((DATA / "offload.jsonl").read_text().splitlines()[0])
    obj[field] = value
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(obj) + "\n")
    code = main(["evaluate", "--llama-bench", str(p), "--model", str(tiny),
                 "--gpu", "rtx3090"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith(f"cope: error: {p}: ")
    assert f"field '{field}': line 1: " in err and expected in err


@pytest.mark.parametrize("fields,mode,pinned", [
    ({}, "auto", False), ({"load_mode": "none"}, "none", True),
    ({"load_mode": "mmap"}, "mmap", False), ({"load_mode": "mlock"}, "mlock", True),
    ({"load_mode": "none", "no_host": True}, "none", False),
    ({"use_mmap": False}, "none", True), ({"use_mmap": True}, "mmap", False)])
def test_a_rows_load_mode_says_whether_host_experts_were_pinned(tmp_path, fields, mode, pinned):
    """b10105 on writes ``load_mode``, earlier builds ``use_mmap``; ``--no-host`` bypasses the
    pinned host buffer (docs/prompt-sources.md, Q1)."""
    obj = json.loads((DATA / "offload.jsonl").read_text().splitlines()[0])
    obj.pop("load_mode", None)
    obj.pop("use_mmap", None)
    p = tmp_path / "lm.jsonl"
    p.write_text(json.dumps({**obj, **fields}) + "\n")
    row = read_llama_bench(p)[0]
    assert (row.load_mode, row.pinned) == (mode, pinned)


# --- a live run of llama-bench --------------------------------------------------------------------
def bench(model: Path, *args: str, gpu: bool) -> str:
    exe = LLAMA_VULKAN / "bin" / "llama-bench"
    if not exe.is_file():
        missing_runtime("llama.cpp b11434 with Vulkan (llama-bench) is not built", SETUP)
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    env["LD_LIBRARY_PATH"] = str(LLAMA_VULKAN / "bin")
    if gpu:
        env["GGML_VK_VISIBLE_DEVICES"] = "0"
    r = subprocess.run([str(exe), "-m", str(model), *args], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_llama_bench_runs_and_its_output_is_read(tiny, machine, tmp_path, fmt):
    m, g, prof = machine
    out = tmp_path / f"run.{fmt}"
    out.write_text(bench(tiny, "-p", "0", "-n", "8", "-r", "2", "-t", "2", "-ngl", "99",
                         "-ncmoe", "0,2", "-o", fmt, gpu=True))
    got = match_bench_rows(read_llama_bench(out), m, g, prof, cpu_threads=2)
    assert [(x.row.test, x.row.n_cpu_moe, x.n_cpu) for x in got] == [("tg8", 0, 0),
                                                                     ("tg8", 2, 2)]
    assert all(x.matched and x.row.avg_ts > 0 for x in got)
    if fmt != "md":
        assert {x.row.model_size for x in got} == {float(model_tensor_bytes(m))}
        assert re.search(r"tiny-moe\.gguf$", got[0].row.model_filename)


def test_fixture_model_is_the_tests_model(machine):
    """The fixtures were written on write_tiny_moe(**TINY): the same tensor bytes."""
    m, _, _ = machine
    for name in ("offload.json", "cpu.json", "prompt.json"):
        assert {r.model_size for r in _fixture_rows(name)} == {float(model_tensor_bytes(m))}


def test_rows_are_frozen(machine):
    m, _, _ = machine
    r = row(m)
    with pytest.raises(AttributeError):
        r.avg_ts = 1.0          # type: ignore[misc]
    assert replace(r, n_gen=0, n_prompt=4).kind == "pp"
