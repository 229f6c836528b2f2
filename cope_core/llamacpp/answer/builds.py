"""llama.cpp's builds as data: which release introduced or changed each flag and behaviour COPE
emits or models (``data/builds.csv``, every row with its upstream source; docs/design.md#llamacpp-
builds), and the build a user runs, named or read from its own ``--version``.

A :class:`Build` answers "does this build have X?" for the search and the command line: the
MoE expert cache and its rules (:attr:`Build.cache_versions`, :attr:`Build.cache_shares`),
``--n-cpu-moe``, ``-fit`` and what the build does with no placement flag
(:attr:`Build.default_kind`).
"""
from __future__ import annotations

import csv
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from ...errors import CopeInputError
from ...geometry import GIB
from ..cache.moe_cache import TUNER_SHARES, CacheVersion
from ..placement.command import LlamaFlags
from ..placement.fit import FitArgs, FitDefault
from ..placement.tools import tool_env
from ..placement.vram import N_BATCH, N_UBATCH, LlamaModel, Placement, device_memory

DATA = Path(__file__).parents[1] / "data" / "builds.csv"
#: How a row's first build is known (the ``tag_evidence`` column)
BUILD_EVIDENCE = {
    "describe": "git describe --contains of the merge commit, in a history compiled from a full "
                "clone of ggml-org/llama.cpp (HEAD 4da6337, 2026-09-27)",
    "count": "the merge commit's count in mainline history (a build number is the commit count, "
             "cmake/build-info.cmake l. 31-38 of b11434), counted in mirrors of mainline's "
             "history (kmbandy/llama.cpp to b9402, ngxson/llama.cpp to b10573)",
    "notes": "merged 2026-10-07; third-party notes of 2026-10-08 found no tag up to b11479 "
             "holding it",
    "release": "the release notes of the tag",
    "tag": "read in the source at the tag",
    "commit": "read at the commit named (the runtime has no numbered releases)",
}
#: What a build does with no placement flag, by :attr:`Build.default_kind` (``{fit}`` and
#: ``{ngl}``: the first builds with ``--fit`` and with every layer on the GPU by default)
_DEFAULTS = {
    "fit": "--fit places the model (on by default since b{fit}, PR #16653)",
    "all_gpu": "every layer on the GPU (-ngl at its maximum by default since b{ngl}, PR #15434; "
               "no --fit before b{fit}): it does not load when the model exceeds the VRAM",
    "cpu": "no layer on the GPU (the library's -ngl 0 default before b{ngl}): every weight on "
           "the CPU",
}
#: The tools whose ``--version`` names the build, tried in this order for ``--llamacpp this``
#: (llama-server and llama-cli are what users run; llama-completion is what the tests build).
VERSION_TOOLS = ("llama-server", "llama-cli", "llama-completion")
# b11434 (common/build-info.cpp.in l. 33): "version: 0.6.0-dev (build 11434, commit abc1234)";
# earlier builds: "version: 6089 (abc1234)"
_BUILD_LINE = re.compile(r"version:\s*\S+\s*\(build (\d+), commit ([^)\s]+)\)")
#: how ``--llamacpp`` and the app name the newest build COPE knows (the default)
LATEST_BUILD = "latest"
_OLD_LINE = re.compile(r"version:\s*(\d+)\s*\(([^)\s]+)\)")
#: upstream's versioned releases (tagged beside the nightly bNNNN since b10394, PR #26839), with
#: their dates; the newest nightly seen when v1.1.1 was tagged (llamacpp-builds-2026-12-07.md)
RELEASES = {"v1.0.0": "2026-11-13", "v1.1.0": "2026-11-26", "v1.1.1": "2026-12-04"}
V1_AT_LEAST = 12668
_RELEASE = re.compile(r"v(\d+)\.\d+\.\d+")


@dataclass(frozen=True)
class BuildRow:
    """One row of the table: ``feature`` first appeared in (or changed at) ``build`` of
    ``runtime``."""

    runtime: str
    feature: str
    build: int | None     # None: a runtime without numbered releases (``commit`` names it)
    commit: str
    flag: str
    pr: str
    source: str
    note: str
    tag_evidence: str


