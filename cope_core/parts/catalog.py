"""The parts catalog: data files read once, names looked up, parts composed from names.

GPUs and CPUs are rows of ``data/gpus.csv`` and ``data/cpus.csv``; memory is a name made of type,
speed and channels (``ddr4-3200x2``: 3200 MT/s x 8 bytes x 2 channels = 51.2 GB/s peak) over the
types of ``data/memory.csv``; a link is PCIe generation x lanes (``pcie4x8``, ``4x16``: the
generation's rate x lanes x encoding / 8 bits, per direction) over the generations of
``data/links.csv``, whose bare names (``pcie4``, ``pcie5``) are x16 with the figures the shipped
catalog always used. Every row names its source. A part the catalog lacks is a small JSON or
TOML file with the same fields (:func:`read_part_file`). An unknown name is one line with the
nearest catalog names.
"""
from __future__ import annotations

import csv
import difflib
import functools
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..errors import CopeInputError
from .records import (
    GB,
    KINDS,
    CpuPart,
    GpuPart,
    LinkPart,
    MemoryPart,
    Part,
    cpu_from_row,
    gpu_from_row,
    parse_row,
)

DATA = Path(__file__).with_name("data")
FILES = {"gpu": "gpus.csv", "cpu": "cpus.csv", "memory": "memory.csv", "link": "links.csv"}
#: Words a user may put before a part's name that the catalog's names leave out.
_VENDOR_WORDS = re.compile(r"\b(nvidia|geforce|amd|radeon|intel|processor|\(r\)|\(tm\))")
_MEMORY_NAME = re.compile(r"^([a-z]+\d)-(\d+)x(\d+)$")
_LINK_NAME = re.compile(r"^(?:pcie|gen)?(\d)(?:\.0)?x(\d+)$")
_LANES = (1, 2, 4, 8, 16)
P = TypeVar("P", GpuPart, CpuPart)


def key(text: str) -> str:
    """The form names are compared in: lower case, vendor words and punctuation dropped
    (``GeForce RTX 3090`` and ``rtx-3090`` are both ``rtx3090``; ``8480+`` is ``8480plus``)."""
    t = _VENDOR_WORDS.sub(" ", text.lower().replace("+", "plus"))
    return re.sub(r"[^a-z0-9]", "", t)


