"""``cope verify --llama-bench``: predict llama.cpp's configurations for a model file and a
machine, race the contenders with llama-bench, name the verified one, and refit the constants
the machine decides from what was measured (docs/design.md#verifying-with-llama-bench).

The contenders (:func:`plan`):

* with a GPU: the plain ``--n-cpu-moe n`` placements that fit the card (llama.cpp's own count of
  its memory, :func:`~cope_core.llamacpp.placement.vram.device_memory`, at ``n_ctx``, beside
  ``--fit``'s 1 GiB margin), the fastest predicted and every other within the model's measured
  error of it (:mod:`cope_core.estimate.model_error`), at most ``max_contenders``; llama.cpp's
  default ``--fit`` (llama-bench ``-fitt 1024``, priced by the port
  :func:`~cope_core.llamacpp.placement.fit.fit_default`) when the build has ``-fitt``; llama.cpp's
  own MoE cache is listed as skipped (its price needs a routing trace; a build without
  ``--moe-cache-mib`` cannot run it at all);
* without a GPU (CPU only, ``-ngl 0``): the thread counts up to the machine's threads (powers
  of two and the threads themselves), priced by :mod:`cope_core.estimate.cpu_only`, chosen the
  same way.

The race (:func:`race`) measures every contender left once per round (its repetitions are the
trials, the round is the prompt the paired test pairs on, so a burst of load on a shared machine
hits the round's contenders alike), judges with :func:`cope_core.estimate.racing.judge` from the
second round on, and stops when one is left, when the rest are equivalent to the leader, or at
``max_rounds``. After each round the state is written atomically; a run given the same state
file resumes after the last round it holds.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from ...errors import CopeInputError
from ...estimate.cpu_only import host_spec, spec_tpot
from ...estimate.model_error import model_error
from ...estimate.racing import judge
from ...files import write_atomic
from ...geometry import DEFAULT_CONTEXT
from ...machine import Machine
from ...models import resolve_model
from ...platforms import PlatformSpec
from ...profile.analytic import analytic_profile
from ..cache.cache_search import placement_tpot
from ..placement.command import LlamaFlags, n_cpu_moe_patterns
from ..placement.fit import FIT_MARGIN, fit_default
from ..placement.vram import Placement, device_memory, read_llama_model
from .bench_run import BenchBuild, run_bench

STATE_SCHEMA = "cope.verify-llamabench-state/1"


@dataclass(frozen=True)
class BenchContender:
    """One configuration: its name, llama-bench arguments, threads, MoE layers on the CPU
    (None on a CPU-only machine) and predicted time per token (µs)."""

    name: str
    args: tuple[str, ...]
    threads: int
    n_cpu_moe: float | None
    predicted_us: float


@dataclass(frozen=True)
class BenchSettings:
    """How the race runs: llama-bench ``-r`` and ``-n`` per measurement, rounds, the
    equivalence margin (fraction), the paired test's resamples and seed, the context the
    placements must fit and how many contenders enter at most."""

    repetitions: int = 3
    n_gen: int = 32
    max_rounds: int = 5
    min_rounds: int = 2
    tolerance: float = 0.03
    draws: int = 1000
    seed: int = 0
    n_ctx: int = DEFAULT_CONTEXT
    max_contenders: int = 3


@dataclass(frozen=True)
class Plan:
    """The contenders (fastest predicted first), what was skipped and why, every configuration
    predicted (``curve``: ``name, n_cpu_moe, threads, predicted_us``) and how to re-price one
    under another spec (for the refit)."""

    contenders: tuple[BenchContender, ...]
    skipped: tuple[tuple[str, str], ...]
    curve: tuple[BenchContender, ...]
    spec: PlatformSpec
    price: Callable[[PlatformSpec, BenchContender], float] = field(repr=False, compare=False)


def _within(options: list[BenchContender], limit: int) -> list[BenchContender]:
    """The fastest predicted and those within the model's 95 % error of it, at most ``limit``,
    topped up with the next fastest to two (a race, and a refit with a point held out)."""
    ranked = sorted(options, key=lambda o: o.predicted_us)
    band = math.exp(1.96 * model_error().sigma("cope"))
    near = [o for o in ranked if o.predicted_us <= ranked[0].predicted_us * band]
    return (near if len(near) >= 2 else ranked[:2])[:max(limit, 2)]


def plan_bench_race(model_path: str | os.PathLike, machine: Machine, build: BenchBuild,
         settings: BenchSettings) -> Plan:
    """The contenders of a model file on a machine (module docstring)."""
    g = resolve_model(os.fspath(model_path))
    context = (settings.n_gen + 1) / 2          # decode token i attends to i + 1 tokens
    t = machine.threads
    if machine.spec is None:                    # CPU only: the thread counts
        spec = host_spec(machine.cpu, machine.memory)

        def price_cpu(s: PlatformSpec, c: BenchContender) -> float:
            return spec_tpot(g, s, c.threads, context)
        # up to the threads the user gives llama.cpp (more would take cores it left to others)
        counts = sorted({n for n in (1, 2, 4, 8, 16, 32, 64) if n <= t} | {t})
        curve = [BenchContender(f"-t {n}", tuple(LlamaFlags.cpu_only(n).argv("bench")), n, None,
                                0.0) for n in counts]
        curve = [c.__class__(**{**asdict(c), "args": c.args,
                                "predicted_us": price_cpu(spec, c)}) for c in curve]
        return Plan(tuple(_within(curve, settings.max_contenders)), (), tuple(curve), spec,
                    price_cpu)
    spec = machine.spec

    @lru_cache(maxsize=64)
    def profile_of(s: PlatformSpec):
        return analytic_profile(g, s, cpu_threads=[t], gpu_shares=[100.0])

    def price_gpu(s: PlatformSpec, c: BenchContender) -> float:
        # fit's part of a layer's experts is priced pro rata (placement_tpot's arithmetic is
        # linear in the layer count)
        n = cast(Sequence[int], [c.n_cpu_moe or 0.0])
        return float(placement_tpot(profile_of(s), g, n, context, cpu_threads=t)[0])
    m = read_llama_model(model_path)
    vram = int(machine.vram_bytes)
    curve, skipped = [], []
    for n in range(g.n_layers + 1):
        p = Placement(-1, n_cpu_moe_patterns(n))
        if device_memory(m, p, settings.n_ctx).total + FIT_MARGIN > vram:
            continue
        c = BenchContender(f"--n-cpu-moe {n}",
                           tuple(LlamaFlags.placed(m.n_layer, t, n).argv("bench")), t, float(n),
                           0.0)
        curve.append(BenchContender(**{**asdict(c), "args": c.args,
                                       "predicted_us": price_gpu(spec, c)}))
    if not curve:
        raise CopeInputError(f"no --n-cpu-moe placement of {m.path} fits the GPU's "
                             f"{vram / 2**30:.1f} GiB at -c {settings.n_ctx}", field="--model")
    chosen = _within(curve, settings.max_contenders)
    if build.supports("-fitt"):
        fd = fit_default(m, vram, n_ctx=settings.n_ctx)
        if fd.priced:
            c = BenchContender("--fit (llama.cpp's default)",
                               tuple(LlamaFlags(fit=True, fit_margin_mib=FIT_MARGIN // 2**20,
                                                threads=t).argv("bench")), t,
                               float(fd.host_layers), 0.0)
            chosen.append(BenchContender(**{**asdict(c), "args": c.args,
                                            "predicted_us": price_gpu(spec, c)}))
        else:
            skipped.append(("--fit (llama.cpp's default)", fd.why_not_priced))
    else:
        skipped.append(("--fit (llama.cpp's default)", "this llama-bench has no -fitt"))
    skipped.append(("llama.cpp's MoE cache", "this llama-bench has no --moe-cache-mib"
                    if not build.supports("--moe-cache-mib") else
                    "its price needs a routing trace (cope export --format llama.cpp prices it)"))
    chosen.sort(key=lambda c: c.predicted_us)
    return Plan(tuple(chosen), tuple(skipped), tuple(curve), spec, price_gpu)


@dataclass
class RaceState:
    """What a race has measured so far (written after every round)."""

    model: dict[str, Any]
    contenders: list[dict[str, Any]]
    settings: dict[str, Any]
    rounds: int = 0
    alive: list[str] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    runs: list[list[Any]] = field(default_factory=list)
    stop: str = ""

    def to_json(self) -> str:
        return json.dumps({"schema": STATE_SCHEMA, **asdict(self)}, indent=1,
                          allow_nan=False) + "\n"


def model_identity(path: str | os.PathLike) -> dict[str, Any]:
    st = Path(path).stat()
    return {"path": os.fspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def load_state(path: str | os.PathLike, fresh: RaceState) -> RaceState:
    """The state at ``path`` when it is this race's (same model file, contenders and settings),
    else ``fresh``; a state file of another race is an error, not overwritten."""
    src = os.fspath(path)
    if not os.path.exists(src):
        return fresh
    try:
        d = json.loads(Path(src).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CopeInputError(f"not a readable state file ({exc})", source=src) from None
    if not isinstance(d, dict) or d.pop("schema", None) != STATE_SCHEMA:
        raise CopeInputError(f"expected {STATE_SCHEMA!r}", source=src, field="schema")
    for key in ("model", "contenders", "settings"):
        if d.get(key) != getattr(fresh, key):
            raise CopeInputError(f"the state is of another race ({key} differs): remove it or "
                                 "give another --state", source=src, field=key)
    try:
        return RaceState(**d)
    except TypeError as exc:
        raise CopeInputError(f"not a state file of this version ({exc})", source=src) from None


def run_bench_race(p: Plan, build: BenchBuild, model_path: str | os.PathLike,
                   settings: BenchSettings, state_path: str | os.PathLike, *,
                   env: dict[str, str] | None = None,
                   log: Callable[[str], None] = lambda s: None) -> RaceState:
    """Measure the contenders in rounds until the race stops (module docstring)."""
    by_name = {c.name: c for c in p.contenders}
    fresh = RaceState(model_identity(model_path), [asdict(c) | {"args": list(c.args)}
                                                   for c in p.contenders],
                      asdict(settings), alive=list(by_name))
    st = load_state(state_path, fresh)
    if st.rounds:
        log(f"resuming after round {st.rounds} ({os.fspath(state_path)})")
    rng = np.random.default_rng(settings.seed)
    while not st.stop:
        if len(st.alive) == 1 and st.rounds:
            st.stop = "one left"
            break
        if st.rounds >= settings.max_rounds:
            st.stop = "max rounds"
            break
        rnd = st.rounds
        k = rnd % len(st.alive)
        for name in st.alive[k:] + st.alive[:k]:         # a new order each round
            row = run_bench(build, model_path, by_name[name].args,
                            repetitions=settings.repetitions, n_gen=settings.n_gen, env=env)
            st.runs += [[name, rnd, i, 1e6 / ts] for i, ts in enumerate(row.samples_ts)]
        st.rounds += 1
        if st.rounds >= settings.min_rounds:
            table = pd.DataFrame(st.runs, columns=["candidate", "prompt", "trial", "tpot_us"])
            v = judge(table, st.alive, settings.tolerance, settings.draws, rng)
            for name, pct in v.dropped:
                st.dropped.append({"name": name, "round": rnd, "behind_pct": pct,
                                   "measured_us": v.measured_us[name]})
            st.alive = [c for c in st.alive if c not in {n for n, _ in v.dropped}]
            st.alive.sort(key=lambda c: v.measured_us[c])
            if v.equivalent and len(st.alive) > 1:
                st.stop = "equivalent"
        log(f"round {st.rounds}: left {', '.join(st.alive)}")
        write_atomic(state_path, st.to_json(), overwrite=True)
    write_atomic(state_path, st.to_json(), overwrite=True)
    return st


def measured_us(st: RaceState) -> dict[str, float]:
    """Each contender's measured time per token: the median over a round's repetitions, the
    mean over rounds (as the race judges it)."""
    t = pd.DataFrame(st.runs, columns=["candidate", "prompt", "trial", "tpot_us"])
    med = t.groupby(["candidate", "prompt"])["tpot_us"].median().groupby("candidate").mean()
    return {str(k): float(v) for k, v in med.items()}
