"""The threads a CPU-only decode runs at (issue 73): every count priced, fewer threads offered
beside the cores only where the model finds them faster by more than its spread, and only when
--threads is not given."""
from __future__ import annotations

import json

import pytest

from cope_core import parts
from cope_core.cli.main import main
from cope_core.estimate.cpu_only import (
    FEWER_THREADS_GAIN,
    best_threads,
    host_spec,
    spec_tpot,
)
from cope_core.models import resolve_model


@pytest.mark.parametrize("model,cpu", [("deepseek-v3", "epyc-7763"),
                                       ("qwen3-30b-a3b", "ryzen-7-5700x"),
                                       ("qwen3-235b-a22b", "xeon-platinum-8380")])
def test_the_choice_is_the_fastest_count_priced(model, cpu):
    g = resolve_model(model, "Q4_K_M")
    c = parts.cpu_part(cpu)
    m = parts.memory_part(c.memory)
    choice = best_threads(g, c, m, c.cores, 1024.0)
    spec = host_spec(c, m)
    every = {t: spec_tpot(g, spec, t, 1024.0) for t in range(1, c.cores + 1)}
    assert choice.tpot_us == min(every.values()) == every[choice.threads]
    assert choice.default_tpot_us == every[c.cores]
    assert choice.fewer == (choice.threads < c.cores
                            and choice.tpot_us < every[c.cores] * (1 - FEWER_THREADS_GAIN))


def test_a_big_epyc_runs_fewer_threads_than_its_cores():
    # issue 53: a CPU-only EPYC 7763 measured faster at 16 threads than at 64 (ik_llama.cpp #223)
    g = resolve_model("deepseek-v3", "Q4_K_M")
    c = parts.cpu_part("epyc-7763")
    choice = best_threads(g, c, parts.memory_part(c.memory), c.cores, 1024.0)
    assert choice.fewer and 8 <= choice.threads <= 32


def _advise(capsys, *extra):
    code = main(["advise", "--model", "deepseek-v3", "--gpu", "none", "--cpu", "epyc-7763",
                 "--runtime", "llama.cpp", "--json", *extra])
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)["runtimes"][0]


def test_advise_offers_fewer_threads_only_when_they_are_not_given(capsys):
    found = _advise(capsys)
    assert found["command"].endswith("-t 64") and found["threads"] == 64
    (few,) = [a for a in found["alternatives"] if a["kind"] == "fewer_threads"]
    t = int(few["command"].rsplit(" ", 1)[1])
    assert t < 64 and few["tokens_per_s"] > found["tokens_per_s"] * (1 + FEWER_THREADS_GAIN)
    given = _advise(capsys, "--threads", "64")
    assert given["command"].endswith("-t 64")
    assert not [a for a in given["alternatives"] if a["kind"] == "fewer_threads"]
