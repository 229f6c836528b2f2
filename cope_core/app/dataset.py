"""What the app shows: shipped examples found on disk, the loaded dataset and its provenance.

Shipped files are grouped by the model named in their ``cope`` metadata, so new files under
``data/examples/`` appear without code changes; a model cut to fewer MoE layers than the
catalog's (e.g. a small measured example) is its own group, named with its layer count. A trace
whose file name contains ``calib`` is a calibration trace (it sets the popularity fill); others
are evaluation traces.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import parquet_io
from ..errors import CopeInputError
from ..geometry import CATALOG
from ..measurements import Measurements
from ..profile.data import Profile
from ..profile.pricing import check_compatible
from ..trace.data import Trace
from ..verify import read_verify

SLOTS = ("trace", "calibration", "profile", "measurements")
#: Which schema each slot holds.
SLOT_SCHEMA = {"trace": parquet_io.TRACE_SCHEMA, "calibration": parquet_io.TRACE_SCHEMA,
               "profile": parquet_io.PROFILE_SCHEMA,
               "measurements": parquet_io.MEASUREMENTS_SCHEMA}


@dataclass(frozen=True)
class Example:
    """The shipped files of one model.

    Attributes
    ----------
    name : str
        Model name from the files' metadata, e.g. ``"qwen3-30b-a3b"``.
    traces, calibrations, profiles, measurements : tuple of str
        File paths, sorted by name.
    verifies : tuple of str
        ``cope verify`` records (``cope.verify/1`` JSON) of the model.
    """

    name: str
    traces: tuple[str, ...] = ()
    calibrations: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    measurements: tuple[str, ...] = ()
    verifies: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """An example needs at least a trace and a profile."""
        return bool(self.traces and self.profiles)


def example_name(model: Any) -> str | None:
    """Group name of a file's ``model`` metadata: the model name, plus its MoE layer count when
    that differs from the catalog's (files of a cut model cannot be combined with full ones)."""
    name = model.get("name") if isinstance(model, dict) else None
    if not isinstance(name, str):
        return None
    layers = model.get("n_layers")
    full = CATALOG.get(name)
    if full is not None and isinstance(layers, int) and layers != full.n_layers:
        return f"{name} · {layers} MoE layers"
    return name


def scan_examples(folder: str | os.PathLike) -> list[Example]:
    """Group the COPE Parquet files of ``folder`` by model; unreadable files are skipped.

    Returns only usable examples (trace and profile present), sorted by model name.
    """
    groups: dict[str, dict[str, list[str]]] = {}
    root = Path(folder)
    if not root.is_dir():
        return []
    for path in sorted(root.glob("*.parquet")):
        try:
            meta = parquet_io.read_metadata(path)
        except CopeInputError:
            continue
        name = example_name(meta.get("model"))
        if name is None:
            continue
        g = groups.setdefault(name, _empty_group())
        schema = parquet_io.schema_family(meta["schema"])
        if schema == parquet_io.TRACE_SCHEMA:
            g["calibrations" if "calib" in path.name.lower() else "traces"].append(str(path))
        elif schema == parquet_io.PROFILE_SCHEMA:
            g["profiles"].append(str(path))
        elif schema == parquet_io.MEASUREMENTS_SCHEMA:
            g["measurements"].append(str(path))
    for path in sorted(root.glob("*.json")):
        try:
            rec = read_verify(path)
        except CopeInputError:
            continue          # other JSON (reports) or a broken record: not an input
        name = example_name(rec.model.to_dict())
        if name is not None:
            groups.setdefault(name, _empty_group())["verifies"].append(str(path))
    out = [Example(name, **{k: tuple(v) for k, v in g.items()}) for name, g in groups.items()]
    return sorted((e for e in out if e.usable), key=lambda e: e.name)


def _empty_group() -> dict[str, list[str]]:
    return {"traces": [], "calibrations": [], "profiles": [], "measurements": [], "verifies": []}


#: Settings of the emulated platform that a profile and measurements must share.
_EMULATION = {"link_gbps": None, "cpu_slowdown": 1.0}


def matching_measurements(measurements: tuple[str, ...], profile: str | None) -> str | None:
    """Of an example's measurement files, the one made on the profile's platform (the same
    paced link and host speed: the grid's cells, one profile per setting); else the first."""
    if not measurements:
        return None
    try:
        want = parquet_io.read_metadata(profile)["platform"] if profile else {}
    except (CopeInputError, KeyError, TypeError):
        return measurements[0]

    def setting(plat: dict | None) -> tuple:
        return tuple((plat or {}).get(k, d) for k, d in _EMULATION.items())
    for m in measurements:
        try:
            if setting(parquet_io.read_metadata(m).get("platform")) == setting(want):
                return m
        except CopeInputError:
            continue
    return measurements[0]


