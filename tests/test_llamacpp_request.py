"""The request as the objective (cope_core/llamacpp/answer/request.py): a prompt and an answer
priced
per llama.cpp setting, -ub searched beside the placement, and the recommendation rule applied to
the request's time in cope advise."""
from __future__ import annotations

import json

import pytest

from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.llamacpp import CacheRecord, LlamaSettings, Request, RequestSetting
from cope_core.llamacpp.answer.request import (
    PROMPT_ABS_ERROR,
    PROMPT_RATIO_ERROR,
    RequestRecord,
    fewest_cpu_moe,
)
from cope_core.models import resolve_model

ISSUE = ["advise", "--model", "gpt-oss-120b", "--gpu", "rtx3090", "--cpu", "ryzen-9-7950x",
         "--prompt-tokens", "16384", "--gen-tokens", "512", "--runtime", "llama.cpp"]


def _strict(text: str):
    def bad(c):
        raise ValueError(f"not strict JSON: {c}")
    return json.loads(text, parse_constant=bad)


def setting(label="searched", ttft=2.0, tpot=10_000.0, gen=100, rel=0.1, ub=512):
    return RequestSetting(label, 3, 3.0, 0, ub, max(ub, 2048), 1000, gen, ttft, tpot, tpot, rel)


def test_a_request_is_its_prompt_then_its_answer_at_depth():
    r = Request(4096, 512)
    assert r.tokens == 4608 and r.depth == 4096 + 513 / 2
    assert r.ubatches() == (256, 512, 1024, 2048, 4096)
    assert Request(100, 10).ubatches() == (256, 512)        # never fewer than the default
    assert Request(16384, 1).ubatches()[-1] == 8192
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CopeInputError, match="--prompt-tokens"):
            Request(bad, 1)


def test_request_time_and_its_bounds_by_hand():
    s = setting()
    # 2 s to the first token, then 100 tokens at 10 ms
    assert s.request_s == pytest.approx(3.0)
    assert s.prompt_tokens_per_s == pytest.approx(500.0)
    assert s.decode_tokens_per_s == pytest.approx(100.0)
    e = PROMPT_RATIO_ERROR
    assert s.bounds() == pytest.approx((2 * (1 - e) + 0.9, 2 * (1 + e) + 1.1))
    # the time to first token carries the model's held-out error on tokens/s
    a = PROMPT_ABS_ERROR
    assert s.ttft_range() == pytest.approx((2 * (1 - a), 2 * (1 + a)))
    assert s.summary()["ttft_range_s"] == pytest.approx([2 * (1 - a), 2 * (1 + a)])
    fast, slow = setting(ttft=0.5, rel=0.0), setting(ttft=4.0, rel=0.0)
    assert RequestRecord.surely_faster(fast, slow)       # 0.5*1.29+1 < 4*0.71+1
    assert not RequestRecord.surely_faster(setting(ttft=1.5), setting(ttft=2.0))


def test_a_larger_ubatch_never_fits_more_on_the_gpu():
    g = resolve_model("gpt-oss-120b", "MXFP4_MOE")
    blocks = [fewest_cpu_moe(g, 23.0, LlamaSettings(n_ctx=16896, n_ubatch=u, n_batch=max(u, 2048)))
              for u in (256, 512, 2048, 8192)]
    assert all(b is not None for b in blocks)
    assert blocks == sorted(blocks) and blocks[-1] > blocks[0]


def test_the_record_round_trips_and_refuses_bad_input():
    rec = RequestRecord(Request(1000, 100), (setting("decode-best"), setting(ub=2048)))
    assert RequestRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    assert rec.best == rec.settings[0]
    bad = rec.to_dict()
    bad["settings"][0]["ttft_s"] = -1
    with pytest.raises(CopeInputError, match="request.ttft_s"):
        RequestRecord.from_dict(bad)
    with pytest.raises(CopeInputError, match="request"):
        RequestRecord.from_dict({"prompt_tokens": 1})


