"""The records of the parts catalog, and how one row of data becomes one of them.

A row is text (a CSV line of ``cope_core/parts/data``, or a user's JSON/TOML part file); each
kind's :data:`COLUMNS` say which fields it has, which are required and what each must hold, and
:func:`parse_row` checks them all, so a bad value is one line naming the file, the row, the field
and what was expected. Units in the data are the vendors' (GB/s, TFLOP/s, GHz, GiB); the records
hold SI units (bytes/s, FLOP/s, Hz, bytes), as :class:`cope_core.platforms.PlatformSpec` does.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import CopeInputError

GB = 1e9
GIB = 1024**3
#: Part kinds, in the order the catalog lists them.
KINDS = ("gpu", "cpu", "memory", "link")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.+_-]*$")


class Fact(NamedTuple):
    """One number (or name) of a composed machine and where it came from: ``how`` is
    ``catalog``, ``file`` (a user's part file), ``detected``, ``measured``, ``assumed`` or
    ``derived``; ``source`` says which catalog row, file, command or rule."""

    part: str
    quantity: str
    value: str
    how: str
    source: str


@dataclass(frozen=True, kw_only=True)
class _Sourced:
    """Where a part's figures come from, shared by every kind: ``source`` (the datasheet, page
    or probe), a ``note``, and ``origin``: "catalog", a part file's path, or "detected".
    Keyword-only, so that each kind's own fields keep their places in its constructor."""

    source: str
    note: str = ""
    origin: str = "catalog"


@dataclass(frozen=True)
class GpuPart(_Sourced):
    """A GPU: memory, memory bandwidth, dense FP16 FLOP/s (``flops_kind`` says which: tensor
    cores with full-rate FP32 accumulate, GeForce tensor cores with FP32 accumulate at half rate,
    AMD matrix (WMMA) or vector FP16 where a GPU has no matrix units) and its PCIe interface."""

    name: str
    label: str
    vendor: str
    memory_bytes: float
    bandwidth: float
    flops: float
    flops_kind: str
    flops_basis: str
    pcie_gen: int
    pcie_lanes: int
    link: str               # the link it is priced on by default


