"""Where the explorer's data comes from: the shipped examples and the user's uploads, read with
:mod:`cope_core.parquet_io` through ``st.cache_data`` (keyed by path and modification stamp), and
assembled into the :class:`~cope_core.app.dataset.Dataset` every page shows. Uploads are written
to a temp file and read (never executed or unpickled); a bad upload shows the library's one-line
message and the previous data stays in use."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

from .. import parquet_io
from ..errors import CopeInputError
from ..files import write_atomic
from ..geometry import ModelGeometry
from ..models import read_model_file
from ..profile.analytic import analytic_for_model
from ..profile.data import Profile
from ..trace.data import Trace
from ..verify import VerifyRecord, parse_verify, read_verify
from . import persisted, your_machine
from .dataset import Dataset, Example, assemble, matching_measurements, provenance, scan_examples
from .machine_choice import catalog_models
from .url_state import bound, rebind, resolve

EXAMPLES_DIR = Path(os.environ.get("COPE_EXAMPLES_DIR")
                    or Path(__file__).resolve().parents[2] / "data" / "examples")
UPLOAD_DIR = Path(tempfile.gettempdir()) / "cope-app-uploads"
_READERS: dict[str, Callable[[str], Any]] = {
    "trace": parquet_io.read_trace, "profile": parquet_io.read_profile,
    "measurements": parquet_io.read_measurements,
    "model": lambda path: read_model_file(path).geometry}
SLOT_KIND = {"trace": "trace", "calibration": "trace", "profile": "profile",
             "measurements": "measurements", "model": "model"}
#: File types each uploader takes (a model: a GGUF, or only its first megabytes, or a
#: config.json)
SLOT_TYPES = {"model": ["gguf", "json"]}
_UPLOADS, _SEEN, _ERRORS = "cope_uploads", "cope_upload_seen", "cope_upload_errors"
#: the example the uploads were made for, and the note shown once after they were dropped
_UPLOADS_FOR, _DROPPED = "cope_uploads_for", "cope_uploads_dropped"
#: An upload's size on the wire (the uploader refuses more, and so does the server) and the
#: memory its columns may take once read (checked from the Parquet footer before reading): a
#: session holds at most its own few uploads, so a class of many cannot exhaust the server
#: (docs/app.md#many-sessions-on-one-server).
MAX_UPLOAD_MB = 100
MAX_DECODED_MIB = 256
_VERIFY_UPLOAD = "cope_verify_upload"


# --- loading --------------------------------------------------------------------------------------
def _stamp(path: str | os.PathLike) -> str:
    try:
        s = os.stat(path)
    except OSError:
        return "missing"  # the reader then names the file
    return f"{s.st_mtime_ns}:{s.st_size}"


# One object per file for every session (frozen, never modified): a rerun neither copies nor
# re-reads them, and a restarted server unpickles what it read before (persisted.read_shipped).
@st.cache_resource(show_spinner=False, max_entries=32)
def _read_cached(kind: str, path: str, stamp: str) -> Any:
    return persisted.read_shipped(kind, path, stamp, _READERS[kind])


# uploads apart from the examples: fewer, and forgotten after an hour, so that a long class
# does not keep every file anyone uploaded
@st.cache_resource(show_spinner=False, max_entries=4, ttl=3600)
def _read_upload_cached(kind: str, path: str, stamp: str) -> Any:
    return _READERS[kind](path)


def read(kind: str, path: str | os.PathLike) -> Any:
    """Read a trace, profile or measurements file (cached by path and modification stamp)."""
    cached = _read_upload_cached if UPLOAD_DIR in Path(path).parents else _read_cached
    return cached(kind, str(path), _stamp(path))


def check_upload_size(name: str, nbytes: int, path: str | os.PathLike | None = None,
                      kind: str = "trace") -> None:
    """Refuse an upload over :data:`MAX_UPLOAD_MB`, or a Parquet file whose columns would take
    over :data:`MAX_DECODED_MIB` once read, with a one-line CopeInputError naming it."""
    if nbytes > MAX_UPLOAD_MB * 1e6:
        raise CopeInputError(f"{nbytes / 1e6:.1f} MB; the explorer takes files up to "
                             f"{MAX_UPLOAD_MB} MB (use the CLI for bigger ones)",
                             source=f"upload {name}")
    if path is not None and kind != "model":
        decoded = parquet_io.decoded_bytes(path)
        if decoded > MAX_DECODED_MIB * 2**20:
            raise CopeInputError(f"its columns take {decoded / 2**20:.0f} MiB once read; the "
                                 f"explorer reads files up to {MAX_DECODED_MIB} MiB (use the "
                                 "CLI for bigger ones)", source=f"upload {name}")


@st.cache_data(show_spinner=False, max_entries=8)
def _scan_cached(folder: str, listing: tuple) -> list[Example]:
    return scan_examples(folder)


def _example_dirs() -> list[Path]:
    """The examples' folder and, beside it, the controlled grid of emulated platforms (one
    example whose profiles are the grid's settings; shown with the shipped examples only)."""
    grid = EXAMPLES_DIR.parent / "platforms" / "cpu-emulated-grid"
    return [EXAMPLES_DIR] + ([grid] if not os.environ.get("COPE_EXAMPLES_DIR") else [])