def test_the_issues_example_prints_a_ubatch_and_placement_and_the_decode_best(capsys):
    """gpt-oss-120b on an RTX 3090 with a 16k prompt: the first command carries -ub and
    --n-cpu-moe, its time to first token and decode speed, and the decode-only best beside it
    with what each costs the other."""
    assert main(ISSUE) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("llama.cpp")
    cmd = lines[at + 1]
    assert " -ub " in cmd and "--n-cpu-moe" in cmd
    req = next(x for x in lines if x.startswith("  request (16,384-token prompt"))
    assert "first token in" in req and "tokens/s decoding at 16,384-16,896" in req
    dec = next(x for x in lines if x.startswith("  fastest decode: "))
    assert "request" in dec and "against" in dec
    assert any("faster for this request than the default" in x for x in lines)
    assert "16896 tokens of KV cache" in "\n".join(lines)     # the context holds the request


def test_the_json_has_the_requests_figures(capsys):
    assert main([*ISSUE, "--json"]) == 0
    doc = _strict(capsys.readouterr().out)
    assert doc["inputs"]["request"] == {"prompt_tokens": 16384, "gen_tokens": 512}
    assert doc["inputs"]["context"] == 16896
    (r,) = doc["runtimes"]
    assert r["ubatch"] > 512 and f"-ub {r['ubatch']}" in r["command"]
    assert r["ttft_s"] > 0 and r["request_s"] > r["ttft_s"]
    assert r["prompt_tokens_per_s"] == pytest.approx(16384 / r["ttft_s"])
    # one decode figure, one key: tokens_per_s is decode at the request's depth
    assert "decode_tokens_per_s" not in r
    assert r["request_s"] == pytest.approx(r["ttft_s"] + 512 / r["tokens_per_s"])
    assert r["default_request_s"] > r["request_s"]
    dec = next(a for a in r["alternatives"] if a["label"] == "fastest decode")
    assert dec["tokens_per_s"] > r["tokens_per_s"]
    assert dec["request_s"] > r["request_s"] and dec["ubatch"] == 512


def test_decode_alone_when_asked(capsys):
    assert main([*ISSUE[:-6], "--prompt-tokens", "0", "--runtime", "llama.cpp", "--json"]) == 0
    doc = _strict(capsys.readouterr().out)
    (r,) = doc["runtimes"]
    assert doc["inputs"]["request"] is None and r["request_s"] is None and " -ub " not in \
        r["command"]


def test_a_policys_record_keeps_its_request_through_json():
    from cope_core.export.advising import advise
    from cope_core.machine import compose_machine
    g = resolve_model("gpt-oss-120b", "MXFP4_MOE")
    out = advise(g, compose_machine(gpu="rtx3090", cpu="ryzen-9-7950x"),
                 runtimes=("llama.cpp",), request=Request(16384, 512))
    rec = out.policy.llamacpp_cache
    d = json.loads(json.dumps(rec.to_dict()))
    assert CacheRecord.from_dict(d) == rec and rec.request is not None
    assert [s.label for s in rec.request.settings[:2]] == ["decode-best", "default"]
    d["request"]["settings"][0]["n_ubatch"] = "big"
    with pytest.raises(CopeInputError, match="llamacpp_cache.request.n_ubatch"):
        CacheRecord.from_dict(d)


def test_explain_adds_the_search_in_words(capsys):
    assert main(ISSUE) == 0
    short = capsys.readouterr().out
    assert main([*ISSUE, "--explain"]) == 0
    long = capsys.readouterr().out
    assert "in detail (--explain):" in long and "in detail" not in short
    assert "searched" in long.split("in detail (--explain):")[1]


