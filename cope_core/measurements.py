"""The measurement record (``cope.measurements/1``): what the reference executor measured, the
ground truth the estimators are scored against. It sits low, beside the other records
(:mod:`cope_core.trace.data`, :mod:`cope_core.profile.data`), so the estimators, the Parquet
I/O and the app type it without importing the executor.

It also holds the two rules the executor applies while it measures
(docs/design.md#trustworthy-measurement): the **noise floor** of a cell (the robust spread of one
reference candidate run again and again on one prompt) and the **outlier rule** for a
(candidate, prompt)'s trials — a trial further than ``OUTLIER_K`` scaled MADs from the median of
its trials (Leys et al. 2013, "Detecting outliers: do not use standard deviation around the mean,
use absolute deviation around the median", J. Exp. Soc. Psychol. 49(4)), the scale at least the
noise floor and ``MIN_SCALE`` of the median, so three near-equal trials do not flag a 1 % wobble.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .geometry import ModelGeometry

MEASUREMENTS_SCHEMA = "cope.measurements/1"
#: MAD to standard deviation for normal data (1 / Phi^-1(3/4)).
MAD_TO_SD = 1.4826
#: A trial is an outlier beyond this many scaled MADs from the median of its trials.
OUTLIER_K = 3.0
#: The outlier scale is at least this share of the median.
MIN_SCALE = 0.01
OUTLIER_RULE = (f"|trial - median| > {OUTLIER_K:g} x max({MAD_TO_SD} x MAD, noise floor, "
                f"{MIN_SCALE:.0%} of the median) over the (candidate, prompt)'s trials")


@dataclass(frozen=True, eq=False)
class Measurements:
    """Measured TPOT per candidate, prompt and trial (``cope.measurements/1``).

    ``table`` has the columns of :data:`MEASUREMENT_COLUMNS`; ``model`` is the geometry the
    reference executor ran; ``platform`` describes the machine (and says whether the
    accelerator was emulated); ``quality`` holds, per cell, the noise floor, the outliers that
    were measured again and the candidates that do the same work (empty for files written before
    it existed); ``progress`` says which cells a run has finished (an interrupted run's file is
    resumable); ``path`` is the file it was read from, for messages.
    """

    table: pd.DataFrame
    model: ModelGeometry
    platform: dict[str, Any]
    created: str = ""
    notes: str = ""
    quality: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)
    path: str | None = field(default=None, compare=False)

    @property
    def complete(self) -> bool:
        """False only for the file of a run that was interrupted (see ``progress``)."""
        return bool(self.progress.get("complete", True))

    def metadata(self) -> dict[str, Any]:
        meta = {"schema": MEASUREMENTS_SCHEMA, "platform": self.platform,
                "model": self.model.to_dict(), "created": self.created, "notes": self.notes}
        if self.quality:
            meta["quality"] = self.quality
        if self.progress:
            meta["progress"] = self.progress
        return meta


def noise_floor_pct(samples_us: Sequence[float]) -> float:
    """Robust relative spread of repeated runs of one (candidate, prompt), in percent:
    ``100 x 1.4826 x MAD / median`` (a standard deviation's worth, unmoved by one slow run);
    NaN with fewer than three samples."""
    x = np.asarray(samples_us, dtype=np.float64)
    if x.size < 3:
        return float("nan")
    med = float(np.median(x))
    return 100.0 * MAD_TO_SD * float(np.median(np.abs(x - med))) / med


def outlier_trials(values_us: Sequence[float], noise_pct: float = float("nan")) -> list[int]:
    """Positions of the outlying trials of one (candidate, prompt) (the module's rule).

    Parameters
    ----------
    values_us : sequence of float
        Its trials' TPOT; fewer than three flag nothing (no median to stand against).
    noise_pct : float
        The cell's noise floor in percent (NaN: none known).

    Returns
    -------
    list of int
    """
    x = np.asarray(values_us, dtype=np.float64)
    if x.size < 3:
        return []
    med = float(np.median(x))
    scale = max(MAD_TO_SD * float(np.median(np.abs(x - med))), MIN_SCALE * med,
                0.0 if np.isnan(noise_pct) else noise_pct / 100.0 * med)
    return [int(i) for i in np.flatnonzero(np.abs(x - med) > OUTLIER_K * scale)]
