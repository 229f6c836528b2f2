"""The controls several pages share: the VRAM budget, the operating point and the estimator,
each bound to the URL (:mod:`.url_state`)."""
from __future__ import annotations

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


def current_vram(ds: Dataset) -> float:
    g = ds.trace.model
    lo, hi = whatif.budget_range(g)
    return resolve("vram", whatif.default_budget(g, ds.profile.platform),
                   lambda v: lo <= v <= hi, lambda v: whatif.snap(float(v)))


def vram_widget(ds: Dataset, where: Any = st) -> tuple[float, int]:
    """The VRAM-budget slider; returns the budget in GiB and the K it buys (shown below it)."""
    g = ds.trace.model
    lo, hi = whatif.budget_range(g)
    gib = bound("vram", where.slider, default=whatif.default_budget(g, ds.profile.platform),
                valid=lambda v: isinstance(v, float) and lo <= v <= hi,
                coerce=lambda v: whatif.snap(float(v)), label="VRAM budget (GiB)",
                min_value=lo, max_value=hi, step=whatif.BUDGET_STEP,
                help="K = experts per layer that fit after the non-expert weights, a 4096-token "
                     "KV cache and 0.5 GiB of workspace")
    k = whatif.k_for_budget(g, gib)
    where.caption(vram_caption(g, gib, k))
    return gib, k


def vram_caption(g: ModelGeometry, gib: float, k: int) -> str:
    return (f"{gib:g} GiB buys **K = {k}** of {g.n_experts} experts per layer "
            f"(K = {k} needs {whatif.budget_gib(g, k):.2f} GiB)")


def _ops(profile: Profile) -> list[str]:
    return [op_key(t, s) for t, s in profile.operating_points()]


def current_op(profile: Profile) -> tuple[int, float]:
    keys = _ops(profile)
    k = resolve("op", op_key(*profile.choose()), lambda v: v in keys)
    return profile.operating_points()[keys.index(k)]


def op_widget(profile: Profile, where: Any = st) -> tuple[int, float]:
    """Operating point (CPU threads, GPU share) among those in the profile."""
    keys = _ops(profile)
    ops = profile.operating_points()
    k = bound("op", where.selectbox, default=op_key(*profile.choose()),
              valid=lambda v: v in keys, label="Operating point", options=keys,
              format_func=lambda v: op_label(*ops[keys.index(v)]))
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