@cache
def build_rows() -> tuple[BuildRow, ...]:
    """The table, as shipped (docs/design.md#llamacpp-builds lists it)."""
    with DATA.open(newline="") as f:
        out = []
        for i, r in enumerate(csv.DictReader(f), start=2):
            try:
                out.append(BuildRow(r["runtime"], r["feature"],
                                    int(r["build"]) if r["build"] else None, r["commit"],
                                    r["flag"], r["pr"], r["source"], r["note"],
                                    r["tag_evidence"]))
                if r["tag_evidence"] not in BUILD_EVIDENCE:
                    raise ValueError(f"tag_evidence {r['tag_evidence']!r}: expected one of "
                                     f"{sorted(BUILD_EVIDENCE)}")
            except (KeyError, ValueError) as exc:
                raise CopeInputError(f"line {i}: {exc}", source=str(DATA)) from None
    return tuple(out)


def first_build(feature: str, runtime: str = "llama.cpp") -> int:
    """The first build of ``runtime`` with ``feature`` (a row's ``feature``)."""
    found = [r.build for r in build_rows() if r.runtime == runtime and r.feature == feature
             and r.build is not None]
    if not found:
        raise KeyError(f"no build row for {runtime} {feature!r}")
    return min(found)


def default_words(kind: str) -> str:
    """What a build does with no placement flag (``kind``: :attr:`Build.default_kind`), with
    the builds from the table."""
    return _DEFAULTS[kind].format(fit=first_build("fit"), ngl=first_build("ngl_max_default"))


@cache
def newest() -> int:
    """The newest llama.cpp build COPE knows: what ``--llamacpp latest`` means."""
    # the table's newest row, or the newest nightly seen beside the v1 releases (same flags)
    return max(V1_AT_LEAST, *(r.build for r in build_rows()
                              if r.runtime == "llama.cpp" and r.build is not None))


@dataclass(frozen=True)
class Build:
    """A llama.cpp build: its release number and how it was named (``said``)."""

    number: int
    said: str

    @property
    def label(self) -> str:
        return f"b{self.number}"

    def has(self, feature: str) -> bool:
        return self.number >= first_build(feature)

    @property
    def cache_versions(self) -> tuple[CacheVersion, ...]:
        """The MoE-cache eviction rule this build runs: none before the cache, LRU until the
        class-LRU replaced it."""
        if self.has("moe_cache_classlru"):
            return (CacheVersion.CLASS_LRU,)
        if self.has("moe_cache"):
            return (CacheVersion.LRU,)
        return ()

    @property
    def cache_shares(self) -> tuple[float, ...]:
        """The ``--moe-cache-cpu-share`` values searched (0 alone: the build has no share)."""
        return tuple(TUNER_SHARES) if self.has("moe_cache_cpu_share") else (0.0,)

    @property
    def default_kind(self) -> str:
        """What the build does with no placement flag (:func:`default_words` says it)."""
        if self.has("fit"):
            return "fit"
        return "all_gpu" if self.has("ngl_max_default") else "cpu"

    @property
    def fit_flag(self) -> bool:
        """Whether ``-fit off`` exists (and is needed: since ``--fit`` came, on by default)."""
        return self.has("fit")

    @property
    def n_cpu_moe_flag(self) -> bool:
        """Whether ``--n-cpu-moe`` exists (else the same placement is spelled with ``-ot``)."""
        return self.has("n_cpu_moe")

    @property
    def is_latest(self) -> bool:
        return self.number >= newest()

    def runs(self, version: str, cpu_share: float, cache_mib: int) -> bool:
        """Whether this build runs a configuration of llama.cpp's search (its ``version`` value,
        share and MiB; no cache: every known build)."""
        if not cache_mib:
            return True
        ok = {v.value for v in self.cache_versions}
        return version in ok and (not cpu_share or self.has("moe_cache_cpu_share"))

    def spell(self, flags: LlamaFlags) -> LlamaFlags:
        """``flags`` as this build takes them: before ``--n-cpu-moe`` (b6089) its placement as
        the one ``-ot`` override of the same blocks (b5028+); before ``--fit`` (b7407) no
        ``-fit off``, a flag it does not know (and nothing to switch off); before
        ``--load-mode`` (b10105) ``--no-mmap``."""
        out = flags
        if out.n_cpu_moe is not None and not self.n_cpu_moe_flag:
            out = replace(out, n_cpu_moe=None, cpu_blocks=tuple(range(out.n_cpu_moe)))
        if out.fit is False and not self.fit_flag:
            out = replace(out, fit=None)
        if out.no_mmap and not self.has("load_mode"):
            out = replace(out, load_mode_flag=False)
        return out

    def describe(self) -> str:
        return f"llama.cpp {self.label} ({self.said})"

    def to_dict(self) -> dict:
        return {"build": self.label, "number": self.number, "said": self.said,
                "default": default_words(self.default_kind),
                "moe_cache": [v.value for v in self.cache_versions],
                "cpu_share": self.has("moe_cache_cpu_share")}


