"""The reference executor's measurement loop: every candidate, prompt and trial at each cache
size and CPU-thread count, written as ``cope.measurements/1``
(docs/design.md#trustworthy-measurement).

Per cell: the trials, each every candidate once per prompt in a shuffled order; after each trial
the reference candidate (the first) decodes the first prompt again, and those runs with its own
trials give the cell's noise floor; then every outlying trial (``measurements.outlier_trials``)
is measured once more, both values kept. A finished cell is handed to ``checkpoint`` so an
interrupted run can resume from its file (``resume``).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..matrix import same_work_groups, select_candidates
from ..measurements import OUTLIER_RULE, Measurements, noise_floor_pct, outlier_trials
from ..mechanisms.timing import load_average, progress_bar
from ..mechanisms.weights import model_dtype
from ..profile.data import Profile
from ..profile.pricing import check_compatible
from ..replay.engine import check_ks
from ..trace.data import Trace, fill_order
from .cell import CellRunner, ExecutorSettings, at_threads, executor_rig, run_order, splits_for

COLUMNS = ["candidate", "prompt", "trial", "tpot_us", "K", "cpu_threads", "gpu_share"]

__all__ = ["ExecutorSettings", "measure", "run_order", "splits_for"]


def measure(trace: Trace, experts_per_layer: int | Sequence[int], *,
            calibration: Trace | None = None, cpu_threads: Sequence[int] = (1,),
            candidates: Sequence[str] | None = None, profile: Profile | None = None,
            settings: ExecutorSettings = ExecutorSettings(), progress: bool = True,
            fill_by_id: bool = False, resume: Measurements | None = None,
            checkpoint: Callable[[Measurements], None] | None = None) -> Measurements:
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
        Show a progress bar with the time left on stderr.
    fill_by_id : bool
        Fill by expert id instead of popularity.
    resume : Measurements, optional
        The file of an interrupted run with the same inputs and settings: its finished cells
        are kept and not measured again.
    checkpoint : callable, optional
        Called with the measurements so far (``progress.complete`` false) after every cell.

    Returns
    -------
    Measurements
        With ``quality`` (per cell: noise floor, outliers measured again, same-work groups)
        and ``progress`` (complete).
    """
    g = trace.model
    check_compatible(trace, None, calibration)
    if profile is not None:
        check_compatible(trace, profile)
    ks = [int(k) for k in check_ks(experts_per_layer, g.n_experts)]
    threads_list = _threads(cpu_threads)
    cands = list(select_candidates(candidates or None))
    order = fill_order(calibration if calibration is not None else trace, by_id=fill_by_id)
    plan = _plan(trace, calibration, ks, threads_list, cands, settings, fill_by_id)
    rows, cells, done = _resumed(resume, plan)
    todo = [(t, K) for t in threads_list for K in ks if [K, t] not in done]
    per_cell = settings.trials * (trace.n_prompts * len(cands) + 1)
    bar = progress_bar(len(todo) * per_cell, progress, "cope measure", "run")
    load_before = load_average()
    with executor_rig(trace, ks, settings) as (acc, rig):
        platform = _platform(acc.describe(), model_dtype(g, settings.dtype), load_before)
        for threads in threads_list:
            cell_ks = [K for t, K in todo if t == threads]
            if not cell_ks:
                continue
            with at_threads(rig, trace, cands, threads, profile, order, ks[0], settings,
                            progress) as split:
                for K in cell_ks:
                    runner = CellRunner(rig, trace, cands, K, order, split, settings,
                                        on_run=lambda: bar.update(1))
                    quality = _measure_cell(runner, K, threads, settings, bar)
                    quality["same_work"] = [
                        {"candidates": list(ids), "why": why}
                        for ids, why in same_work_groups(cands, K, g.n_experts, split)]
                    rows += runner.rows(K, threads)
                    cells.append(quality)
                    done.append([K, threads])
                    if checkpoint is not None and len(done) < len(ks) * len(threads_list):
                        checkpoint(_record(trace, rows, platform, settings, cells, plan, done,
                                           complete=False))
        platform["load_average"] = [load_before, load_average()]
    bar.close()
    return _record(trace, rows, platform, settings, cells, plan, done, complete=True)


