"""The measurement record (``cope.measurements/1``): what the reference executor measured, the
ground truth the estimators are scored against. It sits low, beside the other records
(:mod:`cope_core.trace.data`, :mod:`cope_core.profile.data`), so the estimators, the Parquet
I/O and the app type it without importing the executor."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .geometry import ModelGeometry

MEASUREMENTS_SCHEMA = "cope.measurements/1"


@dataclass(frozen=True, eq=False)
class Measurements:
    """Measured TPOT per candidate, prompt and trial (``cope.measurements/1``).

    ``table`` has the columns of :data:`MEASUREMENT_COLUMNS`; ``model`` is the geometry the
    reference executor ran; ``platform`` describes the machine (and says whether the
    accelerator was emulated); ``path`` is the file it was read from, for messages.
    """

    table: pd.DataFrame
    model: ModelGeometry
    platform: dict[str, Any]
    created: str = ""
    notes: str = ""
    path: str | None = field(default=None, compare=False)

    def metadata(self) -> dict[str, Any]:
        return {"schema": MEASUREMENTS_SCHEMA, "platform": self.platform,
                "model": self.model.to_dict(), "created": self.created, "notes": self.notes}
