"""One spelling of a machine on every command: ``--gpu``, ``--cpu``, ``--memory``, ``--pcie`` and
``--threads`` (cope_core/cli/args.py); old spellings refused in one line naming the new one; no
prefix matching; the app's URL keys spelled the same. A context is ``--ctx`` everywhere, and
llama.cpp's run options default to its records (issue 61)."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from cope_core.app.settings import CODECS, OLD_KEYS, parse_query
from cope_core.cli.args import MACHINE_PARTS, RENAMED, llama_settings_from_args, machine_from_args
from cope_core.cli.main import build_parser, main
from cope_core.geometry import DEFAULT_CONTEXT
from cope_core.llamacpp import FIT_MARGIN, LlamaSettings, latest
from cope_core.machine import compose_machine

#: Every other way a machine's part has been or could be spelled on a command line.
OTHER_SPELLINGS = {"--link", "--cpu-threads", "--mem", "--ram", "--slot", "--card", "--host",
                   "--n-threads", "--cores", "--memory-spec", "--host-memory"}
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every sub-command's argv prefix, nested ones (``trace collect``) included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path
        return
    for name, child in subs[0].choices.items():
        yield from _commands(child, (*path, name))


COMMANDS = list(_commands(build_parser()))


def _help(capsys, argv: tuple[str, ...]) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_the_walk_sees_every_command():
    names = {" ".join(c) for c in COMMANDS}
    assert {"advise", "predict", "evaluate", "verify", "profile", "parts", "vram", "export",
            "trace collect", "trace stats"} <= names
    assert len(names) >= 18


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_no_help_offers_another_spelling_of_a_machine(capsys, argv):
    options = set(OPTION.findall(_help(capsys, argv)))
    assert not options & OTHER_SPELLINGS, sorted(options & OTHER_SPELLINGS)


@pytest.mark.parametrize("argv, parts", [
    (("advise",), MACHINE_PARTS),
    (("parts",), MACHINE_PARTS),
    (("verify",), MACHINE_PARTS),
    (("evaluate",), MACHINE_PARTS),
    (("profile",), ("gpu", "cpu", "pcie", "threads")),
    (("predict",), ("threads",)),
    (("export",), ("threads",)),
    (("measure",), ("threads",)),
    (("compare",), ("threads",)),
    (("contention",), ("threads",)),
])
def test_commands_that_take_a_machine_spell_it_the_one_way(capsys, argv, parts):
    options = set(OPTION.findall(_help(capsys, argv)))
    assert {f"--{p}" for p in parts} <= options


@pytest.mark.parametrize("argv, old, new", [
    (["predict", "--trace", "t", "--profile", "p", "-K", "4", "--cpu-threads", "8"],
     "--cpu-threads", "--threads"),
    (["evaluate", "--llama-bench", "b.json", "--model", "m.gguf", "--analytic", "rtx3090"],
     "--analytic", "--gpu"),
    (["evaluate", "--llama-bench", "b.json", "--model", "m.gguf", "--gpu", "rtx3090",
      "--link", "4x16"], "--link", "--pcie"),
    (["profile", "--model", "olmoe-1b-7b", "--analytic", "--gpu", "h100", "--link", "pcie5",
      "-o", "x.parquet"], "--link", "--pcie"),
    (["verify", "--trace", "t", "--profile", "p", "-K", "4", "--cpu-threads", "1,2"],
     "--cpu-threads", "--threads"),
    (["export", "--trace", "t", "--profile", "p", "-K", "4", "--cpu-threads", "2",
      "--format", "json"], "--cpu-threads", "--threads"),
    (["vram", "--model", "qwen3-30b-a3b", "--gib", "24", "--context", "8"], "--context", "--ctx"),
    (["advise", "--model", "qwen3-30b-a3b", "--gpu", "rtx4090", "--cpu", "ryzen-9-7950x",
      "--context", "8192"], "--context", "--ctx"),
])
def test_an_old_spelling_gets_one_line_naming_the_new_one(capsys, argv, old, new):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"cope: error: field '{old}': is now spelled {new}")


def test_profile_analytic_is_a_switch_and_names_the_gpu_flag(capsys):
    assert main(["profile", "--analytic", "h100", "--model", "olmoe-1b-7b", "-o", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("cope: error: field '--analytic': takes no value now: name the GPU with --gpu "
                   "(--analytic --gpu h100)")
    assert main(["profile", "--analytic", "--model", "olmoe-1b-7b", "-o", "x"]) == 2
    assert "needs the GPU: --analytic --gpu GPU" in capsys.readouterr().err


def test_no_prefix_matching(capsys):
    # export has --gpu-share and no --gpu: the flag the user typed is named, not taken as another
    assert main(["export", "--trace", "t", "--profile", "p", "-K", "4", "--format", "json",
                 "--gpu", "50"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --gpu 50" in err and "--gpu-share" not in err
    assert main(["predict", "--trace", "t", "--profile", "p", "-K", "4", "--thread", "2"]) == 2
    assert "unrecognized arguments: --thread 2" in capsys.readouterr().err


def test_evaluate_refuses_machine_flags_without_llama_bench(capsys):
    assert main(["evaluate", "--trace", "t", "--profile", "p", "--measurements", "m",
                 "--gpu", "rtx3090"]) == 2
    assert "field '--gpu': names the machine of --llama-bench" in capsys.readouterr().err


def test_every_renamed_spelling_is_one_of_the_others():
    assert {o for p in MACHINE_PARTS for o in RENAMED.get(p, ())} <= OTHER_SPELLINGS


# --- the context and llama.cpp's run options (issue 61) ---------------------------------------
@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_a_context_is_spelled_ctx_everywhere(capsys, argv):
    assert "--context" not in set(OPTION.findall(_help(capsys, argv)))


def test_the_llamacpp_options_default_to_the_records():
    args = build_parser().parse_args(["predict", "--trace", "t", "--profile", "p", "-K", "4"])
    d = LlamaSettings()
    assert (args.ctx, args.cache_type_k, args.cache_type_v, args.fitt << 20) == \
        (DEFAULT_CONTEXT, d.type_k, d.type_v, FIT_MARGIN)
    # the build: --llamacpp's default, the newest known
    assert llama_settings_from_args(args) == LlamaSettings(build=latest())
    for argv in (["vram", "--model", "m", "--gib", "8"],
                 ["advise", "--model", "m", "--gpu", "g", "--cpu", "c"]):
        assert build_parser().parse_args(argv).ctx == DEFAULT_CONTEXT
    # cope vram takes no --fitt: --fit's own margin
    vram = build_parser().parse_args(["vram", "--model", "m", "--gib", "8", "--ctx", "512"])
    assert llama_settings_from_args(vram) == LlamaSettings(n_ctx=512, build=latest())


# --- the machine from the flags -----------------------------------------------------------------
def test_machine_from_args_is_compose_machine_of_the_flags():
    args = build_parser().parse_args(["parts", "machine", "--gpu", "rtx4090", "--cpu",
                                      "ryzen-9-7950x", "--memory", "ddr5-6000x2", "--pcie",
                                      "4x8", "--threads", "6"])
    m = machine_from_args(args)
    assert m.to_dict() == compose_machine(gpu="rtx4090", cpu="ryzen-9-7950x",
                                          memory="ddr5-6000x2", link="4x8",
                                          threads=6).to_dict()
    # a command's own value of a part replaces its flag's
    assert machine_from_args(args, threads=None, cpu="ryzen-7-5700x").to_dict() == \
        compose_machine(gpu="rtx4090", cpu="ryzen-7-5700x", memory="ddr5-6000x2",
                        link="4x8").to_dict()
    with pytest.raises(TypeError, match="link"):
        machine_from_args(args, link="4x16")


def test_the_app_url_spells_the_machine_as_the_cli_does():
    assert {"gpu", "cpu", "memory", "pcie"} <= set(CODECS)
    assert not set(OLD_KEYS) & set(CODECS)
    # a link shared with the old keys opens the same view; the new key wins when both are there
    assert parse_query({"mem": "ddr4-3200x2", "link": "pcie4x16"}) == \
        {"memory": "ddr4-3200x2", "pcie": "pcie4x16"}
    assert parse_query({"mem": "ddr4-3200x2", "memory": "ddr5-6000x2"}) == \
        {"memory": "ddr5-6000x2"}


def test_cope_vram_counts_the_compute_buffer_of_a_batch(capsys):
    """-ub reserves the compute buffer for that many tokens (capped by -b): cope vram names it
    in the flags and counts a larger buffer; --no-op-offload drops the host weights' copy."""
    base = ["vram", "--model", "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf", "--gib", "14",
            "--n-cpu-moe", "20", "--json"]
    got = {}
    for extra in ([], ["-ub", "2048"], ["-ub", "4096"], ["-ub", "4096", "-b", "4096"]):
        assert main(base + extra) == 0
        got[" ".join(extra)] = json.loads(capsys.readouterr().out)
    assert got[""]["ubatch"] == 512 and got[""]["batch"] == 2048
    assert got[""]["compute_gib"] < got["-ub 2048"]["compute_gib"] < \
        got["-ub 4096 -b 4096"]["compute_gib"]
    assert got["-ub 4096"]["compute_gib"] == got["-ub 2048"]["compute_gib"]     # -b 2048 caps it
    assert main(base[:-1] + ["-ub", "2048"]) == 0
    assert "-ngl 99 --n-cpu-moe 20 -ub 2048 fits" in capsys.readouterr().out
