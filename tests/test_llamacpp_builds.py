"""llama.cpp's builds as data (issue 62): the table's rows and sources, each build boundary,
every spelling ``--llamacpp`` takes and every bad value, the flags a build is given, and
``cope advise`` answering for the build a user runs."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llama_tools import LLAMA, missing_runtime

from cope_core.cli.args import llamacpp_build
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.llamacpp import Build, LlamaFlags, first_build, latest, parse_build
from cope_core.llamacpp.answer.builds import (
    BUILD_EVIDENCE,
    V1_AT_LEAST,
    build_rows,
    default_words,
    newest,
    this_build,
)
from cope_core.llamacpp.cache.moe_cache import TUNER_SHARES, CacheVersion

README_MACHINE = ["--model", "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf", "--gpu",
                  "rtx3060-12gb", "--cpu", "ryzen-7-5700x", "--memory", "ddr4-3200x2", "--pcie",
                  "4x16", "--runtime", "llama.cpp"]


def b(n: int) -> Build:
    return Build(n, "test")


# --- the table ---------------------------------------------------------------------------------
def test_every_row_names_its_source_and_how_its_build_is_known():
    for r in build_rows():
        assert r.source and r.tag_evidence in BUILD_EVIDENCE, r
        assert r.pr or r.commit, r                      # a PR or a commit to read
        assert (r.build is None) == (r.runtime != "llama.cpp"), r


def test_the_boundaries_the_issue_names():
    """The builds the answers turn on, as read upstream (docs/design.md#llamacpp-builds)."""
    assert [first_build(f) for f in ("override_tensor", "n_cpu_moe", "ngl_max_default", "fit",
                                     "moe_cache", "moe_cache_classlru",
                                     "moe_cache_cpu_share")] == \
        [5028, 6089, 6325, 7407, 11480, 12170, 12191]
    assert newest() == max(V1_AT_LEAST, *(r.build for r in build_rows() if r.build))
    with pytest.raises(KeyError):
        first_build("no_such_feature")


@pytest.mark.parametrize("row", [r for r in build_rows() if r.build], ids=lambda r: r.feature)
def test_each_feature_arrives_at_its_build(row):
    assert not b(row.build - 1).has(row.feature)
    assert b(row.build).has(row.feature) and b(row.build + 1).has(row.feature)


def test_what_each_build_has_and_does_by_default():
    assert (b(6088).n_cpu_moe_flag, b(6089).n_cpu_moe_flag) == (False, True)
    assert (b(7406).fit_flag, b(7407).fit_flag) == (False, True)
    assert [b(n).default_kind for n in (5028, 6324, 6325, 7406, 7407)] == \
        ["cpu", "cpu", "all_gpu", "all_gpu", "fit"]
    assert [b(n).cache_versions for n in (11479, 11480, 12169, 12170)] == \
        [(), (CacheVersion.LRU,), (CacheVersion.LRU,), (CacheVersion.CLASS_LRU,)]
    assert b(12190).cache_shares == (0.0,) and b(12191).cache_shares == tuple(TUNER_SHARES)
    assert "b7407" in default_words("fit") and "b6325" in default_words("cpu")


def test_which_configurations_a_build_runs():
    lru, cls = CacheVersion.LRU.value, CacheVersion.CLASS_LRU.value
    assert b(5028).runs(lru, 0.0, 0)                                 # no cache: every build
    assert not b(11479).runs(lru, 0.0, 512) and b(11480).runs(lru, 0.0, 512)
    assert not b(12169).runs(cls, 0.0, 512) and b(12170).runs(cls, 0.0, 512)
    assert not b(12170).runs(lru, 0.0, 512)                          # the class-LRU replaced it
    assert not b(12190).runs(cls, 0.5, 512) and b(12191).runs(cls, 0.5, 512)


# --- the flags a build is given ----------------------------------------------------------------
def test_a_build_spells_the_placement_with_the_flags_it_has():
    f = LlamaFlags.placed(49, 8, 3, cache_mib=0)
    assert b(12191).spell(f) == f
    assert b(7000).spell(f).text() == "-ngl 99 -t 8 --n-cpu-moe 3"            # no -fit yet
    assert b(6000).spell(f).text() == \
        r"-ngl 99 -t 8 -ot '^blk\.([0-2])\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'"
    assert b(6000).spell(LlamaFlags.placed(49, 8, 0)).text() == "-ngl 99 -t 8"


# --- --llamacpp --------------------------------------------------------------------------------
@pytest.mark.parametrize("text,number", [
    ("b10500", 10500), ("10500", 10500), ("B10500", 10500), (" b6089 ", 6089),
    ("version: 0.6.0-dev (build 11434, commit abc1234)", 11434),
    ("version: 6000 (abc1234)", 6000),
    ("version: 6000 (abc1234)\nbuilt with GNU 12.2.0 for Linux x86_64", 6000)])
def test_the_spellings_of_a_build(text, number):
    assert parse_build(text).number == number


def test_latest_and_the_versioned_releases():
    assert parse_build("latest") == latest() and latest().number == newest()
    assert latest().is_latest and "latest" in latest().said
    v = parse_build("v1.1.1")
    assert v.number >= V1_AT_LEAST and "2026-12-04" in v.said and v.is_latest
    assert "after v1.1.1" in parse_build("v1.2.0").said


@pytest.mark.parametrize("text,says", [
    ("b5000", "-ot came in b5028"), ("v0.6.0", "v1 releases"),
    ("abc1234", "a commit alone"), ("nightly", "expected a build (b10500 or 10500), a release"),
    ("", "expected a build")])
def test_a_bad_build_is_one_line_naming_what_is_taken(text, says):
    with pytest.raises(CopeInputError, match=r"--llamacpp") as exc:
        parse_build(text)
    assert says in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("given", ["", "  "])
def test_an_empty_build_name_is_refused_not_read_as_the_default(capsys, given):
    """``--llamacpp ""`` is one line naming the flag (exit 2), not the newest build."""
    assert main(["advise", *README_MACHINE, "--llamacpp", given]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("cope: error: field '--llamacpp': ") and "empty name" in err
    assert llamacpp_build(argparse.Namespace(llamacpp=None)) == latest()   # not taken: latest


def _tool(out: str):
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, out, "")
    return run


def test_this_reads_the_tool_on_path():
    which = {"llama-cli": "/opt/llama/llama-cli"}.get
    got = this_build(run=_tool("version: 12191 (c4fb579)\n"), which=which)
    assert got.number == 12191 and "/opt/llama/llama-cli" in got.said


@pytest.mark.parametrize("out,says", [
    ("usage: llama-server ...", "printed no 'version: ...' line"),
    ("version: 0.6.0-dev (build 0, commit unknown)", "does not know its build")])
def test_this_without_a_build_number_is_one_line(out, says):
    with pytest.raises(CopeInputError, match=says):
        this_build(run=_tool(out), which=lambda t: f"/x/{t}")


def test_this_with_nothing_on_path_names_what_it_looked_for():
    with pytest.raises(CopeInputError) as exc:
        this_build(which=lambda t: None)
    assert "llama-server, llama-cli, llama-completion" in str(exc.value)


def test_this_asks_the_llama_cpp_the_tests_build(monkeypatch):
    """The llama.cpp scripts/runtimes.sh builds (b11434 from its sdist, its build number written
    in) answers `--version` with its build: --n-cpu-moe and --fit, no MoE cache."""
    if not (LLAMA / "bin" / "llama-completion").exists():
        missing_runtime("llama.cpp b11434's llama-completion is not built")
    monkeypatch.setenv("PATH", f"{LLAMA / 'bin'}{os.pathsep}/usr/bin:/bin")
    got = parse_build("this")
    assert got.number == 11434 and "llama-completion" in got.said
    assert got.n_cpu_moe_flag and got.fit_flag and not got.has("moe_cache")


# --- cope advise for a build ---------------------------------------------------------------------
def _advise(capsys, *extra: str) -> tuple[str, dict]:
    """cope advise ranked by decode alone (the decode answer of a build)."""
    extra = ("--prompt-tokens", "0", *extra)
    assert main(["advise", *README_MACHINE, *extra]) == 0
    text = capsys.readouterr().out
    assert main(["advise", *README_MACHINE, *extra, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def _commands(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("llama-server")]


@pytest.mark.slow
def test_advise_for_a_build_without_the_cache(capsys):
    text, js = _advise(capsys, "--llamacpp", "b10500")
    first = _commands(text)[0]
    # without the cache the best is the plain placement fit already makes: the default leads
    assert first == "llama-server -m MODEL.gguf -c 4096"
    assert "--fit places the model the same way: the default needs no flags" in text
    assert "for llama.cpp b10500 (given as b10500): no MoE expert cache" in text
    assert "with llama.cpp b12191 or newer" in text
    (ans,) = js["runtimes"]
    assert ans["recommended"] == first and ans["build"].startswith("for llama.cpp b10500")
    assert js["inputs"]["llamacpp_build"]["build"] == "b10500"


@pytest.mark.slow
def test_advise_for_a_build_before_n_cpu_moe_and_fit(capsys):
    text, js = _advise(capsys, "--llamacpp", "b6000")
    first = _commands(text)[0]
    assert " -ot '^blk" in first and "--n-cpu-moe" not in first and "-fit" not in first
    (ans,) = js["runtimes"]
    assert ans["default_tokens_per_s"] is not None            # every weight on the CPU, priced
    assert "no layer on the GPU" in ans["default"]


@pytest.mark.slow
def test_advise_for_the_latest_leads_with_the_cache_only_when_sure(capsys):
    text, js = _advise(capsys)
    (ans,) = js["runtimes"]
    assert js["inputs"]["llamacpp_build"]["build"] == latest().label
    assert "latest" in ans["build"] and ans["recommended"] == _commands(text)[0]
    sure = any(n.startswith("faster than the default in") and "keep the default" not in n
               for n in ans["notes"])
    assert ("--moe-cache-mib" in ans["recommended"]) == sure


def test_the_design_page_shows_the_table_the_code_reads():
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "scripts" / "builds_table.py"), "--check"],
                       capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_advise_for_a_build_whose_default_does_not_load(capsys):
    """b6325-b7406: every layer on the GPU by default and no --fit, so a model bigger than the
    card does not load: the default is named, not priced; no -fit off in the command."""
    text, js = _advise(capsys, "--llamacpp", "b7000")
    (ans,) = js["runtimes"]
    assert ans["default_tokens_per_s"] is None and "does not load" in ans["default"]
    first = _commands(text)[0]
    assert "--n-cpu-moe" in first and "-fit" not in first
