"""Refit the few constants of the analytic model that the machine decides, from measured points,
and re-predict the rest (docs/design.md#refit-from-measurements).

The analytic model prices every row from a :class:`~cope_core.platforms.PlatformSpec`: peak
numbers, achieved efficiencies and fixed latencies. A user's measurements (llama-bench rows,
``cope verify --llama-bench``) say what this machine reaches; the refit moves only the spec fields
the machine decides, each :class:`Knob` a multiplicative factor on named fields (so a constant the
model gains later is refittable by naming its field), optionally only at one thread count. The
factors are fitted by ``scipy.optimize.least_squares`` on the log ratio of predicted to measured
time per token, within ``[1/10, 10]`` of the published value, on at least as many points as
knobs; the callers measure one point more than they fit and hold it out, so that its error says
how well the refit predicts what it did not see.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CopeInputError
from ..platforms import PlatformSpec

#: how far a refitted factor may move a published constant, either way
FACTOR_BOUND = 10.0


@dataclass(frozen=True)
class Knob:
    """One refitted factor: it multiplies every spec field of ``fields`` (at the points of
    ``threads`` threads only, or at all when None)."""

    name: str
    fields: tuple[str, ...]
    threads: int | None = None

    def applies(self, threads: int) -> bool:
        return self.threads is None or self.threads == threads

    def at(self, threads: int) -> Knob:
        """The same knob for the points at ``threads`` threads only."""
        return Knob(f"{self.name} at {threads} threads", self.fields, threads)

    @property
    def label(self) -> str:
        return f"{self.name} ({', '.join(self.fields)})"


#: the host's expert throughput: its memory's and its cores' streaming rate and FLOP/s, and the
#: probed dot-product kernel's rates where probed (issue 41 names it "per type and thread
#: count": :meth:`Knob.at` restricts it to one thread count; the type's share of it is the
#: published ratio, checked by the held-out points of the other type)
HOST_EXPERTS = Knob("host expert throughput",
                    ("cpu_bandwidth", "cpu_bandwidth_per_thread", "cpu_flops_per_thread",
                     "cpu_kernel_bandwidth", "cpu_kernel_bandwidth_per_thread",
                     "cpu_kernel_cached_per_thread"))
#: the GPU-side base per token: the GPU's achieved throughput on the shared work
GPU_BASE = Knob("GPU-side base per token", ("gpu_flops", "gpu_bandwidth"))
#: the fixed cost of each layer whose experts run on the CPU: the hand-off to its workers
CPU_LAYER_FIXED = Knob("fixed cost per CPU layer", ("cpu_dispatch_us",))
#: the fixed cost of each operation a backend runs (a kernel launch; on a CPU-only machine
#: ggml's per-node barrier, priced as one: :mod:`cope_core.estimate.cpu_only`)
OP_FIXED = Knob("fixed cost per operation", ("gpu_launch_us",))


@dataclass(frozen=True)
class FitPoint:
    """One measured configuration: its label, thread count, measured time per token (µs) and
    whatever the predictor needs to price it (``what``)."""

    label: str
    threads: int
    measured_us: float
    what: Any = None


@dataclass(frozen=True)
class PointFit:
    """A point predicted before and after the refit."""

    label: str
    measured_us: float
    before_us: float
    after_us: float
    held_out: bool

    # on tokens per second, as ``cope evaluate --llama-bench`` states its errors
    @property
    def error_before_pct(self) -> float:
        """(predicted - measured) / measured tokens per second, before the refit, in %."""
        return 100.0 * (self.measured_us / self.before_us - 1.0)

    @property
    def error_after_pct(self) -> float:
        return 100.0 * (self.measured_us / self.after_us - 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "measured_us": self.measured_us,
                "predicted_before_us": self.before_us, "predicted_after_us": self.after_us,
                "error_before_pct": self.error_before_pct,
                "error_after_pct": self.error_after_pct, "held_out": self.held_out}


@dataclass(frozen=True)
class Refit:
    """The fitted factors and every point before and after."""

    spec: PlatformSpec              # the published spec the factors multiply
    knobs: tuple[Knob, ...]
    factors: tuple[float, ...]
    points: tuple[PointFit, ...]

    def spec_at(self, threads: int) -> PlatformSpec:
        """The refitted spec of the points at ``threads`` threads."""
        return scaled_spec(self.spec, self.knobs, self.factors, threads)

    def mean_abs_error_pct(self, *, held_out: bool, after: bool) -> float | None:
        """Mean absolute error over the fitted (or held-out) points, before (or after)."""
        errs = [abs(p.error_after_pct if after else p.error_before_pct)
                for p in self.points if p.held_out == held_out]
        return float(np.mean(errs)) if errs else None

    def to_dict(self) -> dict[str, Any]:
        return {"knobs": [{"name": k.name, "fields": list(k.fields), "threads": k.threads,
                           "factor": f} for k, f in zip(self.knobs, self.factors)],
                "points": [p.to_dict() for p in self.points],
                "mae_fit_before_pct": self.mean_abs_error_pct(held_out=False, after=False),
                "mae_fit_after_pct": self.mean_abs_error_pct(held_out=False, after=True),
                "mae_held_out_before_pct": self.mean_abs_error_pct(held_out=True, after=False),
                "mae_held_out_after_pct": self.mean_abs_error_pct(held_out=True, after=True)}


def _float_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(PlatformSpec)
            if f.type in ("float", "float | None")}


def scaled_spec(spec: PlatformSpec, knobs: Sequence[Knob], factors: Sequence[float],
                threads: int) -> PlatformSpec:
    """``spec`` with every knob that applies at ``threads`` multiplying its fields (a field
    that is None, a kernel not probed, stays None)."""
    changes: dict[str, Any] = {}
    for k, f in zip(knobs, factors):
        if k.applies(threads):
            for name in k.fields:
                if getattr(spec, name) is not None:
                    changes[name] = changes.get(name, getattr(spec, name)) * float(f)
    return dataclasses.replace(spec, **changes)


def refit(spec: PlatformSpec, knobs: Sequence[Knob], fit_points: Sequence[FitPoint],
          predict: Callable[[PlatformSpec, FitPoint], float],
          held_out: Sequence[FitPoint] = ()) -> Refit:
    """Fit one factor per knob so that ``predict`` meets the measured points.

    Parameters
    ----------
    spec : PlatformSpec
        The machine as published (or given); the factors multiply its fields.
    knobs : sequence of Knob
        What the machine decides (:data:`HOST_EXPERTS`, :data:`GPU_BASE`,
        :data:`CPU_LAYER_FIXED`, :data:`OP_FIXED`, or any float fields of the spec).
    fit_points : sequence of FitPoint
        The points fitted: at least as many as the knobs, each knob applying to one.
    predict : callable
        ``predict(spec, point) -> µs per token``: the analytic model at that spec.
    held_out : sequence of FitPoint
        Points predicted with the refitted spec but not fitted.
    """
    knobs = tuple(knobs)
    fields = _float_fields()
    for k in knobs:
        bad = [f for f in k.fields if f not in fields]
        if bad or not k.fields:
            raise CopeInputError(f"{k.name}: {bad or 'no fields'} are not constants of the "
                                 f"spec (expected some of {sorted(fields)})", field="knobs")
        if not any(k.applies(p.threads) for p in fit_points):
            raise CopeInputError(f"{k.name}: no fitted point at {k.threads} threads; it "
                                 "cannot be fitted", field="knobs")
    if len(fit_points) < len(knobs):
        raise CopeInputError(f"{len(fit_points)} measured points for {len(knobs)} constants: "
                             "fit at most as many constants as points", field="points")
    measured = np.array([p.measured_us for p in fit_points], np.float64)
    if not np.all(np.isfinite(measured) & (measured > 0)):
        raise CopeInputError("every measured time per token must be a positive number",
                             field="points")

    def residuals(x: np.ndarray) -> np.ndarray:
        f = np.exp(x)
        pred = [predict(scaled_spec(spec, knobs, f, p.threads), p) for p in fit_points]
        return np.log(np.asarray(pred, np.float64) / measured)

    # imported here: scipy.optimize costs about 0.5 s, and every ``cope`` command imports this
    # module (the llama-bench plugins), where only a refit needs it
    from scipy.optimize import least_squares

    bound = np.log(FACTOR_BOUND)
    sol = least_squares(residuals, np.zeros(len(knobs)), bounds=(-bound, bound),
                        x_scale=1.0, diff_step=1e-4)
    factors = tuple(float(v) for v in np.exp(sol.x))

    def row(p: FitPoint, out: bool) -> PointFit:
        before = float(predict(spec, p))
        after = float(predict(scaled_spec(spec, knobs, factors, p.threads), p))
        return PointFit(p.label, float(p.measured_us), before, after, out)
    points = tuple([row(p, False) for p in fit_points] + [row(p, True) for p in held_out])
    return Refit(spec, knobs, factors, points)