@dataclass(frozen=True)
class CpuPart(_Sourced):
    """A CPU: the cores threads run on (a hybrid Intel part's P-cores; ``e_cores`` beside them,
    with one E-core's FLOP/s and streaming bandwidth where the catalog states them), clocks, the
    FMA units that give FLOP/s, the memory it is priced with by default and the bandwidth one
    core streams alone (``measured``: a probe's figure, not an assumption);
    ``kernel``: on ``this`` machine, the probed rates of a dot-product kernel (bytes/s of 8-bit
    weights from memory by one thread and by all, and by one thread from its cache:
    :func:`cope_core.mechanisms.probe.probe_host_kernel`), None where not probed."""

    name: str
    label: str
    vendor: str
    cores: int
    e_cores: int
    base_hz: float
    boost_hz: float
    simd: str
    fma_units: int
    fma_bits: int
    memory: str
    per_core_bandwidth: float
    measured: bool = False
    kernel: tuple[float, float, float] | None = None
    e_flops_per_thread: float | None = None
    e_core_bandwidth: float | None = None

    @property
    def flop_per_cycle(self) -> int:
        """FP32 FLOP per cycle of one core: FMA units x lanes x 2 (multiply and add)."""
        return self.fma_units * (self.fma_bits // 32) * 2

    @property
    def flops_per_thread(self) -> float:
        """FLOP/s of one core at its base clock (the sustained all-core clock under vector load
        is nearer base than boost; the shipped catalog priced every CPU so)."""
        return self.base_hz * self.flop_per_cycle


@dataclass(frozen=True)
class MemoryPart(_Sourced):
    """Host memory: type x speed x channels; ``bandwidth`` is the peak (MT/s x 8 bytes x
    channels) or, when ``measured``, what a probe reached."""

    name: str
    kind: str
    mts: int
    channels: int
    bandwidth: float
    measured: bool = False


@dataclass(frozen=True)
class LinkPart(_Sourced):
    """A host-to-GPU link: PCIe generation x lanes; ``bandwidth`` per direction."""

    name: str
    gen: int
    lanes: int
    bandwidth: float


Part = GpuPart | CpuPart | MemoryPart | LinkPart


# --- field types -------------------------------------------------------------------------------
def _name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError("a lower-case name of letters, digits and . + _ -")
    return v


def _text(v: str) -> str:
    if not v.strip():
        raise ValueError("some text")
    return " ".join(v.split())


def _positive(v: str) -> float:
    x = float(v)
    if not math.isfinite(x) or x <= 0:
        raise ValueError("a positive number")
    return x


def _count(v: str) -> int:
    x = float(v)
    if x != int(x) or x < 0:
        raise ValueError("a whole number >= 0")
    return int(x)


def _size(v: str) -> float:
    """``24 GiB`` (binary, as GPU memory is built) or ``141 GB`` (decimal) -> bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(GiB|GB)\s*", v)
    if not m or _positive(m.group(1)) <= 0:
        raise ValueError("a size such as '24 GiB' or '141 GB'")
    return float(m.group(1)) * (GIB if m.group(2) == "GiB" else GB)


def _choice(*options: str) -> Callable[[str], str]:
    def check(v: str) -> str:
        if v not in options:
            raise ValueError(f"one of {list(options)}")
        return v
    return check


class Column(NamedTuple):
    name: str
    parse: Callable[[str], Any]
    required: bool = True


COLUMNS: dict[str, tuple[Column, ...]] = {
    "gpu": (Column("name", _name), Column("label", _text), Column("vendor", _text),
            Column("memory", _size), Column("bandwidth_gbs", _positive),
            Column("fp16_tflops", _positive),
            Column("flops_kind", _choice("tensor", "tensor-fp32acc", "matrix", "vector")),
            Column("flops_basis", _choice("published", "derived")),
            Column("pcie_gen", _choice("1", "2", "3", "4", "5")),
            Column("pcie_lanes", _choice("1", "2", "4", "8", "16")),
            Column("link", _name, False), Column("source", _text), Column("note", _text, False)),
    "cpu": (Column("name", _name), Column("label", _text), Column("vendor", _text),
            Column("cores", _count), Column("e_cores", _count, False),
            Column("base_ghz", _positive), Column("boost_ghz", _positive),
            Column("simd", _choice("avx2", "avx512", "neon", "sve")),
            Column("fma_units", _count), Column("fma_bits", _choice("128", "256", "512")),
            Column("memory", _name), Column("per_core_gbs", _positive),
            Column("e_base_ghz", _positive, False), Column("e_flop_per_cycle", _count, False),
            Column("e_core_gbs", _positive, False),
            Column("source", _text), Column("note", _text, False)),
    "memory": (Column("name", _name), Column("bytes_per_transfer", _count),
               Column("min_mts", _count), Column("max_mts", _count), Column("source", _text),
               Column("note", _text, False)),
    "link": (Column("name", _name), Column("gen", _count), Column("gt_s", _positive),
             Column("encoding", _choice("8b/10b", "128b/130b")), Column("lanes", _count),
             Column("gbs", _positive, False), Column("source", _text),
             Column("note", _text, False)),
}


def parse_row(kind: str, raw: Mapping[str, Any], *, where: str, row: str) -> dict[str, Any]:
    """The typed fields of one row of ``kind``; ``where`` (a file) and ``row`` (e.g.
    ``row 3 (rtx3090)``) name it in the one-line error a bad value raises."""
    columns = COLUMNS[kind]
    known = {c.name for c in columns}
    unknown = sorted(set(raw) - known - {"kind"})
    if unknown:
        raise CopeInputError(f"{row}: unknown fields {unknown}; expected {sorted(known)}",
                             source=where, field=unknown[0])
    out: dict[str, Any] = {}
    for c in columns:
        v = raw.get(c.name)
        text = "" if v is None else str(v).strip()
        if not text:
            if c.required:
                raise CopeInputError(f"{row}: missing; expected {_expected(c)}", source=where,
                                     field=c.name)
            out[c.name] = None
            continue
        try:
            out[c.name] = c.parse(text)
        except ValueError as exc:
            expected = str(exc) if not str(exc).startswith("could not") else "a number"
            raise CopeInputError(f"{row}: expected {expected}, got {text!r}", source=where,
                                 field=c.name) from None
    if kind == "cpu" and out["base_ghz"] > out["boost_ghz"]:
        raise CopeInputError(f"{row}: expected base_ghz <= boost_ghz, got {out['base_ghz']} > "
                             f"{out['boost_ghz']}", source=where, field="base_ghz")
    e_data = [out[k] for k in ("e_base_ghz", "e_flop_per_cycle", "e_core_gbs")] \
        if kind == "cpu" else []
    if any(v is not None for v in e_data) and (None in e_data or not out["e_cores"]):
        raise CopeInputError(f"{row}: expected e_cores with all of e_base_ghz, e_flop_per_cycle "
                             "and e_core_gbs, or none of them", source=where, field="e_cores")
    if kind == "cpu" and out["cores"] < 1:
        raise CopeInputError(f"{row}: expected at least one core, got 0", source=where,
                             field="cores")
    return out


def _expected(c: Column) -> str:
    try:
        c.parse("")
    except ValueError as exc:
        return str(exc)
    return "a value"  # pragma: no cover - every parser rejects ""


def hz(ghz: float) -> float:
    """GHz as written -> Hz, exactly for clocks given to the MHz (2.1 -> 2.1e9, not
    2.1000000000000001e9)."""
    return round(ghz * 1000) * 1e6


def gpu_from_row(r: Mapping[str, Any], origin: str = "catalog") -> GpuPart:
    gen, lanes = int(r["pcie_gen"]), int(r["pcie_lanes"])
    return GpuPart(name=r["name"], label=r["label"], vendor=r["vendor"],
                   memory_bytes=r["memory"], bandwidth=r["bandwidth_gbs"] * GB,
                   flops=r["fp16_tflops"] * 1e12, flops_kind=r["flops_kind"],
                   flops_basis=r["flops_basis"], pcie_gen=gen, pcie_lanes=lanes,
                   link=r["link"] or f"pcie{gen}x{lanes}", source=r["source"],
                   note=r["note"] or "", origin=origin)


def cpu_from_row(r: Mapping[str, Any], origin: str = "catalog") -> CpuPart:
    return CpuPart(name=r["name"], label=r["label"], vendor=r["vendor"], cores=r["cores"],
                   e_cores=r["e_cores"] or 0, base_hz=hz(r["base_ghz"]),
                   boost_hz=hz(r["boost_ghz"]), simd=r["simd"], fma_units=r["fma_units"],
                   fma_bits=int(r["fma_bits"]), memory=r["memory"],
                   per_core_bandwidth=r["per_core_gbs"] * GB, source=r["source"],
                   note=r["note"] or "", origin=origin,
                   e_flops_per_thread=(hz(r["e_base_ghz"]) * r["e_flop_per_cycle"]
                                       if r.get("e_base_ghz") else None),
                   e_core_bandwidth=r["e_core_gbs"] * GB if r.get("e_core_gbs") else None)
