"""``cope verify``: measure only what a prediction leaves open (docs/design.md#verifying-a-pick).

Per cell: predict every candidate (:func:`cope_core.estimate.predict.predict`), take the
contenders (:func:`cope_core.estimate.racing.contenders`), and race them on the reference executor
— rounds of paired, interleaved trials (:class:`cope_core.executor.cell.CellRunner`), each round
judged by :func:`cope_core.estimate.racing.judge` — until one is left, the rest are equivalent
within the tolerance, the rounds run out or the time budget does.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..estimate.noise import measured_interval
from ..estimate.predict import predict
from ..estimate.racing import contenders, judge
from ..executor.cell import CellRunner, ExecutorSettings, at_threads, executor_rig
from ..files import describe_input
from ..geometry import GIB
from ..matrix import CANDIDATE_IDS, get_candidate
from ..mechanisms.weights import model_dtype
from ..profile.data import Profile
from ..replay.engine import check_ks
from ..trace.data import Trace, fill_order
from ..version import __version__
from .record import VerifyCell, VerifyRecord


@dataclass(frozen=True)
class VerifySettings:
    """How the race runs.

    Attributes
    ----------
    tolerance : float
        Equivalence margin, a fraction of the leader's TPOT (0.02: 2 %).
    min_rounds : int
        Rounds before the first verdict (a paired test needs pairs to resample).
    max_rounds : int
        The race ends after this many rounds whatever is left: by default twice the trials the
        full measurement gives every candidate.
    budget_min : float, optional
        Minutes for the whole run, shared out over the cells left; a round that would not fit
        is not started.
    full_trials : int
        Trials of the full measurement the savings are counted against (``cope measure``'s).
    draws, seed
        Bootstrap resamples and seed of the paired tests and the verified interval.
    """

    tolerance: float = 0.02
    min_rounds: int = 2
    max_rounds: int = 6
    budget_min: float | None = None
    full_trials: int = 3
    draws: int = 1000
    seed: int = 0

    def check(self) -> None:
        for name, ok, want in (("tolerance", 0 <= self.tolerance < 1, "0 <= x < 1 (a fraction)"),
                               ("min_rounds", self.min_rounds >= 2, ">= 2"),
                               ("max_rounds", self.max_rounds >= self.min_rounds,
                                ">= min_rounds"),
                               ("full_trials", self.full_trials >= 1, ">= 1"),
                               ("draws", self.draws >= 0, ">= 0")):
            if not ok:
                raise CopeInputError(f"got {getattr(self, name)!r}, expected {want}",
                                     field=f"--{name.replace('_', '-')}")
        if self.budget_min is not None and not self.budget_min > 0:
            raise CopeInputError(f"got {self.budget_min!r}, expected minutes > 0",
                                 field="--budget-min")


def verify(trace: Trace, profile: Profile, calibration: Trace | None = None, *,
           experts_per_layer: int | Sequence[int] | None = None, vram_gib: float | None = None,
           cpu_threads: Sequence[int] | None = None, gpu_share: float | None = None,
           settings: VerifySettings = VerifySettings(),
           executor: ExecutorSettings = ExecutorSettings(), fill_by_id: bool = False,
           progress: bool = True) -> VerifyRecord:
    """Verify COPE's pick at every (K, CPU threads) by racing the contenders for real.

    Parameters
    ----------
    trace, profile, calibration
        As for :func:`cope_core.estimate.predict.predict`.
    experts_per_layer : int or sequence of int, optional
        Cache sizes ``K``; give exactly one of it and ``vram_gib``.
    vram_gib : float, optional
        VRAM budget; ``K`` follows from the memory model.
    cpu_threads : sequence of int, optional
        Operating points (default: the profile's most threads).
    gpu_share : float, optional
        GPU share of the prediction's operating point.
    settings : VerifySettings
    executor : ExecutorSettings
        The reference executor (its ``trials`` is unused: the race sets the rounds).
    fill_by_id : bool
    progress : bool
        One line per round on stderr.

    Returns
    -------
    VerifyRecord
    """
    settings.check()
    g = trace.model
    if (experts_per_layer is None) == (vram_gib is None):
        raise CopeInputError("give exactly one of experts per layer (K) and a VRAM budget",
                             field="--experts-per-layer")
    ks = ([g.experts_per_layer_for_vram(vram_gib * GIB)] if vram_gib is not None
          else [int(k) for k in check_ks(experts_per_layer, g.n_experts)])   # type: ignore[arg-type]
    preds = {}
    for t in (list(cpu_threads) if cpu_threads else [None]):
        df = predict(trace, profile, ks, calibration, cpu_threads=t, gpu_share=gpu_share,
                     fill_by_id=fill_by_id, draws=settings.draws or 0, seed=settings.seed)
        preds[int(df.attrs["cpu_threads"])] = df
    order = fill_order(calibration if calibration is not None else trace, by_id=fill_by_id)
    rng = np.random.default_rng(settings.seed)
    deadline = (None if settings.budget_min is None
                else time.perf_counter() + 60 * settings.budget_min)
    cells: list[VerifyCell] = []
    n_cells = len(preds) * len(ks)
    with executor_rig(trace, ks, executor) as (acc, rig):
        platform = dict(acc.describe(), dtype=str(model_dtype(g, executor.dtype))
                        .replace("torch.", ""))
        for threads, df in preds.items():
            per_k = {K: df[df["experts_per_layer"] == K] for K in ks}
            cont = {K: contenders(per_k[K]) for K in ks}
            union = [get_candidate(c) for c in CANDIDATE_IDS
                     if any(c in v for v in cont.values())]
            with at_threads(rig, trace, union, threads, profile, order, ks[0], executor,
                            progress) as split:
                for K in ks:
                    left = None if deadline is None else \
                        (deadline - time.perf_counter()) / (n_cells - len(cells))
                    cells.append(_race(rig, trace, per_k[K], cont[K], K, threads, order, split,
                                       executor, settings, rng, left, progress,
                                       float(df.attrs["gpu_share"])))
    inputs = {role: describe_input(obj) for role, obj in
              (("trace", trace), ("calibration", calibration), ("profile", profile))}
    return VerifyRecord(model=g, platform=platform, inputs=inputs,
                        settings={**asdict(settings), "executor": asdict(executor),
                                  "fill_by_id": fill_by_id, "vram_gib": vram_gib},
                        cells=cells, created=datetime.now(UTC).isoformat(timespec="seconds"),
                        tool={"name": "cope-explorer", "version": __version__})


def _race(rig, trace: Trace, pred: pd.DataFrame, ids: list[str], K: int, threads: int,
          order: np.ndarray, split, executor: ExecutorSettings, settings: VerifySettings,
          rng: np.random.Generator, seconds_left: float | None, progress: bool,
          gpu_share: float) -> VerifyCell:
    t0 = time.perf_counter()
    runner = CellRunner(rig, trace, [get_candidate(c) for c in ids], K, order, split, executor)
    alive = list(range(len(ids)))
    dropped: list[dict[str, Any]] = []
    rounds = trials = 0
    stop = "max rounds"
    while True:
        r0 = time.perf_counter()
        runner.trial(rounds, alive)
        rounds, trials = rounds + 1, trials + len(alive)
        verdict = judge(_table(runner, ids), [ids[i] for i in alive], settings.tolerance,
                        settings.draws, rng) if rounds >= settings.min_rounds else None
        if verdict is not None:
            for c, pct in verdict.dropped:
                dropped.append({"candidate": c, "round": rounds,
                                "measured_us": verdict.measured_us[c], "behind_pct": pct})
                alive.remove(ids.index(c))
        if progress:
            print(f"cope verify: K={K} threads={threads} round {rounds}: "
                  f"{len(alive)} left" + (f", dropped {', '.join(c for c, _ in verdict.dropped)}"
                                          if verdict and verdict.dropped else ""),
                  file=sys.stderr)
        if len(alive) == 1:
            stop = "one left"
            break
        if verdict is not None and verdict.equivalent:
            stop = "equivalent"
            break
        if rounds >= settings.max_rounds:
            break
        if seconds_left is not None and \
                time.perf_counter() - t0 + (time.perf_counter() - r0) > seconds_left:
            stop = "budget"
            break
    table = _table(runner, ids)
    final = judge(table, [ids[i] for i in alive], settings.tolerance, 0, rng)
    remaining = sorted((ids[i] for i in alive), key=lambda c: (c != final.leader,
                                                                final.measured_us[c]))
    point, lo, hi = measured_interval(table[table["candidate"] == final.leader],
                                      settings.draws, rng)
    seconds = time.perf_counter() - t0
    return VerifyCell(
        K=K, cpu_threads=threads, gpu_share=gpu_share,
        predicted_winner=str(pred.loc[pred["rank"] == 1, "candidate"].iloc[0]),
        contenders=[_contender(pred[pred["candidate"] == c].iloc[0]) for c in ids],
        dropped=dropped, remaining=remaining, verified_winner=final.leader, measured_us=point,
        measured_lo_us=None if np.isnan(lo) else lo, measured_hi_us=None if np.isnan(hi) else hi,
        stop=stop, rounds=rounds, candidate_trials=trials,
        full_candidate_trials=len(CANDIDATE_IDS) * settings.full_trials, seconds=seconds,
        full_seconds_estimate=_full_seconds(runner, ids, pred, seconds, settings.full_trials),
        runs=[[ids[i], int(trace.prompt_ids[p]), t, v]
              for (i, p, t), v in sorted(runner.runs.items())])


def _table(runner: CellRunner, ids: list[str]) -> pd.DataFrame:
    ids_p = runner.trace.prompt_ids
    return pd.DataFrame([(ids[i], int(ids_p[p]), t, v) for (i, p, t), v in runner.runs.items()],
                        columns=["candidate", "prompt", "trial", "tpot_us"])


def _contender(row) -> dict[str, Any]:
    def num(v) -> float | None:
        return float(v) if np.isfinite(v) else None
    return {"candidate": row["candidate"], "predicted_us": float(row["tpot_us"]),
            "predicted_lo_us": num(row.get("tpot_lo_us", np.nan)),
            "predicted_hi_us": num(row.get("tpot_hi_us", np.nan)),
            "win_probability": num(row.get("win_probability", np.nan))}


def _full_seconds(runner: CellRunner, ids: list[str], pred: pd.DataFrame, seconds: float,
                  full_trials: int) -> float:
    """A full measurement's time: decoding every candidate ``full_trials`` times over every
    prompt at its predicted TPOT, scaled by how this race's decodes measured against their
    predictions, plus the race's other time (warm-up) per candidate, for all 13."""
    tr = runner.trace
    tokens = np.diff(tr.prompt_start)
    predicted = dict(zip(pred["candidate"], pred["tpot_us"]))
    decoded = sum(v * tokens[p] for (_, p, _), v in runner.runs.items()) / 1e6
    expected = sum(predicted[ids[i]] * tokens[p] for (i, p, _) in runner.runs) / 1e6
    scale = decoded / expected if expected > 0 else 1.0
    full = scale * full_trials * tokens.sum() * sum(predicted.values()) / 1e6
    overhead = max(seconds - decoded, 0.0) * len(pred) / len(ids)
    return float(full + overhead)
