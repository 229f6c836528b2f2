"""Running llama.cpp's ``llama-bench`` on one configuration, and what the build can do.

The build is told by ``llama-bench --version`` (``version: ... (build N, commit C)``,
``common/common.cpp``'s ``LLAMA_BUILD_NUMBER``/``LLAMA_COMMIT``) and its flags by ``--help``
(``tools/llama-bench/llama-bench.cpp``'s ``print_usage`` of b11434): ``-ncmoe`` (CPU MoE
blocks), ``-fitt`` (llama.cpp's ``--fit`` with a margin per device, off by default in
llama-bench, on at 1024 MiB in llama-server and llama-cli) and, in builds that have llama.cpp's
own MoE cache, ``--moe-cache-mib``. One run is ``-p 0 -n N -r R -o json``: decode only, R
repetitions, each repetition's tokens per second in ``samples_ts``
(:mod:`cope_core.llamacpp.bench.bench_file` reads it).
"""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import CopeInputError
from ..placement.command import LlamaFlags
from ..placement.tools import tool_env
from .bench_file import BenchRow, parse_llama_bench

_VERSION = re.compile(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*(\S+?)\)")
_FLAG = re.compile(r"(?<![\w-])(--?[a-z][\w-]*)")


@dataclass(frozen=True)
class BenchBuild:
    """A llama-bench executable: its path, version line, build number, commit and flags."""

    path: str
    version: str
    build_number: int
    commit: str
    flags: frozenset[str]

    def supports(self, flag: str) -> bool:
        return flag in self.flags

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "version": self.version, "build_number": self.build_number,
                "commit": self.commit, "flags": sorted(self.flags)}


def probe_bench_build(path: str | os.PathLike, env: Mapping[str, str] | None = None) -> BenchBuild:
    """Read a llama-bench's version and flags; a path that is not one is a one-line error."""
    exe = Path(path)
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise CopeInputError("not an executable file (expected llama.cpp's llama-bench)",
                             source=str(path), field="--llama-bench")
    out = []
    for arg in ("--version", "--help"):
        try:
            r = subprocess.run([str(exe), arg], capture_output=True, text=True, timeout=120,
                               env=tool_env(exe, env))
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CopeInputError(f"could not run it with {arg} ({exc})", source=str(path),
                                 field="--llama-bench") from None
        out.append(r.stdout + r.stderr)
    v = _VERSION.search(out[0])
    if "--n-gen" not in out[1] or v is None:
        raise CopeInputError("its --help and --version are not llama-bench's (no --n-gen, no "
                             "'version: ... (build N, commit C)')", source=str(path),
                             field="--llama-bench")
    flags = frozenset(m.group(1) for line in out[1].splitlines()
                      for m in _FLAG.finditer(line.strip().split("  ")[0]))
    return BenchBuild(str(exe), v.group(0), int(v.group(2)), v.group(3), flags)


def bench_command(build: BenchBuild, model: str | os.PathLike, args: Sequence[str], *,
                  repetitions: int, n_gen: int) -> list[str]:
    """The command line of one decode-only run of ``args`` (:meth:`LlamaFlags.argv`
    ``("bench")``) on ``model``: ``-p 0 -n N -r R -o json``."""
    return LlamaFlags.bench_command(build.path, model, args, n_prompt=0, n_gen=n_gen,
                                    repetitions=repetitions, output="json")


def run_bench(build: BenchBuild, model: str | os.PathLike, args: Sequence[str], *,
              repetitions: int, n_gen: int, env: Mapping[str, str] | None = None,
              timeout: float = 3600.0) -> BenchRow:
    """Run one configuration and return its one decode row (with ``samples_ts``)."""
    cmd = bench_command(build, model, args, repetitions=repetitions, n_gen=n_gen)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=tool_env(Path(build.path), env))
    except subprocess.TimeoutExpired:
        raise CopeInputError(f"{' '.join(cmd)} ran past {timeout:.0f} s",
                             source=build.path) from None
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CopeInputError(f"{' '.join(cmd)} exited {r.returncode}: {tail}",
                             source=build.path)
    rows = parse_llama_bench(r.stdout, f"{build.path} {' '.join(args)}")
    tg = [x for x in rows if x.kind == "tg"]
    if len(tg) != 1 or not tg[0].samples_ts:
        raise CopeInputError(f"expected one decode row with samples, got {len(tg)}",
                             source=build.path)
    return tg[0]
