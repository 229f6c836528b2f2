"""The reference executor's measurement loop: every candidate, prompt and trial at each cache
size and CPU-thread count, written as ``cope.measurements/1``
(docs/design.md#measurement-and-evaluation)."""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..matrix import Execution, select_candidates
from ..measurements import Measurements
from ..mechanisms.accelerator import Accelerator
from ..mechanisms.rig import Rig
from ..mechanisms.threads import host_threads
from ..mechanisms.timing import load_average, progress_bar
from ..mechanisms.weights import model_dtype
from ..profile.data import Profile
from ..profile.pricing import check_compatible, cost_selected_split
from ..replay.engine import check_ks
from ..trace.data import Trace, fill_order
from .decode import CandidateDecoder


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
        Seed of the synthetic weights.
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


def measure(trace: Trace, experts_per_layer: int | Sequence[int], *,
            calibration: Trace | None = None, cpu_threads: Sequence[int] = (1,),
            candidates: Sequence[str] | None = None, profile: Profile | None = None,
            settings: ExecutorSettings = ExecutorSettings(), progress: bool = True,
            fill_by_id: bool = False) -> Measurements:
    """Run every candidate for real and return measured TPOT per (candidate, prompt, trial).

    Parameters
    ----------
    trace : Trace
        Routing to replay; its geometry sets every tensor shape.
    experts_per_layer : int or sequence of int
        Cache sizes ``K``.
    calibration : Trace, optional
        Popularity for the initial fill (default: the trace itself).
    cpu_threads : sequence of int
        Host threads for CPU experts (operating points).
    candidates : sequence of str, optional
    profile : Profile, optional
        Supplies cost_selected's split (else it is measured first).
    settings : ExecutorSettings
    progress : bool
        Show a progress bar on stderr.
    """
    g = trace.model
    check_compatible(trace, None, calibration)
    if profile is not None:
        check_compatible(trace, profile)
    ks = [int(k) for k in check_ks(experts_per_layer, g.n_experts)]
    threads_list = _threads(cpu_threads)
    cands = list(select_candidates(candidates or None))
    dtype = model_dtype(g, settings.dtype)
    order = fill_order(calibration if calibration is not None else trace, by_id=fill_by_id)
    rows = []
    total = len(threads_list) * len(ks) * settings.trials * trace.n_prompts * len(cands)
    bar = progress_bar(total, progress, "cope measure", "run")
    load_before = load_average()
    with Accelerator(settings.device, settings.accel_threads, link_gbps=settings.link_gbps,
                     cpu_slowdown=settings.cpu_slowdown) as acc:
        rig = Rig.build(acc, g, dtype, pool_slots=max(ks) * g.n_layers,
                        max_context=int(trace.context.max()), seed=settings.seed)
        for threads in threads_list:
            with host_threads(threads):
                split = (splits_for(profile, rig, threads, progress)
                         if any(c.execution is Execution.COST_SELECTED for c in cands) else None)
                if settings.warmup_prompts:
                    warm = CandidateDecoder(rig, cands[0], ks[0], order, split)
                    for p in range(trace.n_prompts):
                        warm.run_prompt(trace, p)
                for K in ks:
                    decoders = [CandidateDecoder(rig, c, K, order, split) for c in cands]
                    for d in decoders:
                        if settings.warmup_tokens:
                            d.run_prompt(trace, 0, tokens=settings.warmup_tokens)
                    cell = []
                    for trial in range(settings.trials):
                        for p in range(trace.n_prompts):
                            for i in run_order(len(decoders), trial, p, settings.seed):
                                run = decoders[i].run_prompt(trace, p)
                                cell.append(((i, p, trial), (
                                    decoders[i].candidate.id, int(trace.prompt_ids[p]), trial,
                                    run.tpot_us, K, threads, 100.0)))
                                bar.update(1)
                    # the file lists a cell's rows in candidate, prompt, trial order, whatever
                    # order they ran in
                    rows += [row for _, row in sorted(cell, key=lambda kr: kr[0])]
        platform = acc.describe()
    bar.close()
    table = pd.DataFrame(rows, columns=["candidate", "prompt", "trial", "tpot_us", "K",
                                        "cpu_threads", "gpu_share"])
    platform["dtype"] = str(dtype).replace("torch.", "")
    # other jobs on the machine inflate timings; say how busy it was
    platform["load_average"] = [load_before, load_average()]
    platform["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "default")
    notes = (f"reference executor on the {platform['accelerator']} accelerator "
             f"({platform['gpu']}); {settings.trials} trials, {settings.warmup_tokens} warm-up "
             f"tokens per candidate"
             f"{', every prompt decoded once untimed first' if settings.warmup_prompts else ''}"
             f"; synthetic weights, routing replayed from "
             f"{Path(trace.path).name if trace.path else 'the trace'}")   # no machine's path
    return Measurements(table=table, model=g, platform=platform,
                        created=datetime.now(UTC).isoformat(timespec="seconds"),
                        notes=notes)


def run_order(n: int, trial: int, prompt: int, seed: int = 0) -> list[int]:
    """The order in which ``n`` candidates decode one prompt in one trial: every candidate once,
    a fresh seeded shuffle per (trial, prompt), so a slow drift or a busy minute of the machine
    falls on all of them alike and no candidate always runs right after another.

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


def _threads(values: Sequence[int]) -> list[int]:
    out = []
    for t in values:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise CopeInputError(f"expected whole numbers >= 1, got {t!r}", field="--cpu-threads")
        if int(t) not in out:
            out.append(int(t))
    if not out:
        raise CopeInputError("no CPU thread count given", field="--cpu-threads")
    return out
