"""Where a platform's whole-schedule costs depart from their isolated-op composition.

COPE prices a layer with its schedule measured whole; the atomic simulation composes the same
layer from ops timed alone (:func:`~cope_core.estimate.costs.atomic_layer`). The two agree
exactly when the ops of a schedule neither slow each other down (contention for cores, memory
bandwidth or the link) nor overlap better than nominal. This module sets one against the other
for every schedule row of an operating point, so that a user can see *where* the difference
between the estimators comes from
(docs/mechanisms.md#contention-schedules-against-their-composition).

For each schedule ``(execution, h, c, u)`` it gives the measured cost, the overlapped
composition (the atomic estimate), the serial composition (the same ops one after another), the
excess of the measured cost over the overlapped composition, and the share of the nominal
overlap the schedule achieved: 1 when it runs as composed, 0 when its lanes serialise, above 1
when it beats the composition. A row is *beyond noise* when the measured interquartile range
and the composition's (composed from the ops' quartiles, as composition is monotone in every
op) do not overlap.

A mutable residency's prefetch is the other place where the two estimators part: COPE charges
what a prefetch measured beside a running layer adds, the atomic simulation the prefetch copy
timed alone. :func:`prefetch_hiding` sets those two side by side.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..matrix import EXECUTIONS
from ..profile.data import Profile
from .costs import atomic_layer

#: Columns of :func:`contention` (one row per measured schedule).
COLUMNS = ("execution", "hits", "cpu", "staged", "measured_us", "measured_p25_us",
           "measured_p75_us", "composed_us", "composed_p25_us", "composed_p75_us", "serial_us",
           "excess_pct", "overlap", "verdict")
#: Below this gap between serial and overlapped composition (as a share of the overlapped one)
#: a schedule has no overlap to speak of and ``overlap`` is NaN.
MIN_OVERLAP_GAP = 0.05


def _rows(top_k: int) -> list[tuple[int, int, int, int]]:
    """Every schedule row a profile holds, as (execution index, h, c, u), in profile order."""
    out = []
    for e_idx, e in enumerate(EXECUTIONS):
        for h in range(top_k + 1):
            m = top_k - h
            if e.value == "parallel":
                out.append((e_idx, h, m, 0))
            elif e.value == "cost_selected":
                out += [(e_idx, h, c, m - c) for c in range(m + 1)]
            else:
                out.append((e_idx, h, 0, m))
    return out


def contention(profile: Profile, cpu_threads: int | None = None,
               gpu_share: float | None = None) -> pd.DataFrame:
    """Measured schedule costs against their isolated-op composition at one operating point.

    Parameters
    ----------
    profile : Profile
        A measured profile (an analytic one composes its schedules from the same ops, so every
        row would read "as composed").
    cpu_threads, gpu_share : optional
        The operating point (default as :meth:`Profile.choose`).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`; ``verdict`` is ``"contention"`` (measured slower than composed
        beyond noise), ``"faster"`` (faster beyond noise) or ``"as composed"``. ``attrs`` holds
        ``cpu_threads`` and ``gpu_share``.
    """
    if profile.analytic:
        raise CopeInputError("an analytic profile composes its schedules from its ops; "
                             "contention needs a measured profile", source=profile.path,
                             field="platform.analytic")
    threads, share = profile.choose(cpu_threads, gpu_share)
    rows, layout = profile.operating_point_rows(threads, share)
    mid, lo, hi = (layout.take(rows[c].to_numpy(np.float64))
                   for c in ("median_us", "p25_us", "p75_us"))
    out = []
    for e, h, c, u in _rows(profile.model.top_k):
        cell = (e, h, c)
        measured = float(mid.schedule[cell])
        composed = float(atomic_layer(mid, e, [h], [c], [u])[0])
        serial = float(atomic_layer(mid, e, [h], [c], [u], serial=True)[0])
        c_lo = float(atomic_layer(lo, e, [h], [c], [u])[0])
        c_hi = float(atomic_layer(hi, e, [h], [c], [u])[0])
        m_lo, m_hi = float(lo.schedule[cell]), float(hi.schedule[cell])
        gap = serial - composed
        overlap = (serial - measured) / gap if gap > MIN_OVERLAP_GAP * composed else np.nan
        verdict = ("contention" if m_lo > c_hi else "faster" if m_hi < c_lo else "as composed")
        out.append((EXECUTIONS[e].value, h, c, u, measured, m_lo, m_hi, composed, c_lo, c_hi,
                    serial, 100.0 * (measured / composed - 1.0), overlap, verdict))
    df = pd.DataFrame(out, columns=list(COLUMNS))
    df.attrs.update(cpu_threads=threads, gpu_share=share)
    return df


def contention_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per execution: rows, median and largest excess (%), median overlap achieved, and how many
    rows are beyond noise each way, from a :func:`contention` frame."""
    g = df.groupby("execution", sort=False)
    return pd.DataFrame({
        "rows": g.size(),
        "median_excess_pct": g["excess_pct"].median(),
        "max_excess_pct": g["excess_pct"].max(),
        "min_excess_pct": g["excess_pct"].min(),
        "median_overlap": g["overlap"].median(),
        "contention": g["verdict"].apply(lambda v: int((v == "contention").sum())),
        "faster": g["verdict"].apply(lambda v: int((v == "faster").sum())),
    }).reset_index()


def prefetch_hiding(profile: Profile, cpu_threads: int | None = None,
                    gpu_share: float | None = None) -> pd.DataFrame:
    """What one prefetch adds beside a running layer against the same copy timed alone.

    Returns
    -------
    pandas.DataFrame
        Per mutable residency: ``beside_layer_us`` (the profile's prefetch row with one
        prefetch minus the one with none, beside a fully resident layer: what COPE charges per
        inserted prefetch at a staging execution), ``beside_cpu_us`` (the same beside a layer
        computing every routed expert on the CPU, what ``parallel`` pays at no hits; equal to
        ``beside_layer_us`` when the profile has no rows beside CPU misses), ``isolated_us``
        (the atomic ``prefetch`` op: what the atomic simulation charges) and ``hidden_pct``,
        the share of the isolated copy that the resident layer hid.
    """
    threads, share = profile.choose(cpu_threads, gpu_share)
    op = profile.resolve(threads, share)
    out = []
    for name, pf in op.prefetch.items():
        beside = float(pf[1] - pf[0])
        cpu = float(op.prefetch_beside[name][-1] - pf[0])
        iso = float(op.prefetch_op)
        out.append((name, beside, cpu, iso,
                    100.0 * (1.0 - beside / iso) if iso > 0 else np.nan))
    return pd.DataFrame(out, columns=["residency", "beside_layer_us", "beside_cpu_us",
                                      "isolated_us", "hidden_pct"])
