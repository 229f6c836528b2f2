"""What a newer llama.cpp build would add over the one assumed (:class:`Newer`): the first build
that runs the fastest configuration of the whole search, read from the search's frame
(:func:`runs_mask`, :func:`newer_than`); the builds themselves are :mod:`.builds`'."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...errors import CopeInputError
from ..placement.command import LlamaFlags
from .builds import Build


@dataclass(frozen=True)
class Newer:
    """What a newer llama.cpp build would add over the one assumed: the first build that runs
    the fastest configuration of the whole space, that configuration, and its TPOT
    (microseconds) against the assumed build's best."""

    build: str
    candidate: str
    n_cpu_moe: int
    cache_mib: int
    cpu_share: float
    tpot_us: float
    gain_pct: float

    def __post_init__(self) -> None:
        _need(isinstance(self.build, str) and re.fullmatch(r"b\d+", self.build) is not None,
              "build", self.build, "a build such as b12191")
        _need(isinstance(self.candidate, str) and bool(self.candidate), "candidate",
              self.candidate, "a candidate")
        for name in ("n_cpu_moe", "cache_mib"):
            v = getattr(self, name)
            _need(isinstance(v, int) and not isinstance(v, bool) and v >= 0, name, v,
                  "a whole number >= 0")
        for name in ("cpu_share", "tpot_us", "gain_pct"):
            v = getattr(self, name)
            _need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  and v >= 0, name, v, "a finite number >= 0")
            object.__setattr__(self, name, float(v))

    def flags(self) -> str:
        """The placement and cache flags it adds (``--n-cpu-moe 30 --moe-cache-mib 2048 ...``)."""
        return LlamaFlags(n_cpu_moe=self.n_cpu_moe or None, cache_mib=self.cache_mib,
                          cpu_share=self.cpu_share).text()


def _need(ok: bool, field: str, value: object, want: str) -> None:
    if not ok:
        raise CopeInputError(f"expected {want}, got {value!r}", field=field)


def runs_mask(frame: pd.DataFrame, build: Build) -> np.ndarray:
    """Which rows of a llama.cpp search's frame ``build`` runs (:meth:`Build.runs`)."""
    return np.array([build.runs(v, s, m) for v, s, m in
                     zip(frame["version"], frame["cpu_share"], frame["cache_mib"])], bool)


def newer_than(newest: pd.DataFrame, mine: pd.DataFrame) -> Newer | None:
    """The newest build's fastest configuration (first row of its search's ``best()``) when it
    is faster than the assumed build's (``mine``), with the first build that runs it."""
    top, mine = newest.iloc[0], mine.iloc[0]
    if top["tpot_us"] >= mine["tpot_us"]:
        return None
    return Newer(str(top["build"]), str(top["candidate"]), int(top["n_cpu_moe"]),
                 int(top["cache_mib"]), float(top["cpu_share"]), float(top["tpot_us"]),
                 100.0 * (float(mine["tpot_us"]) / float(top["tpot_us"]) - 1.0))
