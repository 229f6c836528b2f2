"""llama.cpp's default (--fit) as the baseline of every llama.cpp answer (issue 39): fit's
placement priced under the same draws as the best configuration, the gain and the verdict; the
search's budget as llama.cpp counts it; `cope predict` and `cope export --format llama.cpp`
leading with the default for the shipped Q4_K_M header and two catalog models at three budgets."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.geometry import GIB
from cope_core.llamacpp import search_cache
from cope_core.llamacpp.answer.baseline import FitBaseline, baseline_of, short_args
from cope_core.llamacpp.answer.cache_record import CacheRecord, expert_budget, llamacpp_record
from cope_core.llamacpp.answer.rule import KEEP_LEVEL, sure_enough
from cope_core.llamacpp.answer.settings import LlamaSettings, llama_settings, n_cpu_moe_memory
from cope_core.llamacpp.placement.command import ALL_EXPERTS
from cope_core.llamacpp.placement.fit import FIT_MARGIN, FIT_NAME, fit_default
from cope_core.llamacpp.placement.vram import (
    Placement,
    device_memory,
    llama_model_of,
    read_llama_model,
)
from cope_core.models import resolve_model

HEADER = "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"
EX = "data/examples/"
#: (what --model says, example stem, three budgets in GiB)
CASES = [(HEADER, "gguf-qwen3-30b-a3b-q4_k_m", "rtx4090", (8, 12, 20)),
         ("qwen3.5-35b-a3b", "qwen3.5-35b-a3b", "rtx5090", (16, 24, 32)),
         ("olmoe-1b-7b", "olmoe-1b-7b", "rtx4090", (4, 8, 16))]


def _files(stem: str, gpu: str) -> list[str]:
    return ["--trace", f"{EX}{stem}-trace.parquet", "--calibration",
            f"{EX}{stem}-calibration.parquet", "--profile", f"{EX}{stem}-{gpu}-analytic.parquet"]


def _run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _fit_baseline(model, vram_gib: float, trace, profile, calibration, draws: int):
    """llama.cpp's default at a budget, priced against the best configuration, as
    ``build_policy`` records it (the record's search, then its baseline)."""
    g = trace.model
    settings = llama_settings(model)
    K = g.experts_per_layer_for_vram(vram_gib * GIB)
    op = profile.resolve(None, None, model=g)
    rec = llamacpp_record(trace, profile, calibration, experts_per_layer=K, vram_gib=vram_gib,
                          matrix_winner="layer_partition", cpu_threads=op.cpu_threads,
                          gpu_share=op.gpu_share, draws=draws, llama=settings)
    return baseline_of(rec)


def _table(model: str):
    return read_llama_model(model) if model.endswith(".gguf") else \
        llama_model_of(resolve_model(model))


def test_catalog_table_matches_the_files_own():
    """The table made from a geometry counts what the GGUF's own table counts on the GPU."""
    real = read_llama_model(HEADER)
    made = llama_model_of(resolve_model(HEADER))
    assert sum(b for _, b in made.tensors) == pytest.approx(sum(b for _, b in real.tensors),
                                                           rel=1e-6)
    for p in (Placement(), Placement(-1, (ALL_EXPERTS,)), Placement(20)):
        a, b = device_memory(real, p, 4096), device_memory(made, p, 4096)
        assert a.context == b.context and a.compute == b.compute
        assert a.model == pytest.approx(b.model, rel=2e-3)
    assert dict(made.tensors)["token_embd.weight"] == dict(real.tensors)["token_embd.weight"]


def test_budget_counts_as_llama_cpp_does():
    """The routed experts get what is left after the non-expert weights but the embedding, the
    KV cache at -c and -ctk/-ctv, and the compute buffer (by hand from the table)."""
    g = resolve_model(HEADER)
    m = read_llama_model(HEADER)
    rest = sum((n + 255) // 256 * 256 for name, n in m.tensors
               if "_exps" not in name and name != "token_embd.weight")
    kv = 48 * 4096 * 2 * 512 * 2                # 48 blocks x 4096 cells x (K + V) 512 f16
    fixed = device_memory(m, Placement(-1, (ALL_EXPERTS,)), 4096)
    assert fixed.model == rest and fixed.context == kv
    s = LlamaSettings(m)
    assert expert_budget(g, 0, 12.0, s) == 12 * GIB - rest - kv - fixed.compute
    q8 = LlamaSettings(m, n_ctx=8192, type_k="q8_0", type_v="q8_0")
    kv8 = 48 * 8192 * 2 * (512 // 32 * 34)
    assert expert_budget(g, 0, 12.0, q8) == 12 * GIB - rest - kv8 - device_memory(
        m, Placement(-1, (ALL_EXPERTS,)), 8192, "q8_0", "q8_0").compute


def test_settings_refuse_bad_input():
    with pytest.raises(CopeInputError, match="--ctx"):
        llama_settings(None, n_ctx=0)
    with pytest.raises(CopeInputError, match="--cache-type-k"):
        llama_settings(None, type_k="q3_zz")


def test_short_args_cuts_the_override_list():
    args = '-c 4096 -ngl 49 -ot "a=CPU,b=CPU,c=CPU"'
    assert short_args(args) == '-c 4096 -ngl 49 -ot "a=CPU,b=CPU,…" (3 patterns)'
    assert short_args('-c 4096 -ngl -1') == '-c 4096 -ngl -1'


def _baseline(tpot, best, share) -> FitBaseline:
    fd = fit_default(read_llama_model(HEADER), 13 * GIB, n_ctx=4096)
    return FitBaseline(fd, tpot, None, "--n-cpu-moe 20", best, None, share)


def test_the_baseline_reports_facts_the_rule_decides():
    """FitBaseline says the gain and the share, never a verdict; the rule says whether the
    share is sure enough (the answer applies it: tests/test_llamacpp_answer.py)."""
    assert _baseline(10.0, 8.0, 0.99).gain_pct == pytest.approx(25.0)
    assert sure_enough(0.99) and not sure_enough(KEEP_LEVEL - 0.01)
    for share, words in ((0.949, "(faster in 94.9 % of draws)"), (0.5749, "(faster in 57 % of"),
                         (0.95, "(faster in 95 % of draws)")):
        head = _baseline(10.0, 8.0, share).lines()[0]
        assert words in head and "+25.0 %" in head
        assert "keep the default" not in head and "worth pasting" not in head
    assert "-fit off" in _baseline(10.0, 8.0, 0.5).lines()[1]
    assert not hasattr(_baseline(10.0, 8.0, 0.5), "keep_default")


def test_fit_is_priced_as_the_same_plain_placement():
    """At a budget where fit moves whole layers' experts, its TPOT is the search's plain
    --n-cpu-moe row with as many host layers (the profile prices every MoE layer alike), and
    the record reads back with fit's placement."""
    trace = parquet_io.read_trace(f"{EX}gguf-qwen3-30b-a3b-q4_k_m-trace.parquet")
    cal = parquet_io.read_trace(f"{EX}gguf-qwen3-30b-a3b-q4_k_m-calibration.parquet")
    prof = parquet_io.read_profile(f"{EX}gguf-qwen3-30b-a3b-q4_k_m-rtx4090-analytic.parquet")
    base = _fit_baseline(HEADER, 12.0, trace, prof, cal, draws=100)
    assert base is not None
    fd = base.default
    assert fd.args == fit_default(read_llama_model(HEADER), 12 * GIB + FIT_MARGIN,
                                  n_ctx=4096).args
    assert fd.host_layers == len(fd.host_blocks) == 17          # no partial layer here
    s = LlamaSettings(read_llama_model(HEADER))
    found = search_cache(trace, prof, expert_budget(trace.model, 0, 12.0, s))
    plain = found.frame[(found.frame["cache_mib"] == 0) & (found.frame["n_cpu"] == 17)]
    assert base.tpot_us == pytest.approx(float(plain["tpot_us"].iloc[0]), rel=1e-12)
    assert base.faster_share is not None and 0 <= base.faster_share <= 1
    lo, hi = base.tpot_ci_us
    assert lo <= base.tpot_us <= hi


def _check_answer(text: str, fd_args: str) -> tuple[float, float, float]:
    """The lead of a llama.cpp answer: fit's placement with tok/s, the best configuration's
    tok/s, the gain, and the verdict; returns (fit tok/s, best tok/s, gain %)."""
    m = re.search(r"llama\.cpp's default \(--fit, no placement flag\) places (.+?): "
                  r"([\d.]+) tok/s \[[\d.]+, [\d.]+\]; the best runnable configuration "
                  r"\((.+?)\) at ([\d.]+) tok/s \[[\d.]+, [\d.]+\], ([+-][\d.]+) % "
                  r"\(faster in ([\d.]+) % of draws\) \(decode at the trace's context\)",
                  text)
    assert m, text
    assert short_args(fd_args) in text and "-fit off switches --fit off" in text
    fit_ts, best_ts, gain = float(m.group(2)), float(m.group(4)), float(m.group(5))
    # the gain is of the unrounded speeds: within what rounding each printed number to 0.1 allows
    lowest = 100 * ((best_ts - 0.05) / (fit_ts + 0.05) - 1) - 0.05
    highest = 100 * ((best_ts + 0.05) / (fit_ts - 0.05) - 1) + 0.05
    assert lowest <= gain <= highest, (fit_ts, best_ts, gain)
    share = float(m.group(6))                  # shown below the level iff kept
    # the verdict is the answer's, in its own sentence before the command
    said = re.search(r"faster than the default in ([\d.]+) % of the paired draws"
                     r"(: not sure enough, keep the default|: keep the default)?", text,
                     re.IGNORECASE)              # a sentence's first letter before the command
    if said is None:                           # fit places it as the best does: no flags
        assert gain == 0.0 and "places the model the same way: the default needs no flags" \
            in text
    else:
        assert float(said.group(1)) == share
        assert (said.group(2) is not None) == (share < 100 * KEEP_LEVEL)
    return fit_ts, best_ts, gain


@pytest.mark.slow
@pytest.mark.parametrize("model,stem,gpu,budgets", CASES, ids=[c[1] for c in CASES])
def test_predict_and_export_lead_with_the_default(capsys, model, stem, gpu, budgets):
    """For three models at three budgets each, `cope predict` and `cope export --format
    llama.cpp` name fit's placement (as the port places it) with its tok/s and the gain of the
    best configuration over it, the same numbers in both."""
    m = _table(model)
    seen = set()
    for gib in budgets:
        fd = fit_default(m, int(gib * GIB) + FIT_MARGIN, n_ctx=4096)
        seen.add(fd.args)
        # decode alone (a request moves -c), the search in words (--explain)
        common = [*_files(stem, gpu), "--model", model, "--vram-gib", str(gib),
                  "--prompt-tokens", "0"]
        text = _run(capsys, "predict", *common, "--explain")
        out = _run(capsys, "export", *common, "--format", "llama.cpp")
        fit_ts, best_ts, gain = _check_answer(text, fd.args)
        assert _check_answer(out, fd.args) == (fit_ts, best_ts, gain)
        assert fd.describe() in text and fd.describe() in out
        rows = json.loads(_run(capsys, "predict", *common, "--json"))
        d = next(r["default_fit"] for r in rows if "default_fit" in r)
        assert d["default"]["args"] == fd.args
        assert d["tokens_per_s"] == pytest.approx(1e6 / d["tpot_us"])
        assert round(d["tokens_per_s"], 1) == fit_ts and round(d["gain_pct"], 1) == gain
        pol = json.loads(_run(capsys, "export", *common, "--format", "json"))
        rec = CacheRecord.from_dict(pol["llamacpp_cache"])
        assert rec is not None and rec.default_fit == fd
        assert any(v.name == FIT_NAME for v in rec.versus)
        assert baseline_of(rec).to_dict() == d
    assert len(seen) == 3                       # three different placements of fit's
    assert np.isfinite(gain)


# --- the RX 9070 XT case (issue 39): Qwen3.5-35B-A3B Q4_K_M on a 16 GiB card, llama-bench's
# tg128. llama-bench makes one context per test: pp512 has n_ctx = 512, tg128 n_ctx = 0 + 128
# (tools/llama-bench/llama-bench.cpp l. 1308, 1355-1400); llama.cpp caps the batch, and so the
# graph it reserves the compute buffer for, at that context: 128 tokens (llama-context.cpp
# l. 248-250, 631) in 256 padded cells --------------------------------------------------------
RX_CTX = 128
#: the largest routed-expert tensor in host memory: block 0's ffn_down_exps, Q6_K (use_more_bits)
RX_DOWN_Q6K = 256 * 2048 * 512 * 210 // 256


def _rx_need(n_cpu_moe: int, n_ctx: int = RX_CTX) -> int:
    """By hand from the table: every tensor but the token embedding and the routed experts of
    blocks 0 .. n-1, padded to 256 bytes; K and V (2 heads of 256, f16) of the 10 full-attention
    blocks for the padded cells, and the 30 Gated DeltaNet blocks' F32 states (conv 3 x 8192,
    delta rule 32 x 128 x 128); the compute buffer of t = min(512, n_ctx) tokens: 32 bytes a token
    of positions and indices, the cells x t F16 mask, and the larger of the logits with two F32
    hidden states and, with experts in host memory, the GPU's copy of the largest host expert
    tensor with two gate outputs (8 x 512) and four hidden states."""
    g = resolve_model("qwen3.5-35b-a3b", "Q4_K_M")
    m = llama_model_of(g)
    host = {f"blk.{b}.ffn_{p}_exps.weight" for b in range(n_cpu_moe)
            for p in ("gate", "up", "down")} | {"token_embd.weight"}
    weights = sum((n + 255) // 256 * 256 for name, n in m.tensors if name not in host)
    cells, t = (n_ctx + 255) // 256 * 256, min(512, n_ctx)
    kv = 10 * cells * 2 * (2 * 256) * 2 + 30 * 4 * (3 * 8192 + 32 * 128 * 128)
    hidden, gate = 4 * t * 2048, 4 * t * 8 * 512
    peak = max(4 * t * 248320 + 2 * hidden, RX_DOWN_Q6K + 2 * gate + 4 * hidden if n_cpu_moe else 0)
    return weights + kv + 32 * t + 2 * cells * t + peak


def test_rx9070xt_all_experts_on_the_gpu_is_refused_with_how_much_it_is_over(capsys):
    over = (_rx_need(0) - 16 * GIB) / GIB
    assert over > 3.5
    with pytest.raises(CopeInputError, match=rf"--n-cpu-moe 0 does not fit 16 GiB: .* over "
                                             rf"by {over:.2f} GiB"):
        n_cpu_moe_memory(resolve_model("qwen3.5-35b-a3b", "Q4_K_M"), 0, 16.0,
                         llama_settings(None, n_ctx=RX_CTX))
    assert main(["vram", "--model", "qwen3.5-35b-a3b", "--quant", "Q4_K_M", "--gib", "16",
                 "--n-cpu-moe", "0", "--ctx", str(RX_CTX)]) == 2
    assert f"over by {over:.2f} GiB" in capsys.readouterr().err


@pytest.mark.parametrize("n_ctx,first", [(RX_CTX, 8), (512, 9)])
def test_a_placement_that_fits_is_never_refused(n_ctx, first):
    """Every --n-cpu-moe whose count is within the budget passes, with the hand-worked count;
    fewer host blocks need more memory, so the ones that fit are those from some N on: 8 for
    tg128's context, 9 for pp512's (its 512-token logits)."""
    g = resolve_model("qwen3.5-35b-a3b", "Q4_K_M")
    s = llama_settings(None, n_ctx=n_ctx)
    fits = []
    for n in range(0, 41):
        need = _rx_need(n, n_ctx)
        if need <= 16 * GIB:
            assert n_cpu_moe_memory(g, n, 16.0, s).total == need
            fits.append(n)
        else:
            with pytest.raises(CopeInputError, match="over by"):
                n_cpu_moe_memory(g, n, 16.0, s)
    assert fits == list(range(fits[0], 41)) and fits[0] == first


def test_rx9070xt_n_cpu_moe_8_fits():
    """issue 39: --n-cpu-moe 8 measured at 44.1 tok/s on an RX 9070 XT 16 GB (llama-bench tg128)
    fits as llama.cpp counts it: the embedding on the host, the file's types as llama-quantize's
    Q4_K_M mix gives them, the KV cache only in the full-attention blocks, and tg128's own
    context (by hand: _rx_need)."""
    got = n_cpu_moe_memory(resolve_model("qwen3.5-35b-a3b", "Q4_K_M"), 8, 16.0,
                           llama_settings(None, n_ctx=RX_CTX))
    assert got.total == _rx_need(8) <= 16 * GIB


def test_a_partial_layer_is_priced_by_its_share_of_host_experts():
    """OLMoE at 8 GiB: fit leaves blocks 9-15's experts and block 8's ffn_down in host memory:
    7 + 1/3 layers, priced between the plain placements at 7 and 8 host layers, linearly."""
    stem = "olmoe-1b-7b"
    trace = parquet_io.read_trace(f"{EX}{stem}-trace.parquet")
    cal = parquet_io.read_trace(f"{EX}{stem}-calibration.parquet")
    prof = parquet_io.read_profile(f"{EX}{stem}-rtx4090-analytic.parquet")
    base = _fit_baseline(None, 8.0, trace, prof, cal, draws=0)
    fd = base.default
    assert fd.host_blocks == tuple(range(9, 16))
    assert fd.args.split('-ot "')[1].startswith(r"blk\.8\.ffn_down.*=CPU,")
    assert fd.host_layers == pytest.approx(7 + 1 / 3)
    assert "0.33 of one more layer's experts" in fd.describe()
    # the plain placements at 7 and 8 host layers, whatever they need (no cache)
    found = search_cache(trace, prof, 1e12, n_cpu=[7, 8], cache_mib=[])
    plain = found.frame.set_index("n_cpu")["tpot_us"]
    assert base.tpot_us == pytest.approx(plain[7] + (plain[8] - plain[7]) / 3, rel=1e-12)
    assert base.tpot_ci_us is None and base.faster_share is None      # no draws


def test_host_layers_count_the_experts_fit_leaves_on_the_host():
    """Over budgets from 2 to 16 GiB, fit's host layers times a layer's expert bytes are what its
    placement takes off the GPU's model buffer (OLMoE BF16: projections of equal bytes, so a
    partial layer is 1/3 or 2/3), and never a pattern for the output's index counted."""
    m = llama_model_of(resolve_model("olmoe-1b-7b"))
    layer = 3 * dict(m.tensors)["blk.0.ffn_gate_exps.weight"]
    full = device_memory(m, Placement(), 4096).model
    seen = set()
    for gib in np.arange(2.0, 16.5, 0.5):
        fd = fit_default(m, int(gib * GIB) + FIT_MARGIN, n_ctx=4096)
        if not fd.priced:
            continue
        part = fd.host_layers - len(fd.host_blocks)
        assert min(abs(part - x) for x in (0, 1 / 3, 2 / 3)) < 1e-12
        seen.add(round(3 * part))
        p = Placement(-1, tuple(t.split("=")[0] for t in fd.args.split('-ot "')[1].rstrip('"')
                                .split(","))) if "-ot" in fd.args else Placement()
        on = device_memory(m, p, 4096).model
        shexp = sum(n for name, n in m.tensors if "ffn_" in name and "_exps" not in name
                    and not p.on_device(m, name))   # fit's "attn" fraction moves these too
        assert full - on - shexp == pytest.approx(fd.host_layers * layer, rel=1e-9)
    assert seen == {0, 1, 2}