# --- --no-mmap: the host experts pinned (issue 71) ----------------------------------------------
def test_no_mmap_is_searched_only_where_the_host_memory_holds_it(capsys):
    """With --ram-gib the search prices each -ub's placement again with its host experts pinned
    (their bytes plus PINNED_RAM_MARGIN must fit); the pinned setting's prompt is faster (the
    copy crosses from pinned memory) and its decode the same. Without --ram-gib, or with too little,
    nothing is pinned."""
    from cope_core.export.advising import advise
    from cope_core.llamacpp.answer.request import PINNED_RAM_MARGIN, pinned_bytes
    from cope_core.machine import compose_machine
    g = resolve_model("gpt-oss-120b", "MXFP4_MOE")
    m = compose_machine(gpu="rtx3090", cpu="ryzen-9-7950x")

    def settings(ram):
        out = advise(g, m, runtimes=("llama.cpp",), request=Request(4096, 512),
                     host_ram_gib=ram)
        return out.policy.llamacpp_cache.request.settings
    assert not any(s.pinned for s in settings(None))
    big = settings(256)
    pinned = [s for s in big if s.pinned]
    assert pinned
    for p in pinned:
        twin = next(s for s in big if not s.pinned and s.label == "searched"
                    and (s.n_ubatch, s.n_cpu_moe) == (p.n_ubatch, p.n_cpu_moe))
        assert p.ttft_s < twin.ttft_s and p.depth_tpot_us == twin.depth_tpot_us
        assert p.pinned_gib * 2**30 == pytest.approx(pinned_bytes(g, p.host_layers))
    # just too little: the largest pinned setting no longer fits
    most = max(p.pinned_gib for p in pinned)
    tight = (most * 2**30 + PINNED_RAM_MARGIN) / 2**30 - 0.01
    assert max((s.pinned_gib for s in settings(tight)), default=0) < most


def test_no_mmap_is_spelled_as_each_build_and_tool_takes_it():
    """b11434's common/arg.cpp has -lm/--load-mode only; --no-mmap before b10105 and in
    ik_llama.cpp; llama-bench -lm none."""
    from cope_core.llamacpp import LlamaFlags, parse_build
    f = LlamaFlags(n_cpu_moe=20, no_mmap=True)
    assert parse_build("latest").spell(f).argv()[-2:] == ["--load-mode", "none"]
    assert parse_build("b9500").spell(f).argv()[-1] == "--no-mmap"
    assert LlamaFlags(n_cpu_moe=20, no_mmap=True, dialect="ik_llama.cpp").argv()[-1] == \
        "--no-mmap"
    assert LlamaFlags(n_cpu_moe=20, no_mmap=True).argv("bench")[-2:] == ["-lm", "none"]
    assert "--no-mmap" not in LlamaFlags(n_cpu_moe=20).argv() and \
        "--load-mode" not in LlamaFlags(n_cpu_moe=20).argv()


def test_the_advise_command_with_ram_and_bad_ram(capsys):
    assert main([*ISSUE, "--ram-gib", "256"]) == 0
    out = capsys.readouterr().out
    cmd = out.splitlines()[out.splitlines().index("llama.cpp") + 1]
    assert "--load-mode none" in cmd and "GiB of host experts in" in out
    for bad in ("0", "-4", "nan"):
        assert main([*ISSUE, "--ram-gib", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "field '--ram-gib'" in err


def test_a_record_written_before_pinned_settings_reads_as_mmap():
    rec = RequestRecord(Request(1000, 100), (setting("decode-best"), setting(ub=2048)))
    d = rec.to_dict()
    for s in d["settings"]:
        del s["pinned_gib"]
    back = RequestRecord.from_dict(d)
    assert back == rec and not any(s.pinned for s in back.settings)


def test_a_prompt_the_backend_runs_unpriced_is_said_and_ranked_by_decode(capsys):
    """Qwen3.5 on an AMD GPU (ROCm runs its delta net op by op, ggml-org/llama.cpp#20292): the
    request line says so, and llama.cpp's answer carries no request figures."""
    argv = ["advise", "--model", "qwen3.5-35b-a3b", "--gpu", "rx9070xt", "--cpu",
            "ryzen-9-7950x", "--runtime", "llama.cpp"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "is not priced: Qwen3.5's gated delta net" in out and "20292" in out
    assert "ranked by decode" in out and "first token in" not in out
    assert main([*argv, "--json"]) == 0
    (r,) = _strict(capsys.readouterr().out)["runtimes"]
    assert r["ttft_s"] is None and r["request_s"] is None
    # on an NVIDIA card the same model's prompt is priced
    assert main([*argv[:4], "rtx4090", *argv[5:], "--json"]) == 0
    (r,) = _strict(capsys.readouterr().out)["runtimes"]
    assert r["ttft_s"] > 0
