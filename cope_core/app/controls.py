"""The controls several pages share: the VRAM budget, the operating point and the estimator,
each bound to the URL (:mod:`.url_state`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import streamlit as st

from ..estimate.costs import estimators_for
from ..geometry import ModelGeometry
from ..profile.data import Profile
from . import whatif
from .dataset import Dataset
from .settings import op_key, op_label
from .url_state import bound, resolve


def _budget(ds: Dataset) -> tuple[float, float, float, str | None]:
    """The budget setting for this dataset's model, with the slider's bounds: a budget beyond
    them (a link made for a bigger model) is clamped and a note says so, never reset."""
    g = ds.trace.model
    lo, hi = whatif.budget_range(g, whatif.gpu_gib(ds.profile.platform))
    default = whatif.default_budget(g, ds.profile.platform)
    asked = resolve("vram", default, lambda v: math.isfinite(v), lambda v: whatif.snap(float(v)))
    gib = min(max(asked, lo), hi)
    note = None if gib == asked else (
        f"The budget asked for, {asked:g} GiB, is {'more' if asked > hi else 'less'} than "
        f"this page offers for {g.name} ({lo:g} to {hi:g} GiB; every expert fits at "
        f"{whatif.budget_gib(g, g.n_experts):.2f} GiB): shown at {gib:g} GiB.")
    mine = whatif.gpu_gib(ds.profile.platform)
    if note is None and mine is not None and mine < lo:
        note = (f"Your GPU's {mine:g} GiB is less than the {lo:g} GiB that K = 0 needs for "
                f"{g.name} (non-expert weights, KV cache, workspace): the budgets shown are "
                "more than your card holds.")
    return gib, lo, hi, note


def current_vram(ds: Dataset) -> float:
    """The budget in GiB as the pages without a slider read it (clamped with a note)."""
    gib, _, _, note = _budget(ds)
    if note:
        st.info(note)
    return gib


def vram_widget(ds: Dataset, where: Any = st) -> tuple[float, int]:
    """The VRAM-budget slider; returns the budget in GiB and the K it buys (shown below it)."""
    g = ds.trace.model
    gib, lo, hi, note = _budget(ds)
    gib = bound("vram", where.slider, default=gib,
                valid=lambda v: isinstance(v, float) and lo <= v <= hi,
                coerce=lambda v: min(max(whatif.snap(float(v)), lo), hi),
                label="VRAM budget (GiB)", min_value=lo, max_value=hi, step=whatif.BUDGET_STEP,
                help="K = experts per layer that fit after the non-expert weights, a 4096-token "
                     "KV cache and 0.5 GiB of workspace")
    k = whatif.k_for_budget(g, gib)
    where.caption(vram_caption(g, gib, k))
    ctx = whatif.context_note(g, ds.profile.platform)
    if ctx:
        where.caption(ctx)
    if note:
        where.info(note)
    return gib, k


def vram_caption(g: ModelGeometry, gib: float, k: int) -> str:
    return (f"{gib:g} GiB buys **K = {k}** of {g.n_experts} experts per layer "
            f"(K = {k} needs {whatif.budget_gib(g, k):.2f} GiB)")


def _ops(profile: Profile) -> list[str]:
    return [op_key(t, s) for t, s in profile.operating_points()]


def _op_note(keys: list[str], chosen: str) -> str | None:
    asked = resolve("op", None)
    if asked is None or asked in keys:
        return None
    return (f"The operating point asked for, {asked}, is not in this profile: shown at "
            f"{chosen} (the profile has {', '.join(keys)}).")


def current_op(profile: Profile) -> tuple[int, float]:
    keys = _ops(profile)
    k = resolve("op", op_key(*profile.choose()), lambda v: v in keys)
    note = _op_note(keys, k)
    if note:
        st.info(note)
    return profile.operating_points()[keys.index(k)]


def op_widget(profile: Profile, where: Any = st) -> tuple[int, float]:
    """Operating point (CPU threads, GPU share) among those in the profile."""
    keys = _ops(profile)
    ops = profile.operating_points()
    note = _op_note(keys, resolve("op", op_key(*profile.choose()), lambda v: v in keys))
    k = bound("op", where.selectbox, default=op_key(*profile.choose()),
              valid=lambda v: v in keys, label="Operating point", options=keys,
              format_func=lambda v: op_label(*ops[keys.index(v)]),
              help="CPU threads: the host threads that compute the experts on the CPU. GPU "
                   "share: the percentage of the GPU's compute this point was profiled with "
                   "(CUDA MPS limits the job to that share of the SMs, as when the GPU is "
                   "shared with other jobs; an analytic profile scales the GPU's FLOP/s and "
                   "bandwidth, not the link or the CPU). 100 is the whole GPU.")
    if note:
        where.info(note)
    return ops[keys.index(k)]


def settings_row(ds: Dataset, widths: Sequence[float]
                 ) -> tuple[float, int, tuple[int, float], str]:
    """The budget slider, operating point and estimator side by side (the header of the pages
    that predict); returns ``(gib, K, operating point, estimator)``."""
    c1, c2, c3 = st.columns(list(widths))
    with c1:
        gib, k = vram_widget(ds)
    with c2:
        op = op_widget(ds.profile)
    with c3:
        est = estimator_widget(ds.profile)
    return gib, k, op, est


def current_estimator(profile: Profile) -> str:
    ests = estimators_for(profile)
    return resolve("est", "cope", lambda v: v in ests)


def estimator_widget(profile: Profile, where: Any = st) -> str:
    ests = estimators_for(profile)
    return bound("est", where.radio, default="cope", valid=lambda v: v in ests,
                 label="Estimator", options=ests, horizontal=True,
                 help="cope: profiled whole-layer schedules; atomic: isolated operator costs "
                      "composed; hrm: roofline from peak numbers")
