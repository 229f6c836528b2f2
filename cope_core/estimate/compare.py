"""What would another GPU buy me? The same trace predicted on several platforms.

A platform is a profile (analytic, built from the spec table or a custom spec for the trace's
model, or measured) and the GPU's own memory, which caps the budgets it can be given. The
trace is replayed once at every K; each platform prices the replay: the best candidate at every
budget up to its memory, and at the asked budget the winner with its interval, win probability
and speed-up over the first platform. ``cope compare`` and the app's Compare page call
:func:`compare`.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..geometry import GIB, ModelGeometry
from ..matrix import Residency
from ..platforms import GPUS, LINKS, PlatformSpec, load_spec, platform_spec
from ..profile.analytic import analytic_profile
from ..profile.data import Profile
from ..replay.engine import ReplayCounts
from ..trace.data import Trace
from .predict import price, replay_counts
from .uncertainty import DEFAULT_DRAWS

#: Columns of :attr:`Comparison.at_budget` and :attr:`Comparison.sweep`.
AT_BUDGET = ("platform", "analytic", "vram_gib", "budget_gib", "experts_per_layer", "winner",
             "tpot_us", "tpot_lo_us", "tpot_hi_us", "win_probability", "speedup",
             "layer_partition_us")
SWEEP = ("platform", "experts_per_layer", "budget_gib", "winner", "tpot_us")


@dataclass(frozen=True)
class Platform:
    """One platform to compare: a label, its profile, and its GPU's memory in GiB (None:
    unknown, budgets are not capped)."""

    label: str
    profile: Profile
    vram_gib: float | None


def catalog_platform(model: ModelGeometry, name: str, *, cpu_threads: int | None = None,
                     gpu_share: float | None = None) -> Platform:
    """An ANALYTIC platform from the spec table: ``GPU[+LINK[+CPU]]``, e.g. ``rtx4090`` or
    ``h100+pcie5+epyc-7763``, or a JSON spec file (``PlatformSpec`` fields, plus an optional
    ``vram_gib``)."""
    if name.endswith(".json") or Path(name).is_file():
        return spec_platform(model, load_spec(name), _json_vram(name), cpu_threads=cpu_threads,
                             gpu_share=gpu_share)
    parts = name.lower().split("+")
    if len(parts) > 3 or parts[0] not in GPUS:
        raise CopeInputError(f"unknown platform {name!r}; expected GPU[+LINK[+CPU]] with GPU in "
                             f"{sorted(GPUS)}, LINK in {sorted(LINKS)}, or a JSON spec file",
                             field="platform")
    kw = {"link": parts[1]} if len(parts) > 1 else {}
    if len(parts) > 2:
        kw["cpu"] = parts[2]
    spec = platform_spec(parts[0], **kw)
    return spec_platform(model, spec, GPUS[parts[0]].vram_bytes / GIB, cpu_threads=cpu_threads,
                         gpu_share=gpu_share)


def _json_vram(path: str) -> float | None:
    import json
    try:
        v = json.loads(Path(path).read_text()).get("vram_gib")
    except (OSError, ValueError, AttributeError):
        return None
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def spec_platform(model: ModelGeometry, spec: PlatformSpec, vram_gib: float | None, *,
                  cpu_threads: int | None = None, gpu_share: float | None = None,
                  label: str | None = None) -> Platform:
    """An ANALYTIC platform of ``spec`` for ``model`` (at ``cpu_threads`` and ``gpu_share``
    when given, else the spec's usual operating points at the whole GPU)."""
    threads = [int(cpu_threads)] if cpu_threads else None
    shares = (float(gpu_share),) if gpu_share else (100.0,)
    prof = analytic_profile(model, spec, threads, gpu_shares=shares)
    return Platform(label or spec.name, prof, vram_gib)


def profile_platform(profile: Profile, label: str | None = None) -> Platform:
    """A platform from a profile (measured or analytic); its memory from the spec table when
    the profile names a catalog GPU."""
    gpu = str((profile.platform or {}).get("gpu", "")).lower()
    vram = GPUS[gpu].vram_bytes / GIB if gpu in GPUS else None
    kind = "ANALYTIC" if profile.analytic else "MEASURED"
    name = label or (Path(profile.path).name if profile.path else f"{kind} {gpu or 'profile'}")
    return Platform(name, profile, vram)


@dataclass(frozen=True)
class Comparison:
    """Per platform: at the asked budget (``at_budget``, one row each, in the given order) and
    the best candidate at every budget it can hold (``sweep``)."""

    vram_gib: float
    at_budget: pd.DataFrame
    sweep: pd.DataFrame


def compare(trace: Trace, platforms: Sequence[Platform], vram_gib: float,
            calibration: Trace | None = None, *, cpu_threads: int | None = None,
            gpu_share: float | None = None, estimator: str = "cope",
            draws: int = DEFAULT_DRAWS, seed: int = 0,
            counts: dict[Residency, ReplayCounts] | None = None) -> Comparison:
    """Predict ``trace`` on every platform and compare their winners.

    Parameters
    ----------
    trace, calibration : Trace
        As for :func:`cope_core.estimate.predict.predict`.
    platforms : sequence of Platform
        At least one; the first is the reference of ``speedup``.
    vram_gib : float
        The budget to compare at; a platform with less memory is compared at all of its own.
    cpu_threads, gpu_share : optional
        The operating point in every profile (default: each profile's own default).
    estimator : {"cope", "atomic", "hrm"}
    draws, seed : int
        Bootstrap draws of the intervals and win probabilities at the budget (the sweep has
        none).
    counts : dict, optional
        Replay counts of every residency at ``K = 0 … E`` (a caller that compares often
        replays once); default: replayed here.

    Returns
    -------
    Comparison
        ``at_budget`` columns :data:`AT_BUDGET`; ``speedup`` is the first platform's TPOT over
        this one's. ``sweep`` columns :data:`SWEEP`.
    """
    if not platforms:
        raise CopeInputError("expected at least one platform to compare", field="platform")
    if not (isinstance(vram_gib, (int, float)) and math.isfinite(vram_gib) and vram_gib >= 0):
        raise CopeInputError(f"expected a VRAM budget >= 0 GiB, got {vram_gib!r}",
                             field="vram_gib")
    g = trace.model
    all_k = list(range(g.n_experts + 1))
    if counts is None:
        counts = replay_counts(trace, calibration, all_k)
    rows, sweeps = [], []
    for p in platforms:
        cap = g.n_experts if p.vram_gib is None else g.experts_per_layer_for_vram(p.vram_gib * GIB)
        budget = vram_gib if p.vram_gib is None else min(vram_gib, p.vram_gib)
        k = min(g.experts_per_layer_for_vram(budget * GIB), cap)
        op = partial(price, trace, p.profile, counts, cpu_threads=cpu_threads,
                     gpu_share=gpu_share, estimator=estimator,
                     calibrated=calibration is not None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # one fill warning is enough: said by the caller
            sw = op(all_k[:cap + 1], draws=0)
            one = op([k], draws=draws, seed=seed)
        best = sw[sw["winner"]].sort_values("experts_per_layer")
        sweeps.append(pd.DataFrame({
            "platform": p.label, "experts_per_layer": best["experts_per_layer"].to_numpy(),
            "budget_gib": [g.vram_for_experts_per_layer(int(x)) / GIB
                           for x in best["experts_per_layer"]],
            "winner": best["candidate"].to_numpy(), "tpot_us": best["tpot_us"].to_numpy()}))
        w = one.sort_values("rank").iloc[0]
        conf = one.attrs.get("uncertainty", {}).get("per_k", {}).get(int(k), {})
        lp = one.loc[one["candidate"] == "layer_partition", "tpot_us"]
        rows.append({"platform": p.label, "analytic": bool(p.profile.analytic),
                     "vram_gib": p.vram_gib, "budget_gib": float(budget),
                     "experts_per_layer": int(k), "winner": w.candidate,
                     "tpot_us": float(w.tpot_us), "tpot_lo_us": float(w.tpot_lo_us),
                     "tpot_hi_us": float(w.tpot_hi_us),
                     "win_probability": float(conf.get("win_probability", np.nan)),
                     "layer_partition_us": float(lp.iloc[0]) if len(lp) else np.nan})
    at = pd.DataFrame(rows, columns=[c for c in AT_BUDGET if c != "speedup"])
    at.insert(AT_BUDGET.index("speedup"), "speedup", at["tpot_us"].iloc[0] / at["tpot_us"])
    return Comparison(float(vram_gib), at, pd.concat(sweeps, ignore_index=True))