def _measure_cell(runner: CellRunner, K: int, threads: int, settings: ExecutorSettings,
                  bar) -> dict[str, Any]:
    """The trials of one cell, the noise-floor runs and the re-measured outliers; the cell's
    ``quality`` entry."""
    T, P = settings.trials, runner.trace.n_prompts
    extra = []
    for t in range(T):
        runner.trial(t)
        extra.append(runner.run(0, 0))           # the reference candidate, again
    samples = [runner.runs[(0, 0, t)] for t in range(T)] + extra
    noise = noise_floor_pct(samples)
    flagged = [(i, p, t) for i in range(len(runner.decoders)) for p in range(P)
               for t in outlier_trials([runner.runs[(i, p, u)] for u in range(T)], noise)]
    bar.total += len(flagged)
    bar.refresh()
    next_trial: dict[tuple[int, int], int] = {}
    outliers = []
    ids = runner.trace.prompt_ids
    for n in run_order(len(flagged), K, threads, settings.seed):
        i, p, t = flagged[n]
        j = next_trial.get((i, p), T)
        next_trial[(i, p)] = j + 1
        runner.runs[(i, p, j)] = again = runner.run(i, p)
        outliers.append({"candidate": runner.decoders[i].candidate.id, "prompt": int(ids[p]),
                         "trial": t, "tpot_us": runner.runs[(i, p, t)], "again_trial": j,
                         "again_us": again})
    outliers.sort(key=lambda o: (o["candidate"], o["prompt"], o["trial"]))
    return {"K": K, "cpu_threads": threads, "gpu_share": 100.0,
            "reference": {"candidate": runner.decoders[0].candidate.id, "prompt": int(ids[0]),
                          "samples_us": samples,
                          "noise_pct": None if np.isnan(noise) else noise},
            "outliers": outliers}


def _platform(described: dict, dtype, load_before: float | None) -> dict[str, Any]:
    platform = dict(described)
    platform["dtype"] = str(dtype).replace("torch.", "")
    # other jobs on the machine inflate timings; say how busy it was
    platform["load_average"] = [load_before, None]
    platform["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "default")
    return platform


def _record(trace: Trace, rows: list, platform: dict, settings: ExecutorSettings,
            cells: list, plan: dict, done: list, *, complete: bool) -> Measurements:
    table = pd.DataFrame(rows, columns=COLUMNS)
    key = {(c["K"], c["cpu_threads"]): c for c in cells}
    notes = (f"reference executor on the {platform['accelerator']} accelerator "
             f"({platform['gpu']}); {settings.trials} trials interleaved, a noise-floor run "
             f"after each, outliers measured again; {settings.warmup_tokens} warm-up "
             f"tokens per candidate"
             f"{', every prompt decoded once untimed first' if settings.warmup_prompts else ''}"
             f"; synthetic weights, routing replayed from "
             f"{Path(trace.path).name if trace.path else 'the trace'}")   # no machine's path
    return Measurements(table=table, model=trace.model, platform=dict(platform),
                        created=datetime.now(UTC).isoformat(timespec="seconds"), notes=notes,
                        quality={"outlier_rule": OUTLIER_RULE,
                                 "cells": [key[k] for k in sorted(key)]},
                        progress={"complete": complete, "cells_done": sorted(done),
                                  "plan": plan})


def _digest(trace: Trace | None) -> str | None:
    if trace is None:
        return None
    h = hashlib.sha256(np.ascontiguousarray(trace.routed).tobytes())
    h.update(np.ascontiguousarray(trace.context).tobytes())
    return h.hexdigest()[:16]


def _plan(trace: Trace, calibration: Trace | None, ks: list[int], threads: list[int],
          cands: list, settings: ExecutorSettings, fill_by_id: bool) -> dict[str, Any]:
    """What a resumed run must share with the run it continues."""
    return {"trace": _digest(trace), "calibration": _digest(calibration), "K": ks,
            "cpu_threads": threads, "candidates": [c.id for c in cands],
            "fill_by_id": fill_by_id, **{k: v for k, v in vars(settings).items()}}


def _resumed(resume: Measurements | None, plan: dict) -> tuple[list, list, list]:
    """Rows, quality cells and finished cells of ``resume`` (checked against ``plan``)."""
    if resume is None:
        return [], [], []
    src = resume.path
    old = resume.progress.get("plan")
    if not isinstance(old, dict):
        raise CopeInputError("no resumable run recorded (a file written before resume existed, "
                             "or not by cope measure): start again with --force", source=src,
                             field="progress.plan")
    for key, value in plan.items():
        if old.get(key) != value:
            raise CopeInputError(f"the interrupted run used {key}={old.get(key)!r}, this one "
                                 f"{value!r}: resume with the same inputs and settings",
                                 source=src, field=f"progress.plan.{key}")
    done = [list(map(int, c)) for c in resume.progress.get("cells_done", [])]
    t = resume.table
    finished = {(d[0], d[1]) for d in done}
    keep = [(int(k), int(c)) in finished for k, c in zip(t["K"], t["cpu_threads"])]
    rows = list(t[keep][COLUMNS].itertuples(index=False, name=None))
    cells = [c for c in resume.quality.get("cells", []) if [c["K"], c["cpu_threads"]] in done]
    return rows, cells, done


def _threads(values: Sequence[int]) -> list[int]:
    out = []
    for t in values:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise CopeInputError(f"expected whole numbers >= 1, got {t!r}", field="--threads")
        if int(t) not in out:
            out.append(int(t))
    if not out:
        raise CopeInputError("no CPU thread count given", field="--threads")
    return out
