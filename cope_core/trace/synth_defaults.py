"""A synthetic routing trace for any model, made as the shipped examples' are: the parameters
``scripts/make_data.py`` fitted (``data/synthetic-parameters.json``) and its trace and
calibration shapes, drawn by :func:`cope_core.trace.synth.synthesize` (the function ``cope
synth`` calls) in memory.

A model the parameters file names takes its fitted popularity skew; another takes the skew of
the fitted model nearest in routing shape (the same expert count first, then the nearest
``top_k``, then the nearest expert count): the fitted skews come from one coverage curve carried
over by ``K / E`` (data/README.md#how-the-synthetic-traces-are-calibrated), so a model of the
same ``E`` and ``top_k`` would be fitted the same skew, and a nearer shape a nearer one. That is
an assumption, and :attr:`SynthDefaults.basis` says it.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import CopeInputError
from ..geometry import CATALOG, ModelGeometry
from .data import Trace
from .synth import synthesize

PARAMETERS_FILE = Path(__file__).resolve().parents[2] / "data" / "synthetic-parameters.json"
#: The shipped examples' shapes (scripts/make_data.py TRACE_SHAPE and CALIBRATION_SHAPE): the
#: calibration trace is other prompts of the same synthetic model (same seed).
TRACE_PROMPTS, CALIBRATION_PROMPTS, TOKENS = 8, 16, 128


@dataclass(frozen=True)
class SynthDefaults:
    """Generator parameters for one model and where they come from (``basis``, one line)."""

    skew: float
    reuse: float
    predictor_accuracy: float
    basis: str


@functools.cache
def _parameters(path: Path = PARAMETERS_FILE) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
        models = {str(k): float(v["skew"]) for k, v in doc["models"].items()}
        return {"models": models, "reuse": float(doc["reuse"]["value"]),
                "predictor_accuracy": float(doc["predictor_accuracy"])}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CopeInputError(f"cannot read the synthetic traces' parameters ({exc}); "
                             "regenerate with python3 scripts/make_data.py --only calibrate",
                             source=str(path)) from None


def synth_defaults(model: ModelGeometry) -> SynthDefaults:
    """The shipped examples' generator parameters for ``model`` (module docstring)."""
    p = _parameters()
    fitted = p["models"]
    if model.name in fitted:
        skew, basis = fitted[model.name], f"skew {fitted[model.name]:g} fitted for {model.name}"
    else:
        shapes = {n: CATALOG[n] for n in fitted if n in CATALOG}
        if not shapes:
            raise CopeInputError("no fitted model in the catalog", source=str(PARAMETERS_FILE),
                                 field="models")
        near = min(shapes, key=lambda n: (shapes[n].n_experts != model.n_experts,
                                          abs(shapes[n].top_k - model.top_k),
                                          abs(shapes[n].n_experts - model.n_experts), n))
        g = shapes[near]
        skew = fitted[near]
        basis = (f"skew {skew:g} of {near} (top-{g.top_k} of {g.n_experts}, the fitted model "
                 f"nearest to top-{model.top_k} of {model.n_experts}; an assumption)")
    return SynthDefaults(skew=skew, reuse=p["reuse"], predictor_accuracy=p["predictor_accuracy"],
                         basis=f"{basis}, reuse {p['reuse']:g} and predictor recall "
                               f"{p['predictor_accuracy']:g} as the shipped examples'")


def synthetic_inputs(model: ModelGeometry, seed: int = 0) -> tuple[Trace, Trace]:
    """An evaluation trace and a calibration trace of ``model``, made in memory as the shipped
    examples' (:data:`TRACE_PROMPTS` and :data:`CALIBRATION_PROMPTS` prompts of
    :data:`TOKENS` decode tokens, the calibration's prompts after the trace's, one seed).

    Returns
    -------
    (Trace, Trace)
        SYNTHETIC traces whose descriptions say how they were made.
    """
    d = synth_defaults(model)
    desc = f"SYNTHETIC, made in memory as the shipped examples' ({d.basis}), seed {seed}"

    def made(prompts: int, first: int, what: str) -> Trace:
        return synthesize(model, prompts=prompts, tokens=TOKENS, seed=seed, skew=d.skew,
                          reuse=d.reuse, predictor_accuracy=d.predictor_accuracy,
                          description=what + desc, first_prompt=first)
    return made(TRACE_PROMPTS, 0, ""), made(CALIBRATION_PROMPTS, TRACE_PROMPTS,
                                            "calibration trace; ")