def milestones() -> tuple[tuple[str, str], ...]:
    """The builds worth choosing between, oldest first: each llama.cpp build where a feature
    COPE models arrived, as ``(label, what arrived)``, e.g. ``("b6089", "--n-cpu-moe N")``."""
    out: dict[int, list[str]] = {}
    for r in build_rows():
        if r.runtime == "llama.cpp" and r.build is not None and r.build >= first_build(
                "override_tensor"):
            out.setdefault(r.build, []).append(r.flag or r.feature.replace("_", " "))
    return tuple((f"b{n}", ", ".join(dict.fromkeys(v))) for n, v in sorted(out.items()))


def latest() -> Build:
    """``--llamacpp latest`` (the default): the newest build whose flags the table knows."""
    return Build(newest(), "latest: the newest build whose flags COPE knows")


def parse_build(text: str, *, run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                which: Callable[[str], str | None] = shutil.which) -> Build:
    """``--llamacpp``: ``b10500``, ``10500``, the ``version:`` line a llama.cpp tool prints,
    ``latest`` (default) or ``this`` (the first of :data:`VERSION_TOOLS` on PATH, asked)."""
    t = text.strip()
    if not t:
        raise CopeInputError("expected a build (b10500 or 10500), a release (v1.1.1), the line "
                             "`llama-server --version` prints, 'latest' or 'this', got an empty "
                             "name", field="--llamacpp")
    if t.lower() == LATEST_BUILD:
        return latest()
    if t.lower() == "this":
        return this_build(run=run, which=which)
    m = re.fullmatch(r"[bB]?(\d+)", t)
    if m:
        return _checked(int(m.group(1)), f"given as {t}")
    if (m := _BUILD_LINE.search(t) or _OLD_LINE.search(t)) is not None:
        return _checked(int(m.group(1)), f"given as {t!r}")
    if (m := _RELEASE.fullmatch(t)) is not None:
        return _release(t, int(m.group(1)))
    if re.fullmatch(r"[0-9a-fA-F]{7,40}", t):
        raise CopeInputError(f"a commit alone ({t}) does not say which build it is: give the "
                             "build number `llama-server --version` prints (b12191, or its "
                             "whole 'version: ...' line)", field="--llamacpp")
    raise CopeInputError(f"expected a build (b10500 or 10500), a release (v1.1.1), the line "
                         f"`llama-server --version` prints, 'latest' or 'this', got {text!r}",
                         field="--llamacpp")


def _release(tag: str, major: int) -> Build:
    """A versioned release (``v1.1.1``): upstream tags them on a nightly's commit, but which
    bNNNN each is was not found (docs/design.md#llamacpp-builds); every v1 release has at least
    what :data:`V1_AT_LEAST` has."""
    if major < 1:
        raise CopeInputError(f"{tag}: COPE knows upstream's v1 releases ({', '.join(RELEASES)}); "
                             "give the build number `llama-server --version` prints",
                             field="--llamacpp")
    known = f"released {RELEASES[tag]}" if tag in RELEASES else "a release after v1.1.1"
    return Build(max(V1_AT_LEAST, newest()),
                 f"given as {tag}: {known}; its build number is not known, at least "
                 f"b{V1_AT_LEAST} (the newest nightly beside v1.1.1)")