@dataclass(frozen=True, eq=False)
class Dataset:
    """The inputs every page works on.

    Attributes
    ----------
    key : str
        Identifies the files behind the inputs (paths and modification stamps): equal keys mean
        equal inputs, so results may be cached under it.
    trace, calibration, profile, measurements
        The loaded inputs; calibration and measurements may be None.
    origin : dict
        Slot -> where it came from, e.g. ``"example qwen3-30b-a3b-trace.parquet"``.
    problems : tuple of str
        One-line reasons why the inputs cannot be combined for predictions (empty when fine).
    notes : tuple of str
        Things the user should know, e.g. a calibration trace dropped for a geometry mismatch.
    """

    key: str
    trace: Trace
    calibration: Trace | None
    profile: Profile
    measurements: Measurements | None = None
    origin: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    measurement_problem: str | None = None


def assemble(key: str, trace: Trace, calibration: Trace | None, profile: Profile,
             measurements: Measurements | None, origin: dict[str, str]) -> Dataset:
    """Combine loaded inputs, dropping what does not fit the trace and saying why.

    A calibration trace of another geometry is dropped (the fill then comes from the trace,
    with the optimistic-prediction warning); a profile that does not match the trace is a
    problem that stops predictions; measurements of another geometry are set aside.
    """
    notes, problems = [], []
    if calibration is not None:
        try:
            check_compatible(trace, None, calibration)
        except CopeInputError as exc:
            notes.append(f"calibration trace not used: {exc}")
            calibration = None
    try:
        check_compatible(trace, profile, None)
    except CopeInputError as exc:
        problems.append(f"{exc} — load a profile for the trace's model")
    meas_problem = None
    if measurements is not None and not measurements.model.same_shape(trace.model):
        meas_problem = (f"{measurements.path}: field 'model': measured geometry "
                        f"{measurements.model.name!r} differs from the trace's "
                        f"{trace.model.name!r}; expected measurements of the same model")
    # the library's messages name files by path: the app shows file names only
    return Dataset(key=key, trace=trace, calibration=calibration, profile=profile,
                   measurements=measurements, origin=dict(origin),
                   problems=tuple(map(file_names, problems)), notes=tuple(map(file_names, notes)),
                   measurement_problem=file_names(meas_problem) if meas_problem else None)


# --- provenance labels --------------------------------------------------------------------------
def trace_label(trace: Trace) -> str:
    """``SYNTHETIC``, ``COLLECTED`` or ``IMPORTED`` trace, as the metadata says."""
    return f"{trace.source.upper()} trace"


def profile_label(profile: Profile) -> str:
    """``ANALYTIC`` (what-if) or ``MEASURED`` profile, with the machine."""
    plat = profile.platform or {}
    gpu = plat.get("gpu") or "unknown GPU"
    if profile.analytic:
        spec = plat.get("spec") or {}
        how = ("published peak numbers with efficiencies and overheads fitted on the COPE "
               "paper's A100 winners" if spec.get("source") == "published" and
               "gpu_launch_us" in spec else
               "a user's spec" if spec.get("source") == "user" else "the pure roofline")
        return f"ANALYTIC profile ({gpu}: {how}; a what-if, not measured)"
    emulated = _emulated(plat)
    return f"MEASURED profile ({gpu}{', EMULATED accelerator' if emulated else ''})"


_PATH = re.compile(r"(?<![\w.])(?:/[^\s/;,()]+)+/([^\s/;,()]+)")


def file_names(text: str) -> str:
    """``text`` with every absolute path shortened to its file name: the app never shows a
    path of the machine it is served from."""
    return _PATH.sub(r"\1", text or "")


def measurements_label(m: Measurements) -> str:
    plat = m.platform or {}
    gpu = plat.get("gpu") or "unknown device"
    return f"MEASURED TPOT ({gpu}{', EMULATED accelerator' if _emulated(plat) else ''})"


def _emulated(platform: dict[str, Any]) -> bool:
    return any(str(platform.get(k, "")).lower() == "emulated"
               for k in ("accelerator", "gpu", "device"))


def provenance(ds: Dataset) -> str:
    """One line for captions and figure titles, e.g. ``SYNTHETIC trace · ANALYTIC profile``."""
    parts = [f"{ds.trace.model.name}", trace_label(ds.trace),
             profile_label(ds.profile).split(" (")[0]
             + f" ({(ds.profile.platform or {}).get('gpu') or '?'})"]
    return " · ".join(parts)


def geometry_rows(trace: Trace) -> list[dict[str, Any]]:
    """The model geometry as (field, value) rows, with derived sizes."""
    g = trace.model
    rows = [{"field": k, "value": str(v)} for k, v in g.to_dict().items()]
    rows += [{"field": "expert size (MiB)", "value": f"{g.expert_bytes / 2**20:.2f}"},
             {"field": "all routed experts (GiB)", "value": f"{g.all_expert_bytes / 2**30:.2f}"},
             {"field": "non-expert weights (GiB)", "value": f"{g.non_expert_bytes / 2**30:.2f}"}]
    return rows
