"""``cope advise`` (issue 40): the command line and tokens per second for a model on a machine
composed from parts, runtime by runtime; the VRAM default by hand; CPU-only pricing; bad input
in one line."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cope_core import parts
from cope_core.cli.advise_cmd import cmd_advise, quant_of
from cope_core.cli.main import build_parser, main
from cope_core.estimate.cpu_only import cpu_only_price
from cope_core.export.advising import RUNTIMES, advise
from cope_core.geometry import GIB, MIB
from cope_core.machine import compose_machine
from cope_core.models import resolve_model

GGUF = "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"
MACHINE = ["--gpu", "rtx3090", "--cpu", "ryzen-7-5700x", "--memory", "ddr4-3200x2",
           "--pcie", "4x16"]
#: rank llama.cpp's answer by decode alone (the tests of the decode rule; the request's below)
DECODE = ["--prompt-tokens", "0"]


def _strict(text: str):
    def bad(c):
        raise ValueError(f"not strict JSON: {c}")
    return json.loads(text, parse_constant=bad)


def test_end_to_end_prints_a_llamacpp_command_and_tokens_per_second(capsys):
    assert main(["advise", "--model", GGUF, *MACHINE, "--runtime", "llama.cpp", *DECODE]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    i = lines.index("llama.cpp")
    # the whole model fits: fit places it as the best placement does, so the smallest change
    # is none and the default's command leads
    assert lines[i + 1] == "  llama-server -m MODEL.gguf -c 4096"
    m = [ln for ln in lines if ln.startswith("  predicted ")][0]
    tps, ms = float(m.split()[1]), float(m.split("(")[1].split()[0])
    assert m.split()[2] == "tokens/s" and tps == pytest.approx(1000 / ms, rel=2e-3)
    # 24 GiB less llama.cpp's 1 GiB --fit margin; Qwen3-30B-A3B Q4_K_M fits whole
    assert "VRAM budget 23.00 GiB" in out and "K = 128 of 128" in out
    assert "SYNTHETIC" in out and "ANALYTIC" in out
    assert "Policy Matrix winner" in out
    # the whole model fits: --fit places it as the command does, at the same speed
    assert "x1.00 over the default" in out and "the default needs no flags" in out


def test_json_has_every_runtime_with_its_speed_and_inputs(capsys):
    g = ["--model", "glm-4.5-air", "--quant", "Q4_K_M", "--gpu", "rtx4060ti-16gb", "--cpu",
         "ryzen-7-5700x", "--memory", "ddr4-3200x2", "--runtime", "exllamav3", "--json", *DECODE]
    assert main(["advise", *g]) == 0
    doc = _strict(capsys.readouterr().out)
    (r,) = doc["runtimes"]
    for key in ("runtime", "command", "tokens_per_s", "tokens_per_s_interval",
                "default_tokens_per_s", "gain_over_default", "experts_per_layer", "threads",
                "context", "vram_gib"):
        assert key in r
    assert r["runtime"] == "exllamav3" and "-mcs" in r["command"]
    lo, hi = r["tokens_per_s_interval"]
    assert lo <= r["tokens_per_s"] <= hi
    assert r["tokens_per_s"] == pytest.approx(1000 / r["ms_per_token"])
    # GLM-4.5-Air Q4_K_M does not fit 15 GiB: exllamav3's default (every expert on the GPU)
    # does not load, so there is no default speed and no gain
    assert r["default_tokens_per_s"] is None and r["gain_over_default"] is None
    assert (r["threads"], r["context"], r["vram_gib"]) == (8, 4096, 15.0)
    assert 0 < r["experts_per_layer"] < 128
    assert doc["inputs"]["machine"]["gpu"] == "rtx4060ti-16gb"
    assert doc["policy_matrix_winner"]["candidate"]


def test_vram_default_by_hand():
    """A 12 GiB card: 12 - 1 GiB (llama.cpp's --fit margin) = 11 GiB; K is what is left after
    the non-expert weights, the KV cache and 0.5 GiB of workspace, in whole experts per layer."""
    g = resolve_model(GGUF, None)
    m = compose_machine(gpu="rtx3060-12gb", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    a = advise(g, m, runtimes=("exllamav3",))
    assert a.vram_gib == 11.0
    for ctx in (4096, 32768):
        left = 11 * GIB - g.non_expert_bytes - g.kv_cache_bytes(ctx) - 512 * MIB
        k = min(g.n_experts, math.floor(left / g.per_k_bytes))
        got = advise(g, m, runtimes=("exllamav3",), context=ctx)
        assert got.experts_per_layer == k and got.policy.experts_per_layer == k
    assert advise(g, m, runtimes=("exllamav3",), context=32768).experts_per_layer < \
        a.experts_per_layer


def test_answers_come_in_the_runtimes_order():
    g = resolve_model("qwen3-30b-a3b", "Q4_K_M")
    m = compose_machine(gpu="rtx3060-12gb", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    a = advise(g, m, runtimes=("vllm", "exllamav3", "ik_llama.cpp"))
    assert [r.runtime for r in a.answers] == [r for r in RUNTIMES
                                              if r in ("vllm", "exllamav3", "ik_llama.cpp")]
    vllm = a.answers[-1]
    assert vllm.command.startswith("vllm serve MODEL --offload-backend uva")
    assert vllm.speed is None          # outside the Policy Matrix: not predicted


def test_output_dir_writes_the_files_the_commands_read(tmp_path, capsys):
    assert main(["advise", "--model", "glm-4.5-air", "--quant", "Q4_K_M", "--gpu",
                 "rtx4060ti-16gb", "--cpu", "ryzen-7-5700x", "--runtime", "exllamav3",
                 "--output-dir", str(tmp_path / "out")]) == 0
    stats = tmp_path / "out" / "cope-exl3-stats.json"
    assert json.loads(stats.read_text()) and f"wrote {stats}" in capsys.readouterr().out


def test_cpu_only_machine_answers_on_the_cpu(capsys):
    assert main(["advise", "--model", GGUF, "--gpu", "none", "--cpu", "ryzen-7-5700x",
                 "--memory", "ddr4-3200x2", "--json"]) == 0
    doc = _strict(capsys.readouterr().out)
    by = {r["runtime"]: r for r in doc["runtimes"]}
    assert by["llama.cpp"]["command"] == "llama-server -m MODEL.gguf -ngl 0 -t 8"
    assert by["llama.cpp"]["gain_over_default"] == 1.0
    assert by["vllm"]["command"] is None and by["vllm"]["tokens_per_s"] is None
    assert doc["policy_matrix_winner"] is None and doc["inputs"]["machine"]["cpu_only"]
    assert "every weight and operation on the CPU" in doc["inputs"]["costs"]


def test_cpu_only_price_is_bounded_by_the_bytes_it_streams():
    """Every decode step reads the active weights once: no faster than the host's achieved
    bandwidth allows; and faster with more bandwidth, and with more threads."""
    g = resolve_model(GGUF, None)
    cpu, mem = parts.cpu_part("ryzen-7-5700x"), parts.memory_part("ddr4-3200x2")
    p = cpu_only_price(g, cpu, mem, 8, 1024.0, draws=0)
    active = g.n_layers * (g.top_k * g.expert_bytes + g.moe_block_params
                           * g.weight_bytes_per_param)
    assert p.tpot_us >= active / (mem.bandwidth * 0.8) * 1e6
    assert p.tpot_ci_us is None
    fast = cpu_only_price(g, cpu, parts.memory_part("ddr4-3200x4"), 8, 1024.0, draws=0)
    few = cpu_only_price(g, cpu, mem, 2, 1024.0, draws=0)
    assert fast.tpot_us < p.tpot_us < few.tpot_us
    drawn = cpu_only_price(g, cpu, mem, 8, 1024.0, draws=200, seed=1)
    assert drawn.tpot_ci_us[0] < p.tpot_us < drawn.tpot_ci_us[1]
    assert np.isclose(drawn.tpot_us, p.tpot_us)


def test_this_machine(capsys):
    assert main(["advise", "--model", GGUF, "--gpu", "this", "--cpu", "this", "--memory",
                 "this", "--probe-seconds", "0.2", "--runtime", "llama.cpp"]) == 0
    out = capsys.readouterr().out
    assert "detected" in out and "measured" in out and "tokens/s" in out


@pytest.mark.parametrize("argv, field", [
    (["--gpu", "rtx9999"], "gpu"),
    (["--ctx", "0"], "--ctx"),
    (["--calibration", "x.parquet"], "--calibration"),
    (["--gpu", "none", "--vram-gib", "8"], "--vram-gib"),
    (["--vram-gib", "1"], "vram"),
    (["--runtime", "tgi"], "--runtime"),
])
def test_bad_input_is_one_line_exit_2(argv, field, capsys):
    base = {"--gpu": "rtx3090", "--cpu": "ryzen-7-5700x"}
    args = ["advise", "--model", GGUF]
    for flag, value in base.items():
        if flag not in argv:
            args += [flag, value]
    assert main(args + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cope: error:") and field in err


def test_llamacpp_answer_is_the_export_and_its_default_is_fit():
    """The llama.cpp answer pastes the export's first command, predicts what that command runs
    (the record's best configuration) and divides by --fit's placement priced under the same
    draws."""
    from cope_core.export import render
    from cope_core.llamacpp.answer.baseline import baseline_of
    g = resolve_model(GGUF, None)
    m = compose_machine(gpu="rtx3060-12gb", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    a = advise(g, m, runtimes=("llama.cpp",))
    (r,) = a.answers
    text = render(a.policy, "llama.cpp").text
    assert r.command == next(ln for ln in text.splitlines() if not ln.startswith("#"))
    rec = a.policy.llamacpp_cache
    base = baseline_of(rec)
    assert r.speed.tpot_us == rec.versus[0].tpot_us and r.runs == rec.best[0].candidate
    assert r.default.tpot_us == base.tpot_us
    assert r.gain_over_default == pytest.approx(base.tpot_us / rec.versus[0].tpot_us)
    assert a.baseline.tpot_us == base.tpot_us


def test_sglang_kt_text_without_its_file_is_the_same_text():
    """advise renders SGLang-KT without its torch tensor unless asked to write it: the text is
    the same, and the tensor's count of GPU experts is the fill's."""
    from cope_core.export import render
    g = resolve_model("glm-4.5-air", "Q4_K_M")
    m = compose_machine(gpu="rtx4060ti-16gb", cpu="ryzen-7-5700x", memory="ddr4-3200x2")
    pol = advise(g, m, runtimes=("sglang-kt",)).policy
    full, bare = render(pol, "sglang-kt"), render(pol, "sglang-kt", with_files=False)
    assert bare.text == full.text and bare.files == () and len(full.files) == 1
    n = sum(len(row) for row in pol.resident_experts)
    assert f"1.0 at the {n} GPU experts" in full.text


def test_a_given_trace_is_priced_and_named(capsys):
    ex = "data/examples/qwen3-30b-a3b-"
    assert main(["advise", "--model", GGUF, *MACHINE, "--runtime", "exllamav3", "--trace",
                 ex + "trace.parquet", "--calibration", ex + "calibration.parquet",
                 "--json"]) == 0
    doc = _strict(capsys.readouterr().out)
    assert doc["inputs"]["routing"] == (f"SYNTHETIC trace {ex}trace.parquet, 8 prompts, "
                                        "1024 tokens")
    assert doc["runtimes"][0]["tokens_per_s"] > 0


def test_gpt_oss_120b_on_a_16_gb_card(capsys):
    """A catalog model priced as a llama-quantize preset: the llama.cpp command puts host layers
    on the CPU (the model is far larger than the card) and says tokens/s."""
    assert main(["advise", "--model", "gpt-oss-120b", "--quant", "MXFP4_MOE", "--gpu",
                 "rtx5060ti-16gb", "--cpu", "ryzen-7-5700x", "--memory", "ddr4-3200x2",
                 "--runtime", "llama.cpp", *DECODE]) == 0
    out = capsys.readouterr().out
    cmd = out.splitlines()[out.splitlines().index("llama.cpp") + 1]
    assert cmd.startswith("  llama-server -m MODEL.gguf -c 4096 -ngl 99 -fit off -t 8 "
                          "--n-cpu-moe ")
    assert "VRAM budget 15.00 GiB" in out and " tokens/s [" in out


def test_speed_words_by_hand():
    from cope_core.estimate.speed import rate, speed, tokens_per_s, tokens_per_s_interval
    assert tokens_per_s(8241.0) == 1e6 / 8241.0 and tokens_per_s(0.0) == math.inf
    assert speed(8241.0) == "8.241 ms/token · 121.3 tokens/s"
    assert speed(8241.0, (7100.0, 9500.0)) == \
        "8.241 ms/token [7.100, 9.500] · 121.3 tokens/s [105.3, 140.8]"
    assert rate(8241.0, (7100.0, 9500.0)) == "121.3 tokens/s [105.3, 140.8] (8.241 ms/token)"
    assert rate(8241.0) == "121.3 tokens/s (8.241 ms/token)"
    assert tokens_per_s_interval(7100.0, 9500.0) == "[105.3, 140.8] tokens/s"


def test_a_catalog_name_without_quant_means_the_published_gguf(capsys):
    """gpt-oss ships MXFP4 experts in every published GGUF; elsewhere Q4_K_M. Without --quant the
    answer prices that file, says so on its first line, and equals the same with --quant."""
    mine = ["--gpu", "rtx3090", "--cpu", "ryzen-7-5700x", "--memory", "ddr4-3200x2",
            "--runtime", "exllamav3"]
    for name, preset in (("gpt-oss-120b", "MXFP4_MOE"), ("glm-4.5-air", "Q4_K_M")):
        assert main(["advise", "--model", name, *mine]) == 0
        first, *rest = capsys.readouterr().out.splitlines()
        assert first.startswith(f"{name} ({preset}; no --quant: the preset most published GGUFs")
        assert main(["advise", "--model", name, "--quant", preset, *mine]) == 0
        first_q, *rest_q = capsys.readouterr().out.splitlines()
        assert first_q.startswith(f"{name} ({preset}):") and rest_q == rest
    assert main(["advise", "--model", "gpt-oss-120b", *mine, "--json"]) == 0
    doc = _strict(capsys.readouterr().out)
    assert doc["inputs"]["weights"] == "MXFP4_MOE"
    assert doc["inputs"]["weights_source"].startswith("no --quant")


def test_the_published_preset_is_not_written_into_the_parsed_args(capsys):
    """cope advise prices a catalog name as its published preset without writing it back into
    ``args.quant`` (issue 61): the namespace stays as parsed, and a second run of it says the
    same first line."""
    args = build_parser().parse_args(["advise", "--model", "glm-4.5-air", "--gpu", "rtx3090",
                                      "--cpu", "ryzen-7-5700x", "--runtime", "exllamav3"])
    assert quant_of(args) == ("Q4_K_M", "no --quant: the preset most published GGUFs of it "
                                        "have; --quant to price another")
    assert cmd_advise(args) == 0
    assert args.quant is None
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("glm-4.5-air (Q4_K_M; no --quant")
    assert cmd_advise(args) == 0 and capsys.readouterr().out.splitlines()[0] == first
    given = build_parser().parse_args(["advise", "--model", GGUF, "--gpu", "rtx3090", "--cpu",
                                       "ryzen-7-5700x"])
    assert quant_of(given) == (None, "as stored in the file")


def test_a_vram_budget_above_the_card_is_refused(capsys):
    assert main(["advise", "--model", GGUF, "--gpu", "rtx3090", "--cpu", "ryzen-7-5700x",
                 "--vram-gib", "400"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "cope: error: field '--vram-gib': 400 GiB is more than the card's 24.00 GiB"


MIXTRAL_3090 = ["--model", "mixtral-8x7b", "--gpu", "rtx3090", "--cpu", "ryzen-7-5700x",
                "--memory", "ddr4-3200x2", "--runtime", "llama.cpp"]


def test_the_first_line_is_the_recommendation_when_the_gain_is_not_sure(capsys):
    """Mixtral on an RTX 3090: the MoE-cache configuration is faster than --fit's placement in
    fewer than 95 % of the draws, so the first command is the default's and the faster one
    follows as a risk, with the plain --n-cpu-moe placement beside it."""
    assert main(["advise", *MIXTRAL_3090, "--json", *DECODE]) == 0
    (r,) = _strict(capsys.readouterr().out)["runtimes"]
    assert r["recommended"] == r["command"] == "llama-server -m MODEL.gguf -c 4096"
    kinds = {a["kind"]: a for a in r["alternatives"]}
    risk, plain = kinds["risk"], kinds.get("plain", kinds.get("nearest"))
    # every alternative is typed; the Policy Matrix's nearest translation is offered too
    assert set(kinds) <= {"risk", "plain", "newer", "nearest", "nearest_ot"}
    assert risk["label"] == "if you accept the risk" and "--moe-cache-mib" in risk["command"]
    share = float(risk["note"].split("faster in ")[1].split(" %")[0])
    assert share < 95 and "needs llama.cpp b12191 or newer" in risk["note"]
    assert r["tokens_per_s"] == pytest.approx(r["default_tokens_per_s"])
    assert risk["tokens_per_s"] > r["tokens_per_s"]
    assert plain["label"].startswith(("plain placement", "the Policy Matrix's layer partition"))
    assert "--n-cpu-moe" in plain["command"] and "--moe-cache" not in plain["command"]
    assert plain["tokens_per_s"] > 0
    assert not any("needs llama.cpp" in n for n in r["notes"])
    assert main(["advise", *MIXTRAL_3090, *DECODE]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("llama.cpp")
    assert lines[at + 1] == "  llama-server -m MODEL.gguf -c 4096"
    assert any(x.startswith("  if you accept the risk: " + risk["command"]) for x in lines)


def test_a_sure_cache_configuration_leads_with_the_plain_placement_beside_it(capsys):
    g = ["--model", "glm-4.5-air", "--quant", "Q4_K_M", "--gpu", "rtx4060ti-16gb", "--cpu",
         "ryzen-7-5700x", "--memory", "ddr4-3200x2", "--runtime", "llama.cpp", "--json",
         *DECODE]
    assert main(["advise", *g]) == 0
    (r,) = _strict(capsys.readouterr().out)["runtimes"]
    assert "--moe-cache-mib" in r["recommended"] and r["recommended"] == r["command"]
    kinds = [a["kind"] for a in r["alternatives"]]
    assert "risk" not in kinds and "slower" not in kinds        # sure: nothing at a risk
    plain = next(a for a in r["alternatives"] if a["kind"] in ("plain", "nearest"))
    assert plain["label"].startswith(("plain placement", "the Policy Matrix's layer partition"))
    assert "--moe-cache" not in plain["command"]