def _checked(number: int, said: str) -> Build:
    oldest = first_build("override_tensor")
    if number < oldest:
        raise CopeInputError(f"b{number} cannot place experts apart from their layers (-ot came "
                             f"in b{oldest}, PR #11397): update llama.cpp", field="--llamacpp")
    return Build(number, said)


def this_build(*, run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
               which: Callable[[str], str | None] = shutil.which,
               tools: Sequence[str] = VERSION_TOOLS) -> Build:
    """The build of the llama.cpp on PATH, read from its ``--version``."""
    for tool in tools:
        path = which(tool)
        if path is None:
            continue
        try:
            done = run([path, "--version"], capture_output=True, text=True, timeout=30,
                       env=tool_env(Path(path), None))
        except (OSError, subprocess.SubprocessError) as exc:
            raise CopeInputError(f"{path} --version did not run: {exc}",
                                 field="--llamacpp") from None
        out = (done.stdout or "") + (done.stderr or "")
        m = _BUILD_LINE.search(out) or _OLD_LINE.search(out)
        if m is None:
            raise CopeInputError(f"{path} --version printed no 'version: ...' line; give the "
                                 "build: --llamacpp b12191", field="--llamacpp")
        number, commit = int(m.group(1)), m.group(2)
        if number == 0:
            raise CopeInputError(f"{path} does not know its build (build 0, commit {commit}: "
                                 "built from a source archive without git); give it: "
                                 "--llamacpp bNNNNN", field="--llamacpp")
        return _checked(number, f"this: {path} --version says build {number}, commit {commit}")
    raise CopeInputError(f"none of {', '.join(VERSION_TOOLS)} is on PATH: give the build you "
                         "run (--llamacpp b12191) or put llama.cpp's tools on PATH",
                         field="--llamacpp")


def default_before_fit(build: Build, m: LlamaModel, vram_gib: float, n_ctx: int,
                       type_k: str = "f16", type_v: str = "f16", *,
                       n_ubatch: int = N_UBATCH, n_batch: int = N_BATCH,
                       op_offload: bool = True) -> FitDefault:
    """A build without ``--fit``'s default: ``-ngl`` at its maximum (b6325-b7406) loads every
    layer on the GPU, priced when that fits the budget and otherwise not loading; before b6325
    no layer is on the GPU (not priced beside a GPU: COPE prices routed experts on the CPU, not
    attention).

    Parameters
    ----------
    build : Build
        A build before ``--fit`` (:attr:`Build.default_kind` ``"all_gpu"`` or ``"cpu"``).
    m : LlamaModel
        The model's tensor table.
    vram_gib : float
        The VRAM budget.
    n_ctx, type_k, type_v
        The context and KV cache types.
    n_ubatch, n_batch, op_offload
        ``-ub``, ``-b`` and op offload, for the compute buffer.
    """
    kind = build.default_kind
    moe = sum(1 for b in range(m.n_layer) if f"blk.{b}.ffn_down_exps.weight" in dict(m.tensors))
    if kind == "cpu":
        return FitDefault(FitArgs(LlamaFlags(n_gpu_layers=0)), "cpu", n_ctx, vram_gib, 0.0, 0.0,
                          float(moe), tuple(range(m.n_layer)), default_words("cpu"))
    used = device_memory(m, Placement(-1, ()), n_ctx, type_k, type_v, n_ubatch=n_ubatch,
                         n_batch=n_batch, op_offload=op_offload).total / GIB
    every = FitArgs(LlamaFlags(n_gpu_layers=m.n_layer + 1))
    if used <= vram_gib:
        return FitDefault(every, "fits", n_ctx, vram_gib, 0.0, used, 0.0, (), "")
    return FitDefault(every, "oom", n_ctx, vram_gib, 0.0, used, float(moe),
                      tuple(range(m.n_layer)),
                      f"every layer on the GPU needs {used:.2f} GiB, more than the "
                      f"{vram_gib:.2f} GiB budget: without --fit (before "
                      f"b{first_build('fit')}) it does not load")
