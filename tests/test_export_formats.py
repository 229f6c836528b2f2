"""The export formats come from one list of records: the CLI, the docs and the renderers follow it.

The app's Export tabs are checked against the same records in tests/test_app_pages.py.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import tiny_profile, tiny_trace

from cope_core.cli.main import build_parser, main
from cope_core.errors import CopeInputError
from cope_core.export import (
    EXPORT_FORMATS,
    FORMATS,
    build_policy,
    get_format,
    render,
    write_policy,
)
from cope_core.export.formats import markdown_table

ROOT = Path(__file__).resolve().parents[1]


def _export_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["export"]


def test_names_are_the_records_in_order_and_unique():
    assert FORMATS == tuple(f.name for f in EXPORT_FORMATS)
    assert len(set(FORMATS)) == len(FORMATS) == 9
    assert [get_format(n).name for n in FORMATS] == list(FORMATS)
    with pytest.raises(CopeInputError, match=r"unknown format 'gguf'; expected one of \['json'"):
        get_format("gguf")


def test_cli_choices_help_and_list_are_the_records():
    parser = _export_parser()
    fmt = next(a for a in parser._actions if "--format" in a.option_strings)
    assert list(fmt.choices) == list(FORMATS)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    short = next(c.help for c in sub._choices_actions if c.dest == "export")
    assert short == "export a chosen policy: " + ", ".join(FORMATS)       # all nine, in order
    text = parser.format_help()
    listed = text.split("\nformats:\n")[1].splitlines()
    assert [line.split()[0] for line in listed[::2]] == list(FORMATS)
    for f, name_line, read_line in zip(EXPORT_FORMATS, listed[::2], listed[1::2]):
        assert name_line.split(None, 1)[1] == f.help
        assert read_line.strip() == f"read in: {f.runtime}, {f.version}"
    # an unknown name is one line naming the choices (argparse, exit 2)
    assert main(["export", "--from-policy", "p.json", "--format", "gguf"]) == 2


def test_side_file_formats_need_an_output(capsys):
    for f in EXPORT_FORMATS:
        if f.side_file is None:
            continue
        assert main(["export", "--from-policy", "p.json", "--format", f.name]) == 2
        err = capsys.readouterr().err
        assert f"the {f.name} format writes a {f.side_file.what} file: give -o OUT (the " \
               f"{f.side_file.suffix} goes next to it)" in err


def test_docs_table_is_written_from_the_records():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_examples.py"),
                        "--table-only", "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    doc = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    table = markdown_table()
    assert doc.count(table) == 1
    body = table.splitlines()[2:]
    assert [re.match(r"\| `([^`]+)` \|", line).group(1) for line in body] == list(FORMATS)
    # the usage line spells the same choices
    usage = re.search(r"--format ([a-z0-9_.|-]+)\n", doc).group(1)
    assert usage.split("|") == list(FORMATS)
    assert "| `ik_llama.cpp` | ik_llama.cpp, 8337e4cd3861 (2026-08-15) | `-ngl 999 -t T -ot " \
           "'blk\\.(...)\\.ffn_(up\\|down\\|gate\\|gate_up)_exps" in table   # bars escaped


@pytest.mark.parametrize("fmt", EXPORT_FORMATS, ids=FORMATS)
def test_each_record_cites_what_its_renderer_was_read_in(fmt):
    module = sys.modules[fmt.module]
    assert fmt.module.startswith("cope_core.export.")
    first = re.match(r"[\w./-]+", fmt.version).group(0)     # a release, build or commit
    assert first in (module.__doc__ or ""), (fmt.name, first, fmt.module)


@pytest.mark.parametrize("fmt", EXPORT_FORMATS, ids=FORMATS)
def test_each_record_renders_by_its_name(fmt):
    tr = tiny_trace()
    # a Mixtral-named tiny model: every runtime here has an architecture for Mixtral
    tr = dataclasses.replace(tr, model=dataclasses.replace(tr.model, name="mixtral-tiny"))
    policy = build_policy(tr, tiny_profile(), tr, experts_per_layer=2,
                          candidate="fixed/parallel")       # exllamav3 writes its stats file
    out = render(policy, fmt.name, pt_path="side.pt", stats_path="side.json", exl3_bits=4.0)
    assert out.format == fmt.name
    assert [p for p, _ in out.files] == ({"sglang-kt": ["side.pt"], "exllamav3": ["side.json"]}
                                         .get(fmt.name, []))
    assert (fmt.side_file is not None) == bool(out.files)
    assert fmt.file_suffix.startswith(".") and fmt.mime


def _literal_names(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            elts = node.keys
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = node.elts
        else:
            continue
        names = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in FORMATS}
        if len(names) >= 2:
            yield node.lineno, sorted(names)


def test_no_other_list_of_formats_in_the_code():
    """A tuple, list, set or dict naming two or more formats outside the records is a second
    list that would drift (as the CLI's help and common.py's once did)."""
    own = ROOT / "cope_core" / "export" / "formats.py"
    paths = [p for d in ("cope_core", "pages", "scripts", "benchmarks") for p in
             (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]
    found = [(str(p.relative_to(ROOT)), line, names) for p in paths if p != own
             for line, names in _literal_names(ast.parse(p.read_text(encoding="utf-8")))]
    assert found == []
    # the check finds such a list
    assert list(_literal_names(ast.parse('VIEWS = {"vllm": 1, "json": 2}'))) == [
        (1, ["json", "vllm"])]


def _mixtral_policy():
    tr = tiny_trace()
    tr = dataclasses.replace(tr, model=dataclasses.replace(tr.model, name="mixtral-tiny"))
    return build_policy(tr, tiny_profile(), tr, experts_per_layer=2, candidate="fixed/parallel")


@pytest.mark.parametrize("fmt", EXPORT_FORMATS, ids=FORMATS)
def test_side_file_is_named_by_its_record(fmt):
    """One function names the side file for the app's download and for ``cope export -o``:
    the stem and the record's suffix, passed as the renderer's option that takes its path."""
    if fmt.side_file is None:
        assert fmt.side_options("d/stem") == {}
        return
    side = fmt.side_file
    assert side.option in fmt.options and side.suffix.startswith(".")
    assert fmt.side_options("d/stem") == {side.option: "d/stem" + side.suffix}
    out = render(_mixtral_policy(), fmt.name, **fmt.side_options("d/stem"))
    assert [p for p, _ in out.files] == ["d/stem" + side.suffix] and "d/stem" in out.text
    # cope export -o OUT: OUT's own suffix replaced, or OUT itself when it is the side file
    assert side.stem_of("d/run.sh") == side.stem_of("d/run") == "d/run"
    assert side.stem_of("d/run" + side.suffix) == "d/run"
    assert side.stem_of("d.v2/run.sh") == "d.v2/run"


@pytest.mark.parametrize("fmt", [f for f in EXPORT_FORMATS if f.side_file], ids=lambda f: f.name)
def test_cli_writes_the_side_file_the_record_names(fmt, tmp_path, capsys):
    policy_file = tmp_path / "p.json"
    write_policy(_mixtral_policy(), policy_file)
    out = tmp_path / "deploy" / "run.sh"
    assert main(["export", "--from-policy", str(policy_file), "--format", fmt.name,
                 "-o", str(out)]) == 0
    stdout = capsys.readouterr().out
    side = Path(fmt.side_options(str(tmp_path / "deploy" / "run"))[fmt.side_file.option])
    assert side == tmp_path / "deploy" / ("run" + fmt.side_file.suffix) and side.is_file()
    assert str(side) in stdout and out.read_text() == stdout
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["run.sh", side.name])


def test_page_and_cli_name_no_side_file_themselves():
    """Besides the behaviour above (and the page's downloads in tests/test_app_pages.py): the
    Export page and ``cope export`` spell no side-file suffix nor pass the renderer's path
    options themselves; both take them from :meth:`ExportFormat.side_options`."""
    suffixes = {f.side_file.suffix for f in EXPORT_FORMATS if f.side_file}
    options = {f.side_file.option for f in EXPORT_FORMATS if f.side_file}
    for path in (ROOT / "pages" / "export.py", ROOT / "cope_core" / "cli" / "export_cmd.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                    and isinstance(n.value, str) and n.value.endswith(tuple(suffixes))]
        keywords = [k.arg for n in ast.walk(tree) if isinstance(n, ast.Call)
                    for k in n.keywords if k.arg in options]
        assert literals == keywords == [], path
        assert "side_options" in path.read_text(encoding="utf-8"), path
