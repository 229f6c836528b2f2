"""One cell of the reference executor — a cache size ``K`` at one CPU-thread count — and the
machine it runs on, shared by ``cope measure`` (every candidate, every trial) and ``cope verify``
(rounds of the contenders that are left).

Within a trial every candidate still running decodes each prompt once, in a fresh seeded shuffle
per (trial, prompt) (:func:`run_order`), so a slow drift or a busy minute of the machine falls on
all of them alike and no candidate always runs right after another.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..matrix import Candidate, Execution
from ..mechanisms.accelerator import Accelerator
from ..mechanisms.rig import Rig
from ..mechanisms.threads import host_threads
from ..mechanisms.weights import model_dtype
from ..profile.data import Profile
from ..profile.pricing import cost_selected_split
from ..trace.data import Trace
from .decode import CandidateDecoder

#: (candidate index, prompt index, trial) -> measured TPOT in microseconds
Runs = dict[tuple[int, int, int], float]


@dataclass(frozen=True)
class ExecutorSettings:
    """How the reference executor runs.

    Attributes
    ----------
    device : {"cpu", "cuda"}
        ``cpu`` runs the emulated accelerator.
    accel_threads : int
        Torch threads of the emulated accelerator's compute worker.
    trials : int
        Runs of every (candidate, prompt); candidates are interleaved within a trial so slow
        drift of the machine spreads over all of them.
    warmup_tokens : int
        Tokens decoded (and discarded) per candidate before its first measured prompt.
    warmup_prompts : bool
        Decode every prompt once, untimed, per CPU-thread count before the first measured run.
        The first time a token meets a new context length (attention shapes) or expert count,
        the CPU math libraries prepare kernels for the new shapes; on the 2-core development
        machine that made the first full pass over a prompt 15-25 % slower, a cost that would
        otherwise fall on whichever candidate runs that prompt first.
    dtype : str, optional
        Weight dtype name (default from the geometry's ``dtype_bytes``).
    seed : int
        Seed of the synthetic weights and of the run order.
    link_gbps, cpu_slowdown
        The emulated platform's paced link and host speed
        (:class:`~cope_core.mechanisms.accelerator.Accelerator`).
    """

    device: str = "cpu"
    accel_threads: int = 1
    link_gbps: float | None = None
    cpu_slowdown: float = 1.0
    trials: int = 3
    warmup_tokens: int = 2
    warmup_prompts: bool = True
    dtype: str | None = None
    seed: int = 0


def run_order(n: int, trial: int, prompt: int, seed: int = 0) -> list[int]:
    """The order in which ``n`` candidates decode one prompt in one trial: every candidate once,
    a fresh seeded shuffle per (trial, prompt).

    Parameters
    ----------
    n : int
        Number of candidates.
    trial, prompt : int
        Trial number and prompt position; with ``seed`` they fix the shuffle (a rerun with the
        same settings runs in the same order).

    Returns
    -------
    list of int
        A permutation of ``range(n)``.
    """
    return np.random.default_rng([seed, trial, prompt]).permutation(n).tolist()


@contextmanager
def executor_rig(trace: Trace, ks: Sequence[int], settings: ExecutorSettings
                 ) -> Iterator[tuple[Accelerator, Rig]]:
    """The accelerator and the rig (every expert stored, ``max(K) * L`` slots) for ``trace``."""
    g = trace.model
    with Accelerator(settings.device, settings.accel_threads, link_gbps=settings.link_gbps,
                     cpu_slowdown=settings.cpu_slowdown) as acc:
        yield acc, Rig.build(acc, g, model_dtype(g, settings.dtype),
                             pool_slots=max(ks) * g.n_layers,
                             max_context=int(trace.context.max()), seed=settings.seed)


def splits_for(profile: Profile | None, rig: Rig, threads: int, progress: bool) -> np.ndarray:
    """cost_selected's CPU share per hit count: from the profile at this thread count when
    given (what the estimators use), else measured now with the profiler's schedule code."""
    if profile is not None:
        return cost_selected_split(profile.resolve(threads))[0]
    from ..profile.measure import measure_cost_selected_split
    if progress:
        print(f"cope: measuring cost_selected splits at {threads} CPU threads (no --profile)",
              file=sys.stderr)
    return measure_cost_selected_split(rig, threads)


@contextmanager
def at_threads(rig: Rig, trace: Trace, cands: Sequence[Candidate], threads: int,
               profile: Profile | None, order: np.ndarray, warm_k: int,
               settings: ExecutorSettings, progress: bool) -> Iterator[np.ndarray | None]:
    """Run with ``threads`` host threads: yields cost_selected's split (None when no candidate
    needs it), after the untimed pass over every prompt when the settings ask for one."""
    with host_threads(threads):
        split = (splits_for(profile, rig, threads, progress)
                 if any(c.execution is Execution.COST_SELECTED for c in cands) else None)
        if settings.warmup_prompts:
            warm = CandidateDecoder(rig, cands[0], warm_k, order, split)
            for p in range(trace.n_prompts):
                warm.run_prompt(trace, p)
        yield split


class CellRunner:
    """The decoders of one cell, warmed up, and the runs made with them.

    Parameters
    ----------
    rig, trace, cands, K, order, split
        As for :class:`~cope_core.executor.decode.CandidateDecoder`.
    settings : ExecutorSettings
        Its warm-up tokens and the run-order seed.
    on_run : callable, optional
        Called after every measured run (a progress bar's update).
    """

    def __init__(self, rig: Rig, trace: Trace, cands: Sequence[Candidate], K: int,
                 order: np.ndarray, split: np.ndarray | None, settings: ExecutorSettings,
                 on_run=None):
        self.trace, self.settings, self.on_run = trace, settings, on_run
        self.decoders = [CandidateDecoder(rig, c, K, order, split) for c in cands]
        self.runs: Runs = {}
        for d in self.decoders:
            if settings.warmup_tokens:
                d.run_prompt(trace, 0, tokens=settings.warmup_tokens)

    def run(self, i: int, p: int) -> float:
        """Decode prompt position ``p`` under candidate ``i`` once; its TPOT (not recorded)."""
        tpot = self.decoders[i].run_prompt(self.trace, p).tpot_us
        if self.on_run is not None:
            self.on_run()
        return tpot

    def trial(self, trial: int, alive: Sequence[int] | None = None) -> Runs:
        """One trial of the candidates ``alive`` (default: all) over every prompt, interleaved
        (:func:`run_order`); recorded in :attr:`runs` and returned."""
        alive = list(range(len(self.decoders))) if alive is None else list(alive)
        out: Runs = {}
        for p in range(self.trace.n_prompts):
            for j in run_order(len(alive), trial, p, self.settings.seed):
                out[(alive[j], p, trial)] = self.run(alive[j], p)
        self.runs.update(out)
        return out

    def rows(self, K: int, threads: int) -> list[tuple]:
        """The recorded runs as measurement rows, in candidate, prompt, trial order (whatever
        order they ran in)."""
        ids = self.trace.prompt_ids
        return [(self.decoders[i].candidate.id, int(ids[p]), t, v, K, threads, 100.0)
                for (i, p, t), v in sorted(self.runs.items())]
