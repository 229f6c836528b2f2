"""The ``cope.policy/1`` record: one chosen policy, ready to render for a runtime.

A policy holds everything the renderers need, so ``cope export --from-policy FILE`` works
without the Parquet inputs: the model geometry, platform and operating point, the candidate,
``K`` and the VRAM budget, the resident expert ids of every MoE layer (the initial fill), every
candidate's predicted TPOT at that ``K`` by each estimator (the runner-up, the margin and the
nearest expressible candidate of a runtime all come from them) and the provenance.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import CopeInputError
from ..estimate.ranking import fastest_first, runner_up
from ..files import write_atomic
from ..geometry import ModelGeometry
from ..llamacpp import CacheRecord, LlamaAnswer, llamacpp_answer
from ..matrix import CANDIDATE_IDS, get_candidate
from ..placement import LayerPlan, layer_plan

SCHEMA = "cope.policy/1"
ESTIMATORS = ("cope", "atomic", "hrm")


#: How a policy's candidate was chosen: COPE's predicted winner, the user's, or the winner
#: ``cope verify`` measured (its record in ``provenance.verify``).
CHOSEN_BY = ("best", "user", "verified")


@dataclass(frozen=True, eq=False)
class Policy:
    """A chosen candidate at one cache size, with its predictions and provenance.

    Attributes
    ----------
    model : ModelGeometry
    candidate, experts_per_layer : str, int
        Candidate id (``layer_partition`` or ``RESIDENCY/EXECUTION``); ``K``, slots per layer.
    resident_experts : tuple of tuple of int
        Per MoE layer, the ``K`` experts of the initial fill, most popular first.
    predictions_us : dict
        Per estimator (``cope``, ``atomic``, ``hrm``): candidate id -> predicted TPOT in
        microseconds at ``K`` for all 13 candidates, or None when that estimator was skipped.
    platform : dict
        The profile's platform metadata (GPU, CPU, link, roofline spec).
    cpu_threads, gpu_share : int, float
        Operating point of the profile the predictions used.
    vram : dict
        ``budget_gib`` (None when ``K`` was given), ``needed_gib`` (memory model at ``K``),
        ``context`` and ``workspace_gib`` of that memory model.
    chosen_by : str
        ``best`` (the COPE winner) or ``user``.
    fill : dict
        ``source`` (``calibration`` or ``trace``: the latter is optimistic) and ``by_id``.
    analytic_profile, estimator_notes : bool, dict
        The profile is an analytic what-if; why an estimator was skipped, by estimator.
    trace : dict
        Summary of the evaluated trace: ``source``, ``prompts``, ``tokens``.
    provenance : dict
        ``inputs`` (role -> ``{"path", "sha256"}``), ``tool``, ``version``, ``created`` (UTC).
    confidence : dict
        How sure COPE's prediction is (:mod:`cope_core.estimate.uncertainty`): ``draws``,
        ``seed``, ``level``, ``sources``, and per candidate ``tpot_ci_us`` ([low, high] or
        None) and ``win_probability`` (None for an equivalent candidate); plus
        ``prompts_for_confidence``. Empty for records written before it existed.
    equivalent_to : dict
        Candidate id -> the earlier candidate that is the same policy by COPE, or None
        (:func:`cope_core.estimate.uncertainty.equivalences`; the runner-up is never the chosen
        candidate's policy); empty in records written before it existed.
    llamacpp_cache : CacheRecord or None
        llama.cpp's space searched at this VRAM; None when not searched.
    path : str or None
        File it was read from, for messages.
    """

    model: ModelGeometry
    candidate: str
    experts_per_layer: int
    resident_experts: tuple[tuple[int, ...], ...]
    predictions_us: dict[str, dict[str, float] | None]
    platform: dict[str, Any]
    cpu_threads: int
    gpu_share: float
    vram: dict[str, Any]
    chosen_by: str = "user"
    fill: dict[str, Any] = field(default_factory=lambda: {"source": "calibration", "by_id": False})
    analytic_profile: bool = False
    estimator_notes: dict[str, str] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    confidence: dict[str, Any] = field(default_factory=dict)
    equivalent_to: dict[str, str | None] = field(default_factory=dict)
    llamacpp_cache: CacheRecord | None = None
    path: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _check(self, self.path)

    # --- derived -----------------------------------------------------------------------------
    @cached_property
    def llamacpp_answer(self) -> LlamaAnswer | None:
        """llama.cpp's answer here, made once and handed to every surface (None: not searched)."""
        rec = self.llamacpp_cache
        return None if rec is None else llamacpp_answer(
            rec, self.model, self.cpu_threads, experts_per_layer=self.experts_per_layer)

    @property
    def residency(self) -> str | None:
        c = get_candidate(self.candidate)
        return c.residency.value if c.residency else None

    @property
    def execution(self) -> str | None:
        c = get_candidate(self.candidate)
        return c.execution.value if c.execution else None

    @property
    def layer_plan(self) -> LayerPlan:
        """The layer partition at the same VRAM: the most last MoE layers on the GPU whose
        stored experts fit K's bytes (:func:`cope_core.placement.layer_plan`)."""
        return layer_plan(self.model, self.experts_per_layer)

    def tpot_us(self, candidate: str | None = None, estimator: str = "cope") -> float | None:
        """Predicted TPOT of ``candidate`` (default: the chosen one), None if not estimated."""
        table = self.predictions_us.get(estimator)
        return None if table is None else table[candidate or self.candidate]

    def cope_us(self, candidate: str | None = None) -> float:
        """COPE's predicted TPOT of ``candidate`` (default: the chosen one); a record always has
        COPE's predictions."""
        table = self.predictions_us["cope"]
        assert table is not None              # _check refuses a record without them
        return table[candidate or self.candidate]

    def ranking(self, estimator: str = "cope") -> list[tuple[str, float]]:
        """Candidates fastest first; exact ties keep the canonical candidate order."""
        table = self.predictions_us[estimator]
        if table is None:
            raise ValueError(f"the {estimator} estimator was skipped for this record")
        return [(c, table[c]) for c in fastest_first(table)]

    @property
    def rank(self) -> int:
        return [c for c, _ in self.ranking()].index(self.candidate) + 1

    @property
    def runner_up(self) -> tuple[str, float] | None:
        """The fastest candidate by COPE that is not the chosen one's policy, with its TPOT
        (None when every other candidate is that policy here)."""
        cope = self.predictions_us["cope"]
        assert cope is not None
        ru = runner_up(cope, self.equivalent_to, self.candidate)
        return None if ru is None else (ru, cope[ru])

    def interval_us(self, candidate: str | None = None) -> tuple[float, float] | None:
        """COPE's 95 % interval of ``candidate``'s TPOT (default: the chosen one), if known."""
        ci = self.confidence.get("tpot_ci_us", {}).get(candidate or self.candidate)
        return None if ci is None else (float(ci[0]), float(ci[1]))

    def win_probability(self, candidate: str | None = None) -> float | None:
        """Share of the draws in which ``candidate`` (default: the chosen one) is fastest."""
        p = self.confidence.get("win_probability", {}).get(candidate or self.candidate)
        return None if p is None else float(p)

    @property
    def margin_pct(self) -> float | None:
        """Runner-up's TPOT over the chosen one's, in percent (negative: another is faster;
        None without a runner-up)."""
        mine, ru = self.cope_us(), self.runner_up
        if ru is None:
            return None
        return (ru[1] - mine) / mine * 100 if mine > 0 else 0.0

    # --- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        plan = self.layer_plan
        ru = self.runner_up
        return {
            "schema": SCHEMA,
            "model": self.model.to_dict(),
            "platform": self.platform,
            "analytic_profile": self.analytic_profile,
            "operating_point": {"cpu_threads": self.cpu_threads, "gpu_share": self.gpu_share},
            "candidate": {"id": self.candidate, "residency": self.residency,
                          "execution": self.execution, "chosen_by": self.chosen_by},
            "experts_per_layer": self.experts_per_layer,
            "vram": self.vram,
            "layer_partition": {"n_cpu_layers": plan.n_cpu, "n_gpu_layers": plan.n_gpu,
                                "dense_layers": plan.dense_layers},
            "fill": self.fill,
            "resident_experts": [list(r) for r in self.resident_experts],
            "predicted_tpot_us": {e: self.tpot_us(estimator=e) for e in ESTIMATORS},
            "estimator_notes": self.estimator_notes,
            "rank": self.rank,
            "runner_up": None if ru is None else {"candidate": ru[0], "tpot_us": ru[1]},
            "margin_pct": self.margin_pct,
            "predictions_us": self.predictions_us,
            "trace": self.trace,
            "provenance": self.provenance,
            "confidence": self.confidence,
            "equivalent_to": self.equivalent_to,
            **({"llamacpp_cache": self.llamacpp_cache.to_dict()} if self.llamacpp_cache
               else {}),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> Policy:
        """Read a ``cope.policy/1`` object; derived fields must agree with the predictions."""
        if not isinstance(data, Mapping):
            raise CopeInputError("expected a JSON object", source=source)
        if data.get("schema") != SCHEMA:
            raise CopeInputError(f"got {data.get('schema')!r}, expected {SCHEMA!r}", source=source,
                                 field="schema")
        get = _Getter(data, source)
        cand = get("candidate", Mapping)
        op = get("operating_point", Mapping)
        policy = cls(
            model=ModelGeometry.from_dict(get("model", Mapping), source=source),
            candidate=_sub(cand, "id", str, source, "candidate"),
            experts_per_layer=get("experts_per_layer", int),
            resident_experts=tuple(tuple(r) if isinstance(r, list) else r
                                   for r in get("resident_experts", list)),
            predictions_us=dict(get("predictions_us", Mapping)),
            platform=dict(get("platform", Mapping)),
            cpu_threads=_sub(op, "cpu_threads", int, source, "operating_point"),
            gpu_share=float(_sub(op, "gpu_share", (int, float), source, "operating_point")),
            vram=dict(get("vram", Mapping)),
            chosen_by=_sub(cand, "chosen_by", str, source, "candidate"),
            fill=dict(get("fill", Mapping)),
            analytic_profile=get("analytic_profile", bool),
            estimator_notes=dict(get("estimator_notes", Mapping)),
            trace=dict(get("trace", Mapping)),
            provenance=dict(get("provenance", Mapping)),
            confidence=dict(data.get("confidence") or {}),
            equivalent_to=dict(data.get("equivalent_to") or {}),
            llamacpp_cache=CacheRecord.from_dict(data.get("llamacpp_cache") or {}, source),
            path=source,
        )
        derived = policy.to_dict()
        for key in ("candidate", "layer_partition", "predicted_tpot_us", "rank", "runner_up",
                    "margin_pct"):
            if key not in data:
                raise CopeInputError("missing", source=source, field=key)
            if not _same(data[key], derived[key]):
                raise CopeInputError(f"{json.dumps(data[key])} disagrees with the record's "
                                     "predictions and geometry, expected "
                                     f"{json.dumps(derived[key])}", source=source, field=key)
        return policy


def policy_json(policy: Policy) -> str:
    """The record as indented JSON text, one line per resident-expert row (floats round-trip
    exactly)."""
    data = policy.to_dict()
    rows = data["resident_experts"]
    data["resident_experts"] = [f"@row{i}@" for i in range(len(rows))]
    text = json.dumps(data, indent=2, allow_nan=False)
    for i, row in enumerate(rows):
        text = text.replace(f'"@row{i}@"', json.dumps(row), 1)
    return text + "\n"


def read_policy(path: str | Path) -> Policy:
    """Read and validate a ``cope.policy/1`` JSON file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CopeInputError("file not found", source=str(p)) from None
    except IsADirectoryError:
        raise CopeInputError("is a directory, expected a policy JSON file", source=str(p)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        text = " ".join(str(exc).split())
        raise CopeInputError(f"not a readable JSON policy ({text})", source=str(p)) from None
    return Policy.from_dict(data, source=str(p))


def write_policy(policy: Policy, path: str | Path, *, overwrite: bool = False) -> None:
    """Write the record as JSON, atomically; an existing file needs ``overwrite``."""
    write_atomic(path, policy_json(policy).encode(), overwrite=overwrite)


# --- validation ------------------------------------------------------------------------------
class _Getter:
    def __init__(self, data: Mapping, source: str | None):
        self.data, self.source = data, source

    def __call__(self, key: str, types):
        return _sub(self.data, key, types, self.source, None)


def _sub(obj: Mapping, key: str, types, source: str | None, parent: str | None):
    name = f"{parent}.{key}" if parent else key
    if key not in obj:
        raise CopeInputError("missing", source=source, field=name)
    v = obj[key]
    bad = not isinstance(v, types) or (types is int and isinstance(v, bool))
    if bad:
        want = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise CopeInputError(f"expected {want}, got {v!r}", source=source, field=name)
    return v


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _check(p: Policy, src: str | None) -> None:
    g = p.model
    L, E = g.n_layers, g.n_experts
    get_candidate_checked(p.candidate, src)
    K = p.experts_per_layer
    if not isinstance(K, int) or isinstance(K, bool) or not 0 <= K <= E:
        raise CopeInputError(f"{K!r} is out of range, expected 0..{E}", source=src,
                             field="experts_per_layer")
    rows = p.resident_experts
    if len(rows) != L:
        raise CopeInputError(f"expected {L} rows (one per MoE layer), got {len(rows)}",
                             source=src, field="resident_experts")
    for layer, row in enumerate(rows):
        ok = (isinstance(row, tuple) and len(row) == K and len(set(row)) == K
              and all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < E for e in row))
        if not ok:
            raise CopeInputError(f"layer {layer}: expected {K} distinct expert ids in 0..{E - 1}, "
                                 f"got {list(row) if isinstance(row, tuple) else row!r}",
                                 source=src, field="resident_experts")
    if set(p.predictions_us) != set(ESTIMATORS):
        raise CopeInputError(f"expected the estimators {list(ESTIMATORS)}, got "
                             f"{sorted(p.predictions_us)}", source=src, field="predictions_us")
    if p.predictions_us["cope"] is None:
        raise CopeInputError("the cope estimator's predictions are required", source=src,
                             field="predictions_us.cope")
    for est, table in p.predictions_us.items():
        if table is None:
            continue
        if not isinstance(table, Mapping) or set(table) != set(CANDIDATE_IDS):
            raise CopeInputError(f"expected one TPOT for each of the {len(CANDIDATE_IDS)} "
                                 "candidates", source=src, field=f"predictions_us.{est}")
        for cid, v in table.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise CopeInputError(f"{cid}: expected a finite TPOT >= 0 in microseconds, got "
                                     f"{v!r}", source=src, field=f"predictions_us.{est}")
    for key, optional in (("budget_gib", True), ("needed_gib", False)):
        gib = p.vram.get(key)
        if not ((optional and gib is None) or (isinstance(gib, (int, float))
                                             and not isinstance(gib, bool) and math.isfinite(gib))):
            raise CopeInputError(f"expected a finite number of GiB{' or null' if optional else ''}"
                                 f", got {gib!r}", source=src, field=f"vram.{key}")
    if p.chosen_by not in CHOSEN_BY:
        raise CopeInputError(f"got {p.chosen_by!r}, expected one of {list(CHOSEN_BY)}",
                             source=src, field="candidate.chosen_by")
    _check_confidence(p.confidence, src)
    if not (p.llamacpp_cache is None or isinstance(p.llamacpp_cache, CacheRecord)):
        raise CopeInputError(f"expected a CacheRecord or None, got {type(p.llamacpp_cache)}",
                             source=src, field="llamacpp_cache")
    for cid, eq in p.equivalent_to.items():
        if cid not in CANDIDATE_IDS or not (eq is None or (eq in CANDIDATE_IDS and eq != cid)):
            raise CopeInputError(f"{cid}: expected another candidate id or null, got {eq!r}",
                                 source=src, field="equivalent_to")
    if isinstance(p.cpu_threads, bool) or not isinstance(p.cpu_threads, int) or p.cpu_threads < 1:
        raise CopeInputError(f"expected a positive whole number, got {p.cpu_threads!r}",
                             source=src, field="operating_point.cpu_threads")


def _check_confidence(conf: Mapping, src: str | None) -> None:
    if not isinstance(conf, Mapping):
        raise CopeInputError(f"expected an object, got {conf!r}", source=src, field="confidence")
    for cid, ci in (conf.get("tpot_ci_us") or {}).items():
        ok = ci is None or (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in ci) and ci[0] <= ci[1])
        if cid not in CANDIDATE_IDS or not ok:
            raise CopeInputError(f"{cid}: expected [low, high] in microseconds or null, got "
                                 f"{ci!r}", source=src, field="confidence.tpot_ci_us")
    for cid, v in (conf.get("win_probability") or {}).items():
        if cid not in CANDIDATE_IDS or not (v is None or (
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1)):
            raise CopeInputError(f"{cid}: expected a probability in [0, 1] or null, got {v!r}",
                                 source=src, field="confidence.win_probability")


def get_candidate_checked(cid: Any, src: str | None) -> None:
    if not isinstance(cid, str) or cid not in CANDIDATE_IDS:
        raise CopeInputError(f"unknown candidate {cid!r}; expected one of {list(CANDIDATE_IDS)}",
                             source=src, field="candidate")
