"""One answer on every surface (issue 70): for the same inputs, ``cope advise``, ``cope predict``,
``cope export`` and the app lead with the same llama.cpp command, no sentence before it
disagrees with the answer's verdict, and the export file runs exactly one server. Walked over a
grid of models, cards and VRAM budgets, with a request priced and with decode alone."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from cope_core.cli.advise_cmd import _runtime_lines
from cope_core.cli.cache_report import answer_of, text_lines
from cope_core.export import render
from cope_core.export.advising import advise
from cope_core.export.llamacpp import lead_sentence
from cope_core.llamacpp import Kind, Request, Verdict
from cope_core.machine import compose_machine
from cope_core.models import resolve_model

EX = "data/examples/qwen3-30b-a3b"
#: words only a verdict says: which verdicts may say them
_SAID = {"keep the default": (Verdict.KEPT, Verdict.DEFAULT_FASTEST),
         "default is kept": (Verdict.KEPT,),
         "faster for this request than the default": (Verdict.FASTER,),
         "our flags are worth pasting": ()}


def commands(text: str) -> list[str]:
    """The lines a shell would run: neither comments nor blank."""
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def check_before(text: str, command: str, verdict: Verdict, where: str) -> None:
    """No sentence before ``command`` in ``text`` says another verdict."""
    head = text[:text.index(command)]
    for words, allowed in _SAID.items():
        if words in head:
            assert verdict in allowed, (where, words, verdict)


GRID = [(model, gpu, gib, request)
        for model in ("qwen3-30b-a3b", "olmoe-1b-7b")
        for gpu, gib in (("rtx3060-12gb", 6.0), ("rtx3060-12gb", 11.0), ("rtx4090", 16.0),
                         ("rtx4090", 23.0))
        for request in (Request(4096, 512), None)]


@pytest.fixture(scope="module")
def answers():
    out = {}
    for model, gpu, gib, request in GRID:
        g = resolve_model(model, "Q4_K_M")
        machine = compose_machine(gpu=gpu, cpu="ryzen-7-5700x", memory="ddr4-3200x2",
                                  link="4x16")
        out[model, gpu, gib, request] = advise(g, machine, runtimes=("llama.cpp",),
                                               vram_gib=gib, request=request)
    return out


@pytest.mark.parametrize("case", GRID, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]:g}-"
                                                     f"{'request' if c[3] else 'decode'}")
def test_every_surface_leads_with_the_one_answer(answers, case):
    adv = answers[case]
    policy = adv.policy
    answer = policy.llamacpp_answer
    assert answer is not None
    first = answer.recommended
    # the answer's own consistency: the verdict and what leads
    assert (first.kind is Kind.DEFAULT) == (answer.verdict in (Verdict.KEPT,
                                                               Verdict.DEFAULT_FASTEST))
    assert not any(o.kind is first.kind and o.command() == first.command()
                   for o in answer.alternatives)
    # advise
    la = adv.answers[0]
    assert la.runtime == "llama.cpp" and la.command == first.command()
    advise_text = "\n".join(_runtime_lines(la))
    assert advise_text.splitlines()[1].strip() == first.command()
    # export: one server, the answer's; its lead sentence is the answer's
    r = render(policy, "llama.cpp")
    assert r.command == first.command()
    assert commands(r.text) == [first.command()], commands(r.text)
    check_before(r.text, first.command(), answer.verdict, "export")
    if answer.why:
        said = answer.why[:1].upper() + answer.why[1:]      # a sentence's first letter
        assert said in r.text and answer.why in la.notes
    # predict's section, rendered from the same record
    rec = policy.llamacpp_cache
    again = answer_of_policy(policy)
    assert again == answer                  # made from the record alone: the same answer
    predict = "\n".join(text_lines(rec, again, policy_trace(policy)))
    # predict prints text, not a file: its first command is the answer's
    assert next(ln for ln in predict.splitlines() if ln.startswith("llama-server ")) == \
        first.command()
    check_before(predict, first.command(), answer.verdict, "predict")
    # the app's lead (Overview's request figures, Matrix and Export pages' sentence)
    lead = lead_sentence(answer) or ""
    assert lead.startswith(answer.why[:1].upper() + answer.why[1:]) if answer.why else True
    # one decode speed per configuration: the command's speed is its request's decode
    if first.request is not None:
        assert first.tpot_us == pytest.approx(first.request.depth_tpot_us)
        assert la.speed is not None and la.speed.tokens_per_s == pytest.approx(
            first.request.decode_tokens_per_s)
    # what would help most starts from the command's own decode
    if adv.helps and la.speed is not None:
        assert adv.helps[0].base_tokens_per_s == pytest.approx(la.speed.tokens_per_s, rel=0.01)
    # the smallest change: a -b/-ub setting that places as the default adds only those
    if first.kind is Kind.FOR_REQUEST and not first.request.n_cpu_moe \
            and answer.default is not None and not answer.default.host_layers:
        assert "-fit" not in first.command() and "--n-cpu-moe" not in first.command()


class _Trace:
    """What predict's section reads of a trace: the model."""

    def __init__(self, model):
        self.model = model


def policy_trace(policy):
    return _Trace(policy.model)


def answer_of_policy(policy):
    return answer_of(policy.llamacpp_cache, policy_trace(policy), policy.experts_per_layer,
                     policy.cpu_threads)


def _cope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cope_core.cli.main", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("gib", ["12", "24"])
def test_predict_and_export_lead_with_the_same_command(gib):
    files = ["--trace", f"{EX}-trace.parquet", "--calibration", f"{EX}-calibration.parquet",
             "--profile", f"{EX}-rtx4090-analytic.parquet", "--vram-gib", gib]
    pred = _cope("predict", *files)
    exp = _cope("export", *files, "--format", "llama.cpp")
    assert pred.returncode == 0 and exp.returncode == 0, pred.stderr + exp.stderr
    ran = commands(exp.stdout)
    assert len(ran) == 1 and ran[0].startswith("llama-server ")
    # predict prints text: its first command is the one the file runs (the offers follow)
    assert next(ln for ln in pred.stdout.splitlines() if ln.startswith("llama-server ")) == ran[0]
    js = json.loads(_cope("predict", *files, "--json").stdout)
    answer = next(r["answer"] for r in js if "answer" in r)
    assert answer["recommended"]["command"] == ran[0]
    assert re.search(r"\bdecode_tokens_per_s\b", json.dumps(answer)) is None
