"""Regenerate every output block and number that README.md (and docs/cli.md, which holds the
command-line detail the README hands on) shows, from the code and the shipped data.

    python3 scripts/readme_blocks.py            # rewrite the generated parts (atomically)
    python3 scripts/readme_blocks.py --check    # change nothing; exit 1 when a part is stale

Idempotent: a second run changes nothing. The generated parts sit between markers; the prose
around them states no number of its own (tests/test_readme.py checks both):

* a block ``<!-- readme:NAME -->`` ... ``<!-- /readme:NAME -->`` on lines of their own;
* an inline value ``<!-- readme:NAME -->VALUE<!-- /readme:NAME -->`` inside a sentence.

What each NAME holds (``PARTS`` below):

* ``answer`` — what README command 1 (scripts/quickstart.sh) prints: its ``cope predict``
  command, read from the script itself, run as a user runs it (``python -m cope_core.cli.main``
  = the ``cope`` entry point), its standard output verbatim;
* ``answer-winner`` — the answer's rank-1 candidate (the first row of its table) and what it
  does, in the Policy Matrix's own words (``cope_core.matrix.matrix_table``);
* ``sure`` — ``cope predict`` on the shipped measured 4-layer example at K = 32, one CPU
  thread: the command and its whole output (docs/cli.md#how-sure-is-the-pick);
* ``advise`` — ``cope advise`` for the Qwen3-30B-A3B Q4_K_M GGUF header on a machine composed
  from catalog parts (docs/cli.md#your-machine-in-one-command-cope-advise): the command and its
  whole output; ``advise-command`` — the same command alone (README); ``advise-gpus`` — the
  same on two cards (docs/cli.md#several-gpus);
* ``matrix`` — the Policy Matrix as a table (``matrix_table``: prior systems, new candidates);
* ``candidates``, ``python``, ``vram-gib``, ``port``, ``runtimes`` — inline: the number of
  candidates, the lowest Python of pyproject.toml's ``requires-python``, quickstart.sh's VRAM
  budget and default port, and the runtimes ``cope export`` renders for (the format records).
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from cope_core.export.formats import EXPORT_FORMATS
from cope_core.files import write_atomic
from cope_core.matrix import CANDIDATE_IDS, matrix_table

ROOT = Path(__file__).resolve().parent.parent
FILES = (ROOT / "README.md", ROOT / "docs" / "cli.md")
QUICKSTART = ROOT / "scripts" / "quickstart.sh"
PART = re.compile(r"<!-- readme:([a-z-]+) -->(.*?)<!-- /readme:\1 -->", re.S)
# docs/cli.md's example: the measured 4-layer DeepSeek-V2-Lite cut at K = 32 and one CPU thread
SURE = ("cope predict --trace data/examples/deepseek-v2-lite-4l-trace.parquet",
        "--calibration data/examples/deepseek-v2-lite-4l-calibration.parquet",
        "--profile data/examples/deepseek-v2-lite-4l-cpu-emulated-profile.parquet "
        "-K 32 --threads 1")
# docs/cli.md's cope advise example: the machine with a 12 GB card, so K < E, and a
# long prompt (a RAG or coding-agent request), so -ub matters
ADVISE = ("cope advise --model data/models/qwen3-30b-a3b-Q4_K_M.header.gguf",
          "--gpu rtx3060-12gb --cpu ryzen-7-5700x --memory ddr4-3200x2 --pcie 4x16",
          "--prompt-tokens 16384 --gen-tokens 512")

# docs/cli.md's several-GPU example: a 24 GB and a 12 GB card under a model neither holds
ADVISE_GPUS = ("cope advise --model qwen3-235b-a22b --gpu rtx3090,rtx3060-12gb",
               "--cpu ryzen-9-7950x --memory ddr5-6000x2 --runtime llama.cpp")


def quickstart_args() -> list[str]:
    """The arguments of scripts/quickstart.sh's ``cope predict`` (continuation lines joined)."""
    text = QUICKSTART.read_text()
    m = re.search(r"^cope predict (.*?)\n(?!\s)", text, re.S | re.M)
    if m is None:
        raise SystemExit("readme_blocks: scripts/quickstart.sh has no `cope predict` line")
    return shlex.split(m.group(1).replace("\\\n", " "))


def cope(args: list[str]) -> str:
    """Standard output of ``cope ARGS`` run from the repository root, as a user runs it."""
    env = dict(os.environ, COLUMNS="200", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "cope_core.cli.main", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"readme_blocks: `cope {shlex.join(args)}` exited {r.returncode}:\n"
                         f"{r.stderr}")
    return r.stdout


def fenced(text: str, lang: str = "") -> str:
    return f"\n```{lang}\n{text.rstrip()}\n```\n"


@functools.cache
def quickstart_output() -> str:
    return cope(["predict", *quickstart_args()])