def examples() -> list[Example]:
    """Shipped examples under :data:`EXAMPLES_DIR` and the grid's folder (rescanned when a
    file there changes, looked at no more than every 10 seconds)."""
    return _examples_listed(tuple(str(d) for d in _example_dirs()))


@st.cache_data(show_spinner=False, max_entries=4, ttl=10)
def _examples_listed(folders: tuple[str, ...]) -> list[Example]:
    out: list[Example] = []
    for folder in map(Path, folders):
        files = (sorted([*folder.glob("*.parquet"), *folder.glob("*.json")])
                 if folder.is_dir() else [])
        out += _scan_cached(str(folder), tuple((p.name, _stamp(p)) for p in files))
    return sorted(out, key=lambda e: e.name)


# --- the dataset ----------------------------------------------------------------------------------
#: The example shown first, when it is shipped (the README's main example).
PREFERRED_EXAMPLE = "qwen3-30b-a3b"


def _default_example(names: list[str]) -> str:
    return PREFERRED_EXAMPLE if PREFERRED_EXAMPLE in names else names[0]


def _chosen_example() -> Example | None:
    exs = examples()
    names = [e.name for e in exs]
    if not names:
        return None
    name = _chosen_name()
    return exs[names.index(name)] if name in names else None


def _chosen_name() -> str | None:
    """The example chosen, or a catalog model without one (its trace is made here)."""
    names = [e.name for e in examples()]
    if not names:
        return None
    every = names + catalog_models(names)
    return resolve("example", _default_example(names), lambda v: v in every)


def sidebar() -> None:
    """The example chooser (and profile chooser when an example has several), in the sidebar."""
    exs = examples()
    names = [e.name for e in exs]
    if not names:
        st.sidebar.warning(f"No shipped examples found in {EXAMPLES_DIR}; upload a trace and a "
                           "profile on the Overview page.")
        return
    made = catalog_models(names)
    name = bound("example", st.sidebar.selectbox, default=_default_example(names),
                 valid=lambda v: v in names + made, label="Model (example data)",
                 options=names + made,
                 format_func=lambda v: v if v in names else f"{v} (catalog: trace made here)",
                 help="Shipped examples under data/examples: SYNTHETIC traces with ANALYTIC "
                      "profiles, one with a MEASURED profile and measurements, and the "
                      "controlled grid of emulated platforms (one profile per setting); then "
                      "the other models of `cope models`, whose SYNTHETIC trace is made here as "
                      "the shipped ones were; uploads on the Overview page replace single files.")
    _drop_stale_uploads(name)
    your_machine.sidebar_weights(name)
    your_machine.sidebar()
    if name not in names:
        return
    ex = exs[names.index(name)]
    if len(ex.profiles) > 1:
        files = [Path(p).name for p in ex.profiles]
        bound("profile", st.sidebar.selectbox, default=files[0], valid=lambda v: v in files,
              label="Profile", options=files)


def _drop_stale_uploads(example: str) -> None:
    """An upload belongs to the example it was made for: switching examples drops it (and
    says so once), so that no page of the new example is left with only an error."""
    uploads = st.session_state.get(_UPLOADS) or {}
    made_for = st.session_state.get(_UPLOADS_FOR)
    if uploads and made_for is not None and made_for != example:
        files = ", ".join(name for name, _ in uploads.values())
        forget_uploads()
        st.session_state[_DROPPED] = (
            f"Your uploads ({files}) were made for the example {made_for}; switching to "
            f"{example} set them aside. Upload them again on the Overview page to use them "
            "here.")


