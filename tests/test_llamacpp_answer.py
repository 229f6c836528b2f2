"""llama.cpp's answer made once (issue 61): the recommended command, the ones beside it, and the
"sure enough" rule with its words, the same on every surface — `cope advise`, `cope export`
and `cope predict` (one renderer), the app's lead sentence — at the edge of the rule (a share of
0.949 prints 94.9 %, never 95 %, and keeps the default; 0.95 pastes our flags)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from cope_core import parquet_io
from cope_core.cli.advise_cmd import _runtime_lines
from cope_core.export import build_policy, render
from cope_core.export.advising import _answer
from cope_core.export.llamacpp import cache_lines, lead_sentence
from cope_core.llamacpp import (
    FIT_NAME,
    Kind,
    Verdict,
    llama_settings,
    llamacpp_answer,
    share_text,
)
from cope_core.llamacpp.answer.rule import KEEP_LEVEL, sure_enough

RISK = Kind.RISK.value

EX = "data/examples/gguf-qwen3-30b-a3b-q4_k_m"
HEADER = "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"


@pytest.fixture(scope="module")
def policy():
    trace = parquet_io.read_trace(f"{EX}-trace.parquet")
    cal = parquet_io.read_trace(f"{EX}-calibration.parquet")
    prof = parquet_io.read_profile(f"{EX}-rtx4090-analytic.parquet")
    return build_policy(trace, prof, cal, vram_gib=12.0, llama=llama_settings(HEADER))


def _with_share(policy, share: float, slower: float = 1.1):
    """The policy with fit's contender ``slower`` times the best's TPOT and beaten by it in
    ``share`` of the draws (the rest of the record as searched)."""
    rec = policy.llamacpp_cache
    best = rec.versus[0].tpot_us
    vs = tuple(dataclasses.replace(v, tpot_us=best * slower, tpot_ci_us=None,
                                   cache_faster=share) if v.name == FIT_NAME else v
               for v in rec.versus)
    assert any(v.name == FIT_NAME for v in vs) and rec.default_fit is not None
    return dataclasses.replace(policy, llamacpp_cache=dataclasses.replace(rec, versus=vs))


def test_the_rule_and_the_share_in_words():
    assert KEEP_LEVEL == 0.95
    assert not sure_enough(0.949) and sure_enough(0.95)
    assert share_text(0.949) == "94.9" and share_text(0.9499) == "94.9"
    assert share_text(0.95) == "95" and share_text(0.944) == "94" and share_text(1.0) == "100"


def test_a_share_below_the_level_keeps_the_default_on_every_surface(policy):
    p = _with_share(policy, 0.949)
    g = p.model
    answer = p.llamacpp_answer
    assert answer.keeps_default and answer.recommended.runs == FIT_NAME
    assert answer.verdict is Verdict.KEPT
    assert answer.recommended.command() == "llama-server -m MODEL.gguf -c 4096"
    risk = answer.alternatives[0]
    assert risk.kind is Kind.RISK and risk.label == RISK and risk.flags == answer.best.flags
    assert risk.note.startswith("+10.0 %, faster in 94.9 % of draws")
    surfaces = {
        "export": render(p, "llama.cpp").text,
        "predict": "\n".join(cache_lines(answer, p.llamacpp_cache, g)),
        "advise": "\n".join(_runtime_lines(_answer(p, "llama.cpp", False, 4096))),
        "app": lead_sentence(answer) or "",
    }
    for name, text in surfaces.items():
        assert "94.9 %" in text, name
        assert not re.search(r"\b95 % of", text), (name, text)
    for name in ("export", "predict", "advise"):
        # the default's command first, the faster one offered as a risk
        text = surfaces[name]
        first = next(ln.strip() for ln in text.splitlines()
                     if ln.strip().startswith("llama-server"))
        assert first == "llama-server -m MODEL.gguf -c 4096", name
        assert RISK in text, name
    adv = _answer(p, "llama.cpp", False, 4096)
    assert adv.command == "llama-server -m MODEL.gguf -c 4096" and adv.runs == FIT_NAME
    assert "faster than the default in 94.9 % of the paired draws: not sure enough, keep the " \
           "default" in adv.notes
    assert render(p, "llama.cpp").command == adv.command


def test_a_share_at_the_level_pastes_our_flags_on_every_surface(policy):
    p = _with_share(policy, 0.95)
    answer = p.llamacpp_answer
    assert not answer.keeps_default and answer.recommended == answer.best
    assert answer.verdict is Verdict.FASTER
    assert not answer.offered(Kind.RISK, Kind.SLOWER)
    adv = _answer(p, "llama.cpp", False, 4096)
    assert adv.command == answer.best.command() == render(p, "llama.cpp").command
    assert "faster than the default in 95 % of the paired draws" in adv.notes
    assert lead_sentence(answer) == "Faster than the default in 95 % of the paired draws."


def test_the_default_placed_the_same_way_needs_no_flags(policy):
    p = _with_share(policy, 0.5, slower=1.0)
    p = dataclasses.replace(p, llamacpp_cache=dataclasses.replace(
        p.llamacpp_cache, versus=tuple(dataclasses.replace(v, cache_faster=None)
                                       if v.name == FIT_NAME else v
                                       for v in p.llamacpp_cache.versus)))
    answer = llamacpp_answer(p.llamacpp_cache, p.model, p.cpu_threads)
    # the same placement: the smallest change is none, the default's command leads
    assert answer.keeps_default and answer.verdict is Verdict.DEFAULT_FASTEST
    assert answer.recommended.command() == "llama-server -m MODEL.gguf -c 4096"
    assert "--fit places the model the same way: the default needs no flags" in answer.notes