def answer() -> str:
    return fenced(quickstart_output())


def answer_winner() -> str:
    """The answer's rank-1 candidate (the table's first row) and what it does, in the matrix's
    own words."""
    out = quickstart_output()
    top, k = re.search(r"^\s*1\s+(\S+)\s", out, re.M), re.search(r"^K = (\d+) ", out, re.M)
    if top is None or k is None:
        raise SystemExit("readme_blocks: the quickstart's output has no rank-1 row or no K line")
    table = matrix_table()
    cand = next((c for c in table["candidates"] if c["id"] == top.group(1)), None)
    if cand is None or cand["residency"] is None:
        return f"`{top.group(1)}` at K = {k.group(1)}: {table['baseline']['description']}"
    res = {r["id"]: r["description"] for r in table["residencies"]}
    exe = {e["id"]: e["description"] for e in table["executions"]}
    prior = cand["prior_systems"]
    who = f"as in {', '.join(prior)}" if prior else "a cell no published system runs"
    return (f"`{cand['id']}` ({who}) at K = {k.group(1)}. Residency: {res[cand['residency']]}. "
            f"Execution: {exe[cand['execution']]}")


def shown_run(lines: tuple[str, ...]) -> str:
    """``$ COMMAND`` (one line per part, continued) and its standard output, fenced."""
    args = shlex.split(" ".join(lines))[1:]
    shown = " \\\n    ".join(lines)
    return fenced(f"$ {shown}\n{cope(args)}", "console")


def sure() -> str:
    return shown_run(SURE)


def matrix() -> str:
    t = matrix_table()
    execs = [e["id"] for e in t["executions"]]
    cell = {c["id"]: (", ".join(c["prior_systems"]) or "**new**") for c in t["candidates"]
            if c["residency"] is not None}
    lines = ["| residency \\ execution | " + " | ".join(execs) + " |",
             "|---|" + "---|" * len(execs)]
    lines += [f"| {r['id']} | " + " | ".join(cell[f"{r['id']}/{e}"] for e in execs) + " |"
              for r in t["residencies"]]
    return "\n" + "\n".join(lines) + "\n"


def advise_llamacpp() -> str:
    """The llama.cpp answer of the ``advise`` example: its lines up to the next runtime."""
    lines = cope(shlex.split(" ".join(ADVISE))[1:]).splitlines()
    at = lines.index("llama.cpp")
    end = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith("  "))
    return fenced("\n".join(lines[at:end]), "")


def python_min() -> str:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    m = re.fullmatch(r">=\s*(\d+\.\d+)", spec.strip())
    if m is None:
        raise SystemExit(f"readme_blocks: pyproject.toml requires-python {spec!r}: expected >=X.Y")
    return m.group(1)


def vram_gib() -> str:
    args = quickstart_args()
    return args[args.index("--vram-gib") + 1]


def port() -> str:
    m = re.search(r"\$\{COPE_PORT:-(\d+)\}", QUICKSTART.read_text())
    if m is None:
        raise SystemExit("readme_blocks: scripts/quickstart.sh has no ${COPE_PORT:-N} default")
    return m.group(1)


PARTS: dict[str, Callable[[], str]] = {
    "answer": answer, "answer-winner": answer_winner, "sure": sure, "matrix": matrix,
    "advise": lambda: shown_run(ADVISE),
    "advise-command": lambda: fenced(" \\\n    ".join(ADVISE), "bash"),
    "advise-llamacpp": advise_llamacpp,
    "advise-gpus": lambda: shown_run(ADVISE_GPUS),
    "candidates": lambda: str(len(CANDIDATE_IDS)), "python": python_min, "vram-gib": vram_gib,
    "port": port,
    "runtimes": lambda: ", ".join(f.label for f in EXPORT_FORMATS if f.name != "json"),
}


def regenerate(text: str, where: str, cache: dict[str, str]) -> str:
    """``text`` with every generated part rewritten (``cache`` holds parts made already)."""
    def one(m: re.Match) -> str:
        name = m.group(1)
        if name not in PARTS:
            raise SystemExit(f"readme_blocks: {where}: unknown part {name!r}; "
                             f"expected one of {sorted(PARTS)}")
        if name not in cache:
            cache[name] = PARTS[name]()
        return f"<!-- readme:{name} -->{cache[name]}<!-- /readme:{name} -->"
    return PART.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 when a generated part is not current")
    args = ap.parse_args(argv)
    cache: dict[str, str] = {}
    stale = []
    for path in FILES:
        old = path.read_text(encoding="utf-8")
        new = regenerate(old, path.name, cache)
        if new != old:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                write_atomic(path, new, overwrite=True)
    if args.check and stale:
        print(f"not current: {', '.join(stale)}: run python3 scripts/readme_blocks.py",
              file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale and not args.check else "current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