def read_rows(kind: str, path: Path) -> list[dict[str, Any]]:
    """The validated rows of one data file (one line naming file, row and field if bad)."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = []
            for i, raw in enumerate(reader, start=2):     # line 1 is the header
                if None in raw:
                    raise CopeInputError(f"line {i}: more fields than the header's",
                                         source=str(path), field="row")
                label = f"line {i}" + (f" ({raw.get('name')})" if raw.get("name") else "")
                rows.append(parse_row(kind, raw, where=str(path), row=label))
    except FileNotFoundError:
        raise CopeInputError("file not found", source=str(path)) from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CopeInputError(f"not a readable CSV file ({exc})", source=str(path)) from None
    names = [r["name"] for r in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CopeInputError(f"duplicate names {dup}; expected each name once", source=str(path),
                             field="name")
    return rows


@functools.cache
def _rows(kind: str) -> tuple[dict[str, Any], ...]:
    return tuple(read_rows(kind, DATA / FILES[kind]))


@functools.cache
def gpus() -> dict[str, GpuPart]:
    """Every catalog GPU by name."""
    return {r["name"]: gpu_from_row(r) for r in _rows("gpu")}


@functools.cache
def cpus() -> dict[str, CpuPart]:
    """Every catalog CPU by name."""
    return {r["name"]: cpu_from_row(r) for r in _rows("cpu")}


def memory_types() -> dict[str, dict[str, Any]]:
    """The memory types (``ddr4``, ``ddr5``, ...) a memory name may use."""
    return {r["name"]: r for r in _rows("memory")}


def link_generations() -> dict[str, dict[str, Any]]:
    """The PCIe generations by name (``pcie3``, ...), each an x16 link of its own."""
    return {r["name"]: r for r in _rows("link")}


# --- names -------------------------------------------------------------------------------------
def memory_part(name: str) -> MemoryPart:
    """``TYPE-MTSxCHANNELS``, e.g. ``ddr5-6000x2``: peak = MT/s x bytes per transfer x channels."""
    text = name.strip().lower()
    m = _MEMORY_NAME.match(text)
    types = memory_types()
    if not m or m.group(1) not in types:
        raise CopeInputError(f"unknown memory {name!r}; expected TYPE-MTSxCHANNELS with TYPE in "
                             f"{sorted(types)}, e.g. ddr4-3200x2, ddr5-6000x2, ddr5-4800x8",
                             field="memory")
    t, mts, channels = types[m.group(1)], int(m.group(2)), int(m.group(3))
    if not t["min_mts"] <= mts <= t["max_mts"]:
        raise CopeInputError(f"{name!r}: expected {m.group(1)} at {t['min_mts']}-{t['max_mts']} "
                             f"MT/s, got {mts}", field="memory")
    if not 1 <= channels <= 24:
        raise CopeInputError(f"{name!r}: expected 1-24 channels, got {channels}",
                             field="memory")
    bw = mts * 1e6 * t["bytes_per_transfer"] * channels
    return MemoryPart(name=text, kind=m.group(1), mts=mts, channels=channels, bandwidth=bw,
                      source=t["source"], note=f"{mts} MT/s x {t['bytes_per_transfer']} bytes x "
                                               f"{channels} channels = {bw / GB:g} GB/s peak")


def link_part(name: str) -> LinkPart:
    """``pcieGENxLANES`` or ``GENxLANES`` (``pcie4x8``, ``4x16``), or a generation's bare name
    (``pcie4``: x16). Per direction: rate x lanes x encoding / 8."""
    text = name.strip().lower()
    gens = link_generations()
    if text in gens:
        r = gens[text]
        return _link(r, int(r["lanes"]), text, r["gbs"])
    m = _LINK_NAME.match(text)
    by_gen = {int(r["gen"]): r for r in gens.values()}
    if not m or int(m.group(1)) not in by_gen or int(m.group(2)) not in _LANES:
        raise CopeInputError(f"unknown link {name!r}; expected pcieGENxLANES or GENxLANES with "
                             f"GEN in {sorted(by_gen)} and LANES in {list(_LANES)}, e.g. "
                             "pcie4x16, 4x8, or one of " + ", ".join(sorted(gens)), field="link")
    gen, lanes = int(m.group(1)), int(m.group(2))
    return _link(by_gen[gen], lanes, f"pcie{gen}x{lanes}", None)


def _link(r: Mapping[str, Any], lanes: int, name: str, gbs: float | None) -> LinkPart:
    num, den = (int(x.rstrip("b")) for x in r["encoding"].split("/"))
    computed = r["gt_s"] * 1e9 * lanes * num / den / 8
    bw = gbs * GB if gbs else computed
    how = (r["note"] if gbs else f"{r['gt_s']:g} GT/s x {lanes} lanes x {num}/{den} / 8 = "
           f"{computed / GB:.2f} GB/s per direction")
    return LinkPart(name=name, gen=int(r["gen"]), lanes=lanes, bandwidth=bw, source=r["source"],
                    note=how)


def link_between(slot: LinkPart, gpu: GpuPart) -> LinkPart:
    """The link a card in ``slot`` runs at: the lower generation and the fewer lanes of the two
    (a PCIe 4.0 x8 card in a 3.0 x16 slot runs at 3.0 x8)."""
    gen, lanes = min(slot.gen, gpu.pcie_gen), min(slot.lanes, gpu.pcie_lanes)
    if (gen, lanes) == (slot.gen, slot.lanes):
        return slot
    return link_part(f"pcie{gen}x{lanes}")


# --- lookup ------------------------------------------------------------------------------------
def names(kind: str) -> list[str]:
    """The catalog names of ``kind`` (memory and links: the types and generations)."""
    if kind == "gpu":
        return list(gpus())
    if kind == "cpu":
        return list(cpus())
    return list(memory_types() if kind == "memory" else link_generations())


def suggest(kind: str, name: str, n: int = 3) -> list[str]:
    """The catalog names nearest to ``name`` (difflib's ratio on :func:`key` forms)."""
    by_key = {key(x): x for x in names(kind)}
    want = key(name)
    # a catalog name the asked one starts with ("rtx4090" for "rtx 4090 super") comes first
    near = sorted((k for k in by_key if k and want.startswith(k)), key=len, reverse=True)
    for cutoff in (0.5, 0.0):
        near += [k for k in difflib.get_close_matches(want, list(by_key), n=n, cutoff=cutoff)
                 if k not in near]
        if near:
            break
    return [by_key[k] for k in near[:n]]


def unknown(kind: str, name: str) -> CopeInputError:
    near = ", ".join(suggest(kind, name))
    return CopeInputError(f"unknown {kind} {name!r}; nearest: {near} (`cope parts {kind}s` "
                          f"lists all {len(names(kind))}, or give a part file)", field=kind)


def is_part_file(text: str) -> bool:
    return text.lower().endswith((".json", ".toml")) or Path(text).is_file()


def gpu_part(name: str | GpuPart) -> GpuPart:
    """A catalog GPU (by name, spacing and vendor words aside) or a GPU part file."""
    return name if isinstance(name, GpuPart) else _part("gpu", name, gpus())


def cpu_part(name: str | CpuPart) -> CpuPart:
    """A catalog CPU (by name, spacing and vendor words aside) or a CPU part file."""
    return name if isinstance(name, CpuPart) else _part("cpu", name, cpus())


def _part(kind: str, name: str, table: Mapping[str, P]) -> P:
    if is_part_file(name):
        return _file_part(kind, name)  # type: ignore[return-value]
    found = {key(n): p for n, p in table.items()}.get(key(name))
    if found is None:
        raise unknown(kind, name)
    return found


def search(kind: str, text: str = "") -> list[Part]:
    """Catalog parts of ``kind`` whose name or label contains ``text`` (in :func:`key` form);
    for memory and links, the parts their types and generations name."""
    want = key(text)
    if kind == "gpu":
        return [g for g in gpus().values() if want in key(g.name) or want in key(g.label)]
    if kind == "cpu":
        return [c for c in cpus().values() if want in key(c.name) or want in key(c.label)]
    if kind == "link":
        return [link_part(n) for n in names("link") if want in key(n)]
    if kind == "memory":
        out: list[Part] = [memory_part(c.memory) for c in cpus().values()
                           if want in key(c.memory)]
        return list({m.name: m for m in out}.values())
    raise CopeInputError(f"unknown part kind {kind!r}; expected one of {list(KINDS)}",
                         field="kind")


# --- user part files ---------------------------------------------------------------------------
def read_part_file(path: str | Path) -> Part:
    """A part the catalog lacks: a JSON or TOML object with ``kind`` (``gpu`` or ``cpu``) and the
    fields of that kind's catalog rows (``docs/parts.md``), numbers from its data sheet."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except FileNotFoundError:
        raise CopeInputError("file not found", source=str(p)) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        fmt = "TOML" if p.suffix.lower() == ".toml" else "JSON"
        raise CopeInputError(f"not a readable {fmt} part file ({exc})", source=str(p)) from None
    if not isinstance(data, dict):
        raise CopeInputError("expected an object of part fields", source=str(p), field="kind")
    kind = data.get("kind")
    if kind not in ("gpu", "cpu"):
        raise CopeInputError(f"expected 'gpu' or 'cpu', got {kind!r}", source=str(p),
                             field="kind")
    data = {"name": p.stem.lower(), "source": f"user part file {p}", **data}
    row = parse_row(kind, data, where=str(p), row=f"{kind} part")
    part = gpu_from_row(row, str(p)) if kind == "gpu" else cpu_from_row(row, str(p))
    if isinstance(part, CpuPart):
        memory_part(part.memory)        # its memory must be a valid name too
    return part


def _file_part(kind: str, path: str) -> Part:
    part = read_part_file(path)
    got = "gpu" if isinstance(part, GpuPart) else "cpu"
    if got != kind:
        raise CopeInputError(f"expected a {kind} part file, got kind {got!r}", source=path,
                             field="kind")
    return part
