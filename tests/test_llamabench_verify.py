"""``cope verify --llama-bench`` and the refit (issue 41 items 2 and 3): the refit by hand and
on the analytic CPU model's own family, the race with a scripted llama-bench (drops, stop,
resume after an interruption), and a live end-to-end run on a tiny GGUF with llama.cpp b11434's
llama-bench, then ``cope export --from-verify`` of its record."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from llama_tools import LLAMA, LLAMA_VULKAN, missing_runtime, write_tiny_moe

from cope_core import parts
from cope_core.cli.llamabench_verify_cmd import bench_settings
from cope_core.cli.main import build_parser, main
from cope_core.cli.verify_cmd import verify_settings
from cope_core.errors import CopeInputError
from cope_core.estimate.cpu_only import host_spec, spec_tpot
from cope_core.estimate.refit import HOST_EXPERTS, OP_FIXED, FitPoint, Knob, refit, scaled_spec
from cope_core.llamacpp.bench import bench_verify as lv
from cope_core.llamacpp.bench.bench_file import BenchRow
from cope_core.llamacpp.bench.bench_record import bench_race_record, server_command
from cope_core.llamacpp.bench.bench_run import BenchBuild
from cope_core.machine import compose_machine
from cope_core.models import get_model
from cope_core.verify import VerifySettings

TINY = dict(hidden=128, inter=256, heads=4, kv_heads=2, head_dim=32, vocab=512)
CPU = parts.cpu_part("ryzen-9-7950x")
MEM = parts.memory_part("ddr5-5200x2")


def _spec():
    return host_spec(CPU, MEM)


# --- refit ----------------------------------------------------------------------------------------
def test_refit_recovers_a_known_factor_by_hand():
    spec = _spec()

    def predict(s, p):               # µs: bytes at the memory's rate plus a fixed 10 µs
        return p.what / s.cpu_bandwidth * 1e6 + 10.0
    true = scaled_spec(spec, [HOST_EXPERTS], [0.7], 1)
    pts = [FitPoint(f"{b}", 1, predict(true, FitPoint("", 1, 1.0, b)), b)
           for b in (1e6, 3e6, 5e6)]
    r = refit(spec, [HOST_EXPERTS], pts[:2], predict, held_out=pts[2:])
    assert r.factors[0] == pytest.approx(0.7, rel=1e-6)
    held = r.points[2]
    assert held.held_out and abs(held.error_after_pct) < 1e-6
    # before: predicted 5e6 / bw + 10 against 5e6 / (0.7 bw) + 10, on tokens per second
    bw = spec.cpu_bandwidth
    assert held.error_before_pct == pytest.approx(
        100 * ((5e6 / (0.7 * bw) * 1e6 + 10) / (5e6 / bw * 1e6 + 10) - 1))
    assert r.mean_abs_error_pct(held_out=True, after=True) < 1e-6
    assert r.to_dict()["knobs"][0]["factor"] == pytest.approx(0.7, rel=1e-6)


def test_a_knob_at_one_thread_count_moves_only_that_count():
    spec = _spec()
    k = HOST_EXPERTS.at(2)
    assert scaled_spec(spec, [k], [0.5], 1) == spec
    s2 = scaled_spec(spec, [k, OP_FIXED], [0.5, 2.0], 2)
    assert s2.cpu_bandwidth == spec.cpu_bandwidth * 0.5
    assert s2.cpu_bandwidth_per_thread == spec.cpu_bandwidth_per_thread * 0.5
    assert s2.gpu_launch_us == spec.gpu_launch_us * 2.0
    assert s2.gpu_bandwidth == spec.gpu_bandwidth


@pytest.mark.parametrize("knobs, points, message", [
    ([Knob("x", ("no_such_field",))], 2, "not constants"),
    ([Knob("x", ("cpu_cores",))], 2, "not constants"),         # an int, not a constant
    ([HOST_EXPERTS, OP_FIXED], 1, "at most as many constants as points"),
    ([HOST_EXPERTS.at(4)], 2, "no fitted point at 4 threads"),
])
def test_refit_refuses_what_it_cannot_fit(knobs, points, message):
    pts = [FitPoint(str(i), 1, 100.0 + i) for i in range(points)]
    with pytest.raises(CopeInputError, match=message):
        refit(_spec(), knobs, pts, lambda s, p: 100.0)


def test_refit_on_the_analytic_cpu_model_predicts_held_out_types_and_threads():
    """'Measurements' made by the CPU-only model at a spec 0.6 x slower than published: fitted
    on Q8_0 at 1 thread and Q4_K_M at 2, the other two points are predicted exactly."""
    spec = _spec()
    true = scaled_spec(spec, [HOST_EXPERTS], [0.6], 1)
    g = {q: get_model("qwen3-30b-a3b") for q in ("Q8_0", "Q4_K_M")}
    from cope_core.models import apply_preset
    g = {q: apply_preset(m, q) for q, m in g.items()}

    def predict(s, p):
        return spec_tpot(g[p.what], s, p.threads, 16.5)
    pts = {(q, t): FitPoint(f"{q}@{t}", t, predict(true, FitPoint("", t, 1.0, q)), q)
           for q in g for t in (1, 2)}
    fit = [pts[("Q8_0", 1)], pts[("Q4_K_M", 2)]]
    r = refit(spec, [HOST_EXPERTS], fit, predict,
              held_out=[p for p in pts.values() if p not in fit])
    assert r.factors[0] == pytest.approx(0.6, rel=1e-4)
    assert r.mean_abs_error_pct(held_out=True, after=True) < 1e-3
    assert r.mean_abs_error_pct(held_out=True, after=False) > 10


# --- the race with a scripted llama-bench ---------------------------------------------------------
BUILD = BenchBuild("/bin/true", "version: x (build 1, commit c)", 1, "c", frozenset({"-t"}))


def _row(samples):
    return BenchRow(line=1, model_filename="m", model_type="t", model_size=1.0,
                    model_size_tol=0.0, backends="CPU", gpu_info="", n_threads=1,
                    n_gpu_layers=0, n_cpu_moe=0, overrides=(), no_kv_offload=False,
                    type_k="f16", type_v="f16", n_batch=1, n_ubatch=1, flash_attn=0,
                    n_prompt=0, n_gen=8, n_depth=0, avg_ts=float(np.mean(samples)),
                    stddev_ts=0.0, samples_ts=tuple(samples))


def _plan(tiny_path):
    machine = compose_machine(gpu=None, cpu=dataclasses.replace(CPU, cores=2), memory=MEM,
                              threads=2)
    return machine, lv.plan_bench_race(tiny_path, machine, BUILD, lv.BenchSettings())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_moe(tmp_path_factory.mktemp("verify") / "tiny-moe.gguf", **TINY)


def test_plan_on_a_cpu_only_machine_races_thread_counts(tiny):
    machine, p = _plan(tiny)
    assert [c.threads for c in p.curve] == [1, 2]
    assert {c.name for c in p.contenders} == {"-t 1", "-t 2"}
    assert p.contenders[0].predicted_us <= p.contenders[1].predicted_us
    for c in p.curve:
        assert c.args == ("-ngl", "0", "-t", str(c.threads))
        assert c.predicted_us == pytest.approx(
            spec_tpot(get_model_of(tiny), p.spec, c.threads, (32 + 1) / 2))


def get_model_of(path):
    from cope_core.models import resolve_model
    return resolve_model(str(path))


def test_race_drops_the_slower_stops_and_resumes(tiny, tmp_path, monkeypatch):
    machine, p = _plan(tiny)
    speed = {"1": [100.0, 101.0, 99.0], "2": [150.0, 151.0, 149.0]}   # -t 2 is faster
    calls = []

    def fake(build, model, args, *, repetitions, n_gen, env=None):
        calls.append(args[-1])
        if len(calls) == 3 and interrupt:
            raise KeyboardInterrupt
        return _row(speed[args[-1]])
    monkeypatch.setattr(lv, "run_bench", fake)
    settings = lv.BenchSettings(max_rounds=4, min_rounds=2)
    state = tmp_path / "race.state.json"
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        lv.run_bench_race(p, BUILD, tiny, settings, state)
    saved = json.loads(state.read_text())
    assert saved["rounds"] == 1 and len(saved["runs"]) == 6        # round 1 kept
    interrupt = False
    st = lv.run_bench_race(p, BUILD, tiny, settings, state)
    assert st.rounds == 2 and st.stop == "one left" and st.alive == ["-t 2"]
    assert len(calls) == 5             # 2 in round 1, one lost to the interruption, 2 after
    assert [d["name"] for d in st.dropped] == ["-t 1"]
    # measured: median over a round's repetitions, mean over rounds
    assert lv.measured_us(st) == {"-t 1": pytest.approx(1e6 / 100.0),
                                  "-t 2": pytest.approx(1e6 / 150.0)}
    r = bench_race_record(p, st, BUILD, machine, settings, str(tiny))
    v = r["verified"]
    assert v["name"] == "-t 2" and v["measured_ts"] == pytest.approx(150.0)
    assert v["error_pct"] == pytest.approx(100 * (v["predicted_ts"] / 150.0 - 1))
    assert v["command"] == f"llama-server -m {tiny} -ngl 0 -t 2"
    f = r["refit"]
    held = [x for x in f["points"] if x["held_out"]]
    assert [x["label"] for x in held] == ["-t 2"] and len(f["knobs"]) == 1
    json.dumps(r, allow_nan=False)
    # a state file of another race is refused, not overwritten
    with pytest.raises(CopeInputError, match="another race"):
        lv.run_bench_race(p, BUILD, tiny, dataclasses.replace(settings, n_gen=64), state)


def test_server_command_spells_llama_servers_flags():
    """The llama-server line of a raced configuration, written by the one command builder as
    every other placement is (llama-bench has no fit; llama-server is told -fit off)."""
    assert server_command("m.gguf", ("-ngl", "99", "-ncmoe", "3", "-t", "8")) == \
        "llama-server -m m.gguf -ngl 99 -fit off -t 8 --n-cpu-moe 3"
    assert server_command("a b.gguf", ("-fitt", "1024", "-t", "2")) == \
        "llama-server -m 'a b.gguf' --fit on -fitt 1024 -t 2"
    assert server_command("m.gguf", ("-ngl", "0", "-t", "4")) == \
        "llama-server -m m.gguf -ngl 0 -t 4"


# --- the CLI --------------------------------------------------------------------------------------
def test_cli_bad_input_is_one_line(tiny, tmp_path, capsys):
    assert main(["verify", "--llama-bench", str(tmp_path / "nope"), "--model", str(tiny),
                 "--state", str(tmp_path / "s.json")]) == 2
    assert "not an executable file" in capsys.readouterr().err
    assert main(["verify", "--llama-bench", "/bin/true"]) == 2
    assert "needs --model" in capsys.readouterr().err
    assert main(["verify", "--profile", "p.parquet"]) == 2
    assert "missing --trace" in capsys.readouterr().err


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_verify_llama_bench_help_says_bench_settings_defaults(capsys):
    """The race runs at BenchSettings' defaults, not cope verify's, and its help says so
    (issue 61): `cope verify --llama-bench --help` is the help, not a missing PATH."""
    with pytest.raises(SystemExit) as done:
        main(["verify", "--llama-bench", "--help"])
    assert done.value.code == 0
    text = _one_line(capsys.readouterr().out)
    b, v = lv.BenchSettings(), VerifySettings()
    assert (b.tolerance, b.max_rounds) != (v.tolerance, v.max_rounds)   # the point of the fix
    assert f"percent of the leader (default {100 * v.tolerance:g}; with --llama-bench " \
           f"{100 * b.tolerance:g})" in text
    assert f"with --llama-bench {b.max_rounds})" in text
    assert f"--reps REPS llama-bench -r per measurement (default {b.repetitions})" in text
    assert f"--n-gen N_GEN llama-bench -n (default {b.n_gen})" in text


def test_a_parsed_llama_bench_race_takes_bench_settings_defaults():
    args = build_parser().parse_args(["verify", "--llama-bench", "X", "--model", "Y"])
    assert bench_settings(args) == lv.BenchSettings()
    given = build_parser().parse_args(
        ["verify", "--llama-bench", "X", "--model", "Y", "--tolerance", "5", "--reps", "2",
         "--n-gen", "8", "--min-rounds", "3", "--max-rounds", "4", "--draws", "10", "--seed",
         "7"])
    assert bench_settings(given) == lv.BenchSettings(
        repetitions=2, n_gen=8, tolerance=0.05, min_rounds=3, max_rounds=4, draws=10, seed=7)
    # the executor's race keeps its own record's defaults from the same parser
    executor = build_parser().parse_args(["verify", "--trace", "t", "--profile", "p", "-K", "4"])
    assert verify_settings(executor) == VerifySettings()
    assert verify_settings(given).tolerance == 0.05


def test_llama_bench_without_its_path_is_one_line(capsys):
    assert main(["verify", "--llama-bench", "--model", "m.gguf"]) == 2
    assert capsys.readouterr().err.strip() == \
        "cope: error: field '--llama-bench': needs the llama-bench to run: --llama-bench PATH"


def _live_bench() -> tuple[Path, list[str]]:
    """The CPU build's llama-bench, else the Vulkan build's with no device visible (the same
    ggml CPU backend, built with the same flags)."""
    if (LLAMA / "bin" / "llama-bench").is_file():
        return LLAMA / "bin" / "llama-bench", []
    if (LLAMA_VULKAN / "bin" / "llama-bench").is_file():
        return LLAMA_VULKAN / "bin" / "llama-bench", ["--env", "GGML_VK_VISIBLE_DEVICES="]
    missing_runtime("llama.cpp b11434's llama-bench is not built")


def test_verify_llama_bench_end_to_end(tiny, tmp_path, capsys):
    exe, env = _live_bench()
    out = tmp_path / "verify.json"
    args = ["verify", "--llama-bench", str(exe), *env, "--model", str(tiny), "--cpu",
            "ryzen-9-7950x", "--threads", "2", "--reps", "2", "--n-gen", "8",
            "--max-rounds", "3", "--no-progress", "-o", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["schema"] == "cope.verify-llamabench/1" and r["rounds"] >= 2
    assert r["stop"] in ("one left", "equivalent", "max rounds")
    names = {c["name"] for c in r["contenders"]}
    assert r["verified"]["name"] in names and f"VERIFIED {r['verified']['name']}" in text
    runs = [x for x in r["runs"] if x[0] == r["verified"]["name"]]
    by_round: dict[int, list[float]] = {}
    for _, rnd, _, us in runs:
        by_round.setdefault(rnd, []).append(us)
    mean_us = np.mean([np.median(v) for v in by_round.values()])
    assert r["verified"]["measured_ts"] == pytest.approx(1e6 / mean_us)
    assert os.path.exists(str(out) + ".state.json")
    # resumed: the finished state is read back, nothing is measured again
    before = out.read_text()
    assert main([*args, "--force"]) == 0
    assert json.loads(out.read_text())["runs"] == json.loads(before)["runs"]
    capsys.readouterr()
    assert main(["export", "--from-verify", str(out), "--format", "llama.cpp"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == r["verified"]["command"]


def test_plan_with_a_gpu_races_fitting_placements_and_fit(tiny):
    """On a 24 GiB card every --n-cpu-moe placement of the tiny file fits: the contenders are
    the fastest predicted (fewest CPU layers first) within the model's error, each priced by
    placement_tpot; -fitt enters when the build lists it, the cache is skipped with why."""
    from cope_core.llamacpp import placement_tpot
    from cope_core.profile.analytic import analytic_profile
    machine = compose_machine(gpu="rtx3090", cpu="ryzen-9-7950x", threads=4)
    build = dataclasses.replace(BUILD, flags=frozenset({"-t", "-ncmoe", "-fitt"}))
    p = lv.plan_bench_race(tiny, machine, build, lv.BenchSettings())
    g = get_model_of(tiny)
    assert [c.n_cpu_moe for c in p.curve] == [float(n) for n in range(g.n_layers + 1)]
    prof = analytic_profile(g, machine.spec, cpu_threads=[4], gpu_shares=[100.0])
    want = placement_tpot(prof, g, list(range(g.n_layers + 1)), 16.5, cpu_threads=4)
    assert [c.predicted_us for c in p.curve] == pytest.approx(list(want))
    names = [c.name for c in p.contenders]
    assert names[0] == "--n-cpu-moe 0" or names[0].startswith("--fit")
    fit = [c for c in p.contenders if c.name.startswith("--fit")]
    assert fit and fit[0].args == ("-fitt", "1024", "-t", "4") and fit[0].n_cpu_moe == 0.0
    assert [n for n, _ in p.skipped] == ["llama.cpp's MoE cache"]
    no_fit = lv.plan_bench_race(tiny, machine, BUILD, lv.BenchSettings())
    assert ("--fit (llama.cpp's default)", "this llama-bench has no -fitt") in no_fit.skipped


def test_refit_after_a_gpu_race_holds_the_verified_one_out(tiny, tmp_path, monkeypatch):
    machine = compose_machine(gpu="rtx3090", cpu="ryzen-9-7950x", threads=4)
    build = dataclasses.replace(BUILD, flags=frozenset({"-t", "-fitt"}))
    p = lv.plan_bench_race(tiny, machine, build, lv.BenchSettings(max_contenders=3))
    assert len(p.contenders) == 3           # two placements within the error, and fit
    # measured: each contender 1.5 x slower than predicted but the last, 2 x
    ts = {c.name: 1e6 / c.predicted_us / (2.0 if i == 2 else 1.5)
          for i, c in enumerate(p.contenders)}
    monkeypatch.setattr(lv, "run_bench", lambda b, m, args, **kw: _row(
        [ts[next(c.name for c in p.contenders if c.args == args)]] * 3))
    st = lv.run_bench_race(p, build, tiny, lv.BenchSettings(max_rounds=2, max_contenders=3),
                 tmp_path / "s.json")
    r = bench_race_record(p, st, build, machine, lv.BenchSettings(max_contenders=3), str(tiny))
    f = r["refit"]
    held = [x for x in f["points"] if x["held_out"]]
    assert [x["label"] for x in held] == [r["verified"]["name"]]
    assert [k["name"] for k in f["knobs"]] == ["host expert throughput",
                                               "GPU-side base per token"][:len(f["points"]) - 1]
    fitted = [x for x in f["points"] if not x["held_out"]]
    assert max(abs(x["error_after_pct"]) for x in fitted) < max(
        abs(x["error_before_pct"]) for x in fitted)
    assert len(f["repredicted"]) == len(p.curve)
