"""The model's own measured error, and the one rule that turns draws into an interval around the
point (docs/design.md#uncertainty).

The draws of :mod:`cope_core.estimate.uncertainty` describe how much the trace's prompts and the
profile's sampling could move a prediction; the model itself is also wrong by some amount, which
the evaluations measure: ``log(measured / predicted)`` of absolute TPOT on the shipped measured
example, the controlled grid and the published llama-bench sweeps. ``scripts/model_error.py``
estimates its spread per estimator, held out by dataset, and writes it to
``data/model-error.json`` (with its provenance and the held-out coverage); this module is the
library's one reader of that file.

An interval on **absolute** speed is the draws' spread, read on each side of the draws' median
and carried to the point estimate, widened on each side by the model error in quadrature (in
log space)::

    h_lo = log(median / q_lo),  h_hi = log(q_hi / median)      # the draws' spread, >= 0
    lo = point * exp(-sqrt(h_lo**2 + (z * sigma)**2))
    hi = point * exp(+sqrt(h_hi**2 + (z * sigma)**2))          # z = 1.96 at 95 %

so the point always lies inside its own interval (both exponents have a fixed sign), whatever
the draws' skew. Rankings and ratios are statements about the paired draws, where an error that
is common to every candidate cancels; they get no absolute model error.
"""
from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from ..errors import CopeInputError

SCHEMA = "cope.model-error/1"
#: written by scripts/model_error.py
MODEL_ERROR_FILE = Path(__file__).resolve().parents[2] / "data" / "model-error.json"


def z_of(level: float) -> float:
    """The two-sided normal quantile of ``level`` (1.95996... at 0.95)."""
    # the standard library's quantile (Wichura's AS 241, ~1e-16): scipy.stats costs seconds
    # to import, and every page and command reaches this module
    return NormalDist().inv_cdf(0.5 + level / 2)


@dataclass(frozen=True)
class ModelError:
    """The model's measured error on absolute TPOT: ``sigma_log`` per estimator (the root mean
    square of ``log(measured / predicted)``, each evaluated dataset weighted alike), and
    ``ratio_median_pct`` and ``ratio_p95_pct``, the median and 95th percentile of the error of
    predicted ratios between candidates at one setting and between settings (per cent).
    ``source``: the file it was read from."""

    sigma_log: Mapping[str, float]
    ratio_median_pct: float
    ratio_p95_pct: float
    source: str

    def sigma(self, estimator: str) -> float:
        """The estimator's ``sigma_log`` (0 for an estimator that was never evaluated)."""
        return float(self.sigma_log.get(estimator, 0.0))


def _positive(doc: Mapping, key: str, src: str, where: str) -> float:
    v = doc.get(key) if isinstance(doc, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise CopeInputError(f"expected a number >= 0, got {v!r}", source=src,
                             field=f"{where}{key}")
    return float(v)


def parse_model_error(doc: object, source: str) -> ModelError:
    """A :class:`ModelError` from the JSON of ``data/model-error.json``, checked."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise CopeInputError(f"expected schema {SCHEMA!r}", source=source, field="schema")
    ests = doc.get("estimators")
    if not isinstance(ests, dict) or not ests:
        raise CopeInputError("expected an object of estimators", source=source,
                             field="estimators")
    sigma = {str(e): _positive(v, "sigma_log", source, f"estimators.{e}.")
             for e, v in ests.items()}
    ratio = doc.get("ratio", {})
    return ModelError(sigma, _positive(ratio, "median_pct", source, "ratio."),
                      _positive(ratio, "p95_pct", source, "ratio."), source)


@functools.cache
def model_error(path: Path = MODEL_ERROR_FILE) -> ModelError:
    """The calibration of ``path`` (default ``data/model-error.json``), read once."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CopeInputError(f"cannot read the model's error calibration ({e}); regenerate it "
                             "with python scripts/model_error.py", source=str(path)) from None
    return parse_model_error(doc, str(path))


def around_point(point: np.ndarray, draws: np.ndarray, level: float, sigma: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The ``level`` interval of each column of ``draws`` (shape ``(B, n)``) carried to its point
    (shape ``(n,)``) and widened by the model error ``sigma`` (log space), as the module says;
    ``sigma=0`` gives the draws' spread alone. ``lo <= point <= hi`` always."""
    h_lo, h_hi = log_spread(draws, level)
    return widen(np.asarray(point, np.float64), h_lo, h_hi, level, sigma)


def log_spread(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The log half-widths of the ``level`` interval of each column of ``draws`` (shape
    ``(B, n)``) on each side of its median: what :func:`around_point` carries to the point
    (computed once, it gives both the draws' interval and the widened one)."""
    draws = np.asarray(draws, np.float64)
    q_lo, med, q_hi = np.percentile(draws, [50 * (1 - level), 50, 50 * (1 + level)], axis=0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # a lower quantile at 0 (draws cut at 0) with a positive median: the interval reaches 0
        h_lo = np.where(q_lo > 0, np.log(med / q_lo), np.where(med > 0, np.inf, 0.0))
        h_hi = np.where(med > 0, np.log(q_hi / med), 0.0)
    return h_lo, h_hi


def widen(point: np.ndarray, h_lo: np.ndarray, h_hi: np.ndarray, level: float, sigma: float
          ) -> tuple[np.ndarray, np.ndarray]:
    """``point`` times ``exp(-/+ sqrt(h**2 + (z * sigma)**2))`` on each side (``h >= 0``, log
    half-widths of the draws' spread)."""
    zs = z_of(level) * sigma
    h_lo, h_hi = np.maximum(h_lo, 0.0), np.maximum(h_hi, 0.0)
    return (point * np.exp(-np.sqrt(h_lo ** 2 + zs ** 2)),
            point * np.exp(np.sqrt(h_hi ** 2 + zs ** 2)))


def half_widths(point: np.ndarray, lo: np.ndarray, hi: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The log half-widths ``(log(point / lo), log(hi / point))`` of an interval around its
    point: :func:`widen`'s inverse at ``sigma=0``."""
    return np.log(point / lo), np.log(hi / point)