def _paths() -> tuple[dict[str, str | None], dict[str, str]]:
    ex = _chosen_example()
    paths: dict[str, str | None] = dict.fromkeys(("trace", "calibration", "profile",
                                                  "measurements", "model"))
    if ex is not None:
        files = [Path(p).name for p in ex.profiles]
        prof = resolve("profile", files[0], lambda v: v in files)
        profile = ex.profiles[files.index(prof)]
        paths.update(trace=ex.traces[0],
                     calibration=ex.calibrations[0] if ex.calibrations else None,
                     profile=profile, measurements=matching_measurements(ex.measurements,
                                                                         profile))
    origin = {s: f"example {Path(p).name}" for s, p in paths.items() if p}
    for slot, (name, path) in st.session_state.get(_UPLOADS, {}).items():
        paths[slot], origin[slot] = path, f"upload {name}"
    return paths, origin


def dataset() -> Dataset:
    """The inputs in use: the chosen example with any uploaded files in place of its own.

    Raises CopeInputError when there is no trace or profile at all."""
    paths, origin = _paths()
    made = _chosen_name() if _chosen_example() is None else None
    if made is not None:        # a catalog model without an example: its trace is made here
        origin = {"trace": "SYNTHETIC, made here as the shipped examples'",
                  "profile": f"ANALYTIC, made here ({your_machine.DEFAULT_GPU})"}
        weights = your_machine.quant(made)      # in the key: results are cached under it
        return _assembled(f"catalog={made}@{weights}",
                          *your_machine.synthetic(made, weights), None, origin)
    missing = [s for s in ("trace", "profile") if not paths[s]]
    if missing:
        raise CopeInputError(f"no {' and no '.join(missing)} loaded; expected a shipped example "
                             f"in {EXAMPLES_DIR} or an upload on the Overview page")
    objs = {slot: read(SLOT_KIND[slot], p) if p else None for slot, p in paths.items()}
    key = "|".join(f"{s}={p}@{_stamp(p)}" for s, p in sorted(paths.items()) if p)
    trace, profile, cal = objs["trace"], objs["profile"], objs["calibration"]
    assert trace is not None and profile is not None     # both paths exist (checked above)
    note = None
    if objs["model"] is not None:    # the same routing priced as the uploaded model file
        try:
            trace, cal, profile = for_model(key, trace, cal, profile, objs["model"])
        except CopeInputError as exc:   # another routing shape: the model file is not used
            note = (f"{origin['model']} not used: {exc.detail}; upload the model file of the "
                    "trace's model")
            origin["model"] += " (not used)"
    ds = _assembled(key, trace, cal, profile, objs["measurements"], origin)
    return dataclasses.replace(ds, notes=ds.notes + (note,)) if note else ds


def _assembled(key: str, trace: Trace, cal: Trace | None, profile: Profile,
               measurements: Any, origin: dict[str, str]) -> Dataset:
    """The inputs in the sidebar's weights and on its machine, assembled; measurements made
    on another machine are set aside while a machine is chosen."""
    got = your_machine.apply(key, trace, cal, profile, origin)
    if got.machine and measurements is not None:
        measurements = None
        origin["measurements"] = "set aside: made on the example's machine, not yours"
    return assemble(got.key, got.trace, got.calibration, got.profile, measurements, origin)


@st.cache_data(show_spinner=False, max_entries=8)
def for_model(key: str, _trace: Trace, _cal: Trace | None, _profile: Profile,
              _g: ModelGeometry) -> tuple[Trace, Trace | None, Profile]:
    """The trace and calibration re-labelled with an uploaded model's geometry and the
    analytic profile re-priced for it (a measured profile is refused with its reason); cached
    by ``key``, the inputs' paths and stamps (underscored arguments are not hashed)."""
    return (_trace.with_model(_g), _cal.with_model(_g) if _cal is not None else None,
            analytic_for_model(_profile, _g))


def banner(ds: Dataset) -> None:
    """Where the data comes from (SYNTHETIC / ANALYTIC labels) and anything that is off."""
    st.caption(provenance(ds) + " — " + "; ".join(f"{s}: {o}" for s, o in ds.origin.items()))
    dropped = st.session_state.pop(_DROPPED, None)
    if dropped:
        st.info(dropped)
    mine = your_machine.machine_note(ds.profile)
    if mine:
        st.info(mine)
    for note in ds.notes:
        st.warning(note)


def require_predictable(ds: Dataset) -> None:
    """Stop the page with the reason when the trace and profile cannot be combined."""
    for problem in ds.problems:
        st.error(problem)
    if ds.problems:
        st.stop()


def examples_with_measurements() -> list[str]:
    """Names of the shipped examples that have measurements (the page offers to switch)."""
    return [e.name for e in examples() if e.measurements]


