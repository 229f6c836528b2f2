"""The verify record (``cope.verify/1``, docs/formats.md#verify-record-copeverify1): what
``cope verify`` predicted, measured and concluded, cell by cell. It is plain data — no torch —
so the app and ``cope export --from-verify`` read it without the executor."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CopeInputError
from ..files import write_atomic
from ..geometry import ModelGeometry
from ..matrix import CANDIDATE_IDS

VERIFY_SCHEMA = "cope.verify/1"
STOPS = ("one left", "equivalent", "budget", "max rounds")


@dataclass(frozen=True)
class VerifyCell:
    """One cell (K, operating point) of a verify run.

    Attributes
    ----------
    K, cpu_threads, gpu_share
        The cell.
    predicted_winner : str
        COPE's pick.
    contenders : list of dict
        ``candidate, predicted_us, predicted_lo_us, predicted_hi_us, win_probability``: what
        entered the race, fastest predicted first.
    dropped : list of dict
        ``candidate, round, measured_us, behind_pct``: who left the race after which round.
    remaining : list of str
        Still in the race at the end (the verified winner first).
    verified_winner : str
        The fastest measured of ``remaining``.
    measured_us, measured_lo_us, measured_hi_us : float
        Its measured TPOT and 95 % interval (two-level bootstrap; None when it cannot be drawn).
    stop : str
        Why the race ended: one of :data:`STOPS`.
    rounds : int
    candidate_trials : int
        Candidates measured over all prompts, summed over rounds.
    full_candidate_trials : int
        What measuring all 13 candidates with ``cope measure``'s trials would take.
    seconds : float
        Time this cell's race took (warm-up included).
    full_seconds_estimate : float
        That full measurement's time, from this cell's seconds per run scaled by the
        predicted TPOT of every candidate.
    runs : list of list
        ``[candidate, prompt, trial, tpot_us]`` of every measured run.
    """

    K: int
    cpu_threads: int
    gpu_share: float
    predicted_winner: str
    contenders: list[dict[str, Any]]
    dropped: list[dict[str, Any]]
    remaining: list[str]
    verified_winner: str
    measured_us: float
    measured_lo_us: float | None
    measured_hi_us: float | None
    stop: str
    rounds: int
    candidate_trials: int
    full_candidate_trials: int
    seconds: float
    full_seconds_estimate: float
    runs: list[list[Any]] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """The prediction stands: the predicted winner is still in the race at the end (the
        measured leader, or measured within noise of it)."""
        return self.predicted_winner in self.remaining


@dataclass(frozen=True)
class VerifyRecord:
    """A whole ``cope verify`` run: the cells and what they were measured with."""

    model: ModelGeometry
    platform: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    cells: list[VerifyCell]
    created: str = ""
    tool: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> dict[str, Any]:
        """Sums over the cells, and how many verified the prediction."""
        return {"cells": len(self.cells),
                "agree": sum(c.agrees for c in self.cells),
                "candidate_trials": sum(c.candidate_trials for c in self.cells),
                "full_candidate_trials": sum(c.full_candidate_trials for c in self.cells),
                "seconds": sum(c.seconds for c in self.cells),
                "full_seconds_estimate": sum(c.full_seconds_estimate for c in self.cells)}

    def cell(self, K: int | None = None, cpu_threads: int | None = None) -> VerifyCell:
        """The one cell matching ``K`` and ``cpu_threads`` (either may be left out when the
        record has only one cell that fits)."""
        hits = [c for c in self.cells if (K is None or c.K == K)
                and (cpu_threads is None or c.cpu_threads == cpu_threads)]
        if len(hits) != 1:
            have = ", ".join(f"K={c.K} threads={c.cpu_threads}" for c in self.cells)
            raise CopeInputError(f"{'no' if not hits else len(hits)} cells match; the record "
                                 f"has {have}: choose one with -K and --threads",
                                 field="cells")
        return hits[0]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": VERIFY_SCHEMA, "model": self.model.to_dict(),
                "platform": self.platform, "inputs": self.inputs, "settings": self.settings,
                "created": self.created, "tool": self.tool, "totals": self.totals(),
                "cells": [_finite(asdict(c)) for c in self.cells]}

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> VerifyRecord:
        if not isinstance(data, dict) or data.get("schema") != VERIFY_SCHEMA:
            got = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise CopeInputError(f"got {got!r}, expected {VERIFY_SCHEMA!r}", source=source,
                                 field="schema")
        for key in ("model", "platform", "inputs", "settings"):
            if not isinstance(data.get(key), dict):
                raise CopeInputError("expected an object", source=source, field=key)
        if not isinstance(data.get("cells"), list) or not data["cells"]:
            raise CopeInputError("expected a non-empty list of cells", source=source,
                                 field="cells")
        model = ModelGeometry.from_dict(data["model"], source=source)
        return cls(model=model, platform=data["platform"], inputs=data["inputs"],
                   settings=data["settings"], created=str(data.get("created", "")),
                   tool=dict(data.get("tool") or {}),
                   cells=[_cell(c, i, source) for i, c in enumerate(data["cells"])])


_CELL_TYPES: dict[str, Any] = {
    "K": int, "cpu_threads": int, "gpu_share": (int, float), "predicted_winner": str,
    "contenders": list, "dropped": list, "remaining": list, "verified_winner": str,
    "measured_us": (int, float), "measured_lo_us": (int, float, type(None)),
    "measured_hi_us": (int, float, type(None)), "stop": str, "rounds": int,
    "candidate_trials": int, "full_candidate_trials": int, "seconds": (int, float),
    "full_seconds_estimate": (int, float), "runs": list}


def _cell(c: Any, i: int, source: str | None) -> VerifyCell:
    if not isinstance(c, dict):
        raise CopeInputError("expected an object", source=source, field=f"cells[{i}]")
    for key, kind in _CELL_TYPES.items():
        if key not in c or not isinstance(c[key], kind) or isinstance(c[key], bool):
            raise CopeInputError(f"got {c.get(key)!r:.40}, expected {_name(kind)}",
                                 source=source, field=f"cells[{i}].{key}")
    for key in ("predicted_winner", "verified_winner"):
        if c[key] not in CANDIDATE_IDS:
            raise CopeInputError(f"unknown candidate {c[key]!r}", source=source,
                                 field=f"cells[{i}].{key}")
    if c["stop"] not in STOPS:
        raise CopeInputError(f"got {c['stop']!r}, expected one of {list(STOPS)}", source=source,
                             field=f"cells[{i}].stop")
    return VerifyCell(**{k: c[k] for k in _CELL_TYPES})


def _name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a whole number", float: "a number", str: "a string", list: "a list",
             type(None): "null"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def _finite(obj: Any) -> Any:
    """NaN and infinities become null: the JSON stays strictly valid."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def verify_json(record: VerifyRecord) -> str:
    """The record as strictly valid JSON text."""
    return json.dumps(record.to_dict(), indent=1, allow_nan=False) + "\n"


def write_verify(record: VerifyRecord, path: str | Path, *, overwrite: bool = False) -> None:
    """Write ``record`` as JSON (atomic; an existing file only with ``overwrite``)."""
    write_atomic(path, verify_json(record), overwrite=overwrite)


def parse_verify(data: bytes | str, source: str) -> VerifyRecord:
    """Check the bytes of a ``cope.verify/1`` record (a file's or an upload's)."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CopeInputError(f"not a JSON file ({exc})", source=source) from None
    return VerifyRecord.from_dict(obj, source=source)


def read_verify(path: str | Path) -> VerifyRecord:
    """Read and check a ``cope.verify/1`` file; bad input raises CopeInputError naming the
    field."""
    src = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CopeInputError("not found", source=src) from None
    except OSError as exc:
        raise CopeInputError(f"not readable ({exc})", source=src) from None
    return parse_verify(data, src)