def switch_example(name: str) -> None:
    """Show example ``name`` from the next run on (the sidebar's choice, kept in the URL)."""
    rebind("example", name)


@st.cache_data(show_spinner=False, max_entries=8)
def _verify_cached(path: str, stamp: str) -> VerifyRecord:
    return read_verify(path)


def verify_record(ds: Dataset) -> tuple[VerifyRecord | None, str]:
    """The verify record in use and where it came from: an uploaded one, else the chosen
    example's first (of the dataset's model); ``(None, "")`` when there is none."""
    up = st.session_state.get(_VERIFY_UPLOAD)
    if up is not None:
        return up
    ex = _chosen_example()
    for path in (ex.verifies if ex is not None else ()):
        rec = _verify_cached(path, _stamp(path))
        if rec.model.same_shape(ds.trace.model):
            return rec, f"example {Path(path).name}"
    return None, ""


def verify_upload() -> None:
    """A file uploader for a ``cope.verify/1`` record; a bad one shows its one-line error."""
    f = st.file_uploader("Verify record (cope.verify/1 JSON)", type=["json"], key="_up_verify",
                         help="written by `cope verify -o FILE`", max_upload_size=MAX_UPLOAD_MB)
    if f is None:
        st.session_state.pop(_VERIFY_UPLOAD, None)
        return
    try:
        check_upload_size(f.name, f.size)
        st.session_state[_VERIFY_UPLOAD] = (parse_verify(f.getvalue(), f"upload {f.name}"),
                                            f"upload {f.name}")
    except CopeInputError as exc:
        st.error(str(exc))


# --- uploads --------------------------------------------------------------------------------------
def _store_upload(name: str, data: bytes, sha: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name)[:100] or "upload.parquet"
    folder = UPLOAD_DIR / sha[:24]
    path = folder / safe
    if not path.exists():  # the folder is named by the content's hash: same name, same bytes
        write_atomic(path, data)
    return path


def read_upload(name: str, data: bytes, kind: str) -> tuple[Any, str]:
    """Store uploaded bytes in a temp file and read them with the library's reader.

    Returns the object and the temp path; a bad file raises CopeInputError naming the upload."""
    check_upload_size(name, len(data))
    sha = hashlib.sha256(data).hexdigest()
    try:
        path = _store_upload(name, data, sha)
    except CopeInputError as exc:   # says the server's temp path: name the upload instead
        raise CopeInputError(exc.detail.replace("cannot write", "cannot store it"),
                             source=f"upload {name}") from None
    try:
        check_upload_size(name, len(data), path, kind)
        return read(kind, path), str(path)
    except CopeInputError as exc:
        raise CopeInputError(exc.detail, source=f"upload {name}", field=exc.field) from None


def upload_slot(slot: str, label: str, help: str | None = None) -> None:
    """A file uploader for one input. A good file replaces the slot's file; a bad one shows
    the reader's one-line error while the previous data stays in use."""
    # the generation in the key gives fresh, empty uploaders after forget_uploads()
    gen = st.session_state.get("_cope_upload_gen", 0)
    f = st.file_uploader(label, type=SLOT_TYPES.get(slot, ["parquet"]), key=f"_up_{slot}_{gen}",
                         help=help, max_upload_size=MAX_UPLOAD_MB)
    seen = st.session_state.setdefault(_SEEN, {})
    errors = st.session_state.setdefault(_ERRORS, {})
    uploads = st.session_state.setdefault(_UPLOADS, {})
    if f is None:
        errors.pop(slot, None)
        seen.pop(slot, None)
    else:
        data = f.getvalue()
        sha = hashlib.sha256(data).hexdigest()
        if seen.get(slot) != sha:
            seen[slot] = sha
            try:
                _, path = read_upload(f.name, data, SLOT_KIND[slot])  # validated before use
                uploads[slot] = (f.name, path)
                errors.pop(slot, None)
                st.session_state[_UPLOADS_FOR] = resolve("example", None)
            except CopeInputError as exc:
                errors[slot] = str(exc)
    if slot in errors:
        st.error(errors[slot])
    cur = uploads.get(slot)
    st.caption(f"in use: upload {cur[0]}" if cur else "in use: the example's file, if any")


def forget_uploads() -> None:
    """Use the example's files again and empty the uploaders."""
    for key in (_UPLOADS, _SEEN, _ERRORS, _UPLOADS_FOR):
        st.session_state.pop(key, None)
    st.session_state["_cope_upload_gen"] = st.session_state.get("_cope_upload_gen", 0) + 1
