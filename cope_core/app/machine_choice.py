"""The sidebar's "Your machine" as pure logic: which parts and models can be chosen, the machine
they compose (:func:`cope_core.machine.compose_machine`), the ANALYTIC profile every page then
uses, and how a speed is shown (ms/token and tokens/s).

A choice is a :class:`MachineChoice` of catalog names (:data:`DEFAULT` for a part left at its
default: the CPU's usual memory, the card's own link). No GPU chosen means the example's own
profile, as before "Your machine" existed; :data:`NO_GPU` a machine without one (every page
answers for the CPU alone: :mod:`.no_gpu`).
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from .. import parts
from ..errors import CopeInputError
from ..geometry import CATALOG, DEFAULT_CONTEXT, GIB, ModelGeometry
from ..llamacpp import LATEST_BUILD, latest, milestones
from ..machine import Machine, compose_machine
from ..models import COMMON, resolve_model
from ..models.formats import NATIVE_MXFP4
from ..platforms import DEFAULT_CPU
from ..profile.analytic import analytic_profile, default_threads
from ..profile.data import Profile

#: The GPU setting that keeps the example's own profile.
EXAMPLE = "example"
#: The GPU setting of a machine without a GPU (``cope advise --gpu none``).
NO_GPU = "none"
#: The GPU or CPU setting of a part read from the user's part file (docs/parts.md).
FILE = "file"
#: The weights setting that keeps the example's (or the catalog entry's) format.
AS_IS = "catalog"
#: The memory or link setting of a part left at its default.
DEFAULT = "default"
#: Memory offered besides the catalog CPUs' usual ones (any TYPE-MTSxCHANNELS is valid).
_MORE_MEMORY = ("ddr4-2666x2", "ddr4-3600x2", "ddr5-6000x2", "ddr5-7200x2", "ddr5-8000x2")
#: Slots offered: PCIe generation x lanes.
LINKS = tuple(f"pcie{g}x{n}" for g in (5, 4, 3) for n in (16, 8, 4))


def gpu_options(own: parts.GpuPart | None = None) -> list[str]:
    """``example`` (the example's own profile), no GPU, your part file's GPU when there is
    one, then every catalog GPU."""
    return [EXAMPLE, NO_GPU, *([FILE] if own is not None else []), *parts.gpus()]


def gpu_label(name: str, own: parts.GpuPart | None = None) -> str:
    if name == EXAMPLE:
        return "the example's own profile"
    if name == NO_GPU:
        return "no GPU (CPU only)"
    g = own if name == FILE and own is not None else parts.gpus()[name]
    return f"{g.label} · {g.memory_bytes / GIB:g} GiB" + (" (your part file)" if name == FILE
                                                          else "")


def cpu_options(own: parts.CpuPart | None = None) -> list[str]:
    return [*([FILE] if own is not None else []), *parts.cpus()]


def cpu_label(name: str, own: parts.CpuPart | None = None) -> str:
    c = own if name == FILE and own is not None else parts.cpus()[name]
    return f"{c.label} · {c.cores} cores" + (" (your part file)" if name == FILE else "")


def memory_options() -> list[str]:
    """:data:`DEFAULT` (the CPU's usual memory), then the catalog CPUs' memories and a few
    common ones."""
    names = {c.memory for c in parts.cpus().values()} | set(_MORE_MEMORY)
    return [DEFAULT, *sorted(names, key=lambda n: (n.split("-")[0],
                                                   parts.memory_part(n).bandwidth))]


def memory_label(name: str, usual: str) -> str:
    """``usual``: the chosen CPU's usual memory."""
    if name == DEFAULT:
        return f"the CPU's usual ({usual})"
    return f"{name} · {parts.memory_part(name).bandwidth / 1e9:g} GB/s"


def link_options() -> list[str]:
    return [DEFAULT, *LINKS]


def link_label(name: str, card: parts.GpuPart) -> str:
    if name == DEFAULT:
        return f"the card's own (pcie{card.pcie_gen}x{card.pcie_lanes})"
    return name


@dataclass(frozen=True)
class MachineChoice:
    """Catalog names of the chosen parts (``memory``/``link`` :data:`DEFAULT`: the CPU's usual
    memory, the card's own link)."""

    gpu: str | parts.GpuPart
    cpu: str | parts.CpuPart = DEFAULT_CPU
    memory: str = DEFAULT
    link: str = DEFAULT
    context: int = DEFAULT_CONTEXT
    more: tuple[str, ...] = ()          # the cards beside ``gpu``, in device order

    @property
    def cpu_only(self) -> bool:
        """No GPU: every weight and operation on the CPU."""
        return self.gpu == NO_GPU

    @property
    def parts_key(self) -> str:
        """The parts as one name, ``gpu+link+cpu+memory`` (a part file's part by its name and
        a hash of its numbers)."""
        gpus = ",".join((part_name(self.gpu), *self.more))
        return "+".join((gpus, self.link, part_name(self.cpu), self.memory))

    @property
    def key(self) -> str:
        """The parts and the context, ``gpu+link+cpu+memory@ctxN``."""
        return f"{self.parts_key}@ctx{self.context}"

    def compose(self) -> Machine:
        """The machine (CopeInputError, one line, for a part the catalog does not know)."""
        return compose_machine(gpu=[self.gpu, *self.more] if self.more else self.gpu,
                               cpu=self.cpu,
                               memory=None if self.memory == DEFAULT else self.memory,
                               link=None if self.link == DEFAULT else self.link)


def more_cards(text: str) -> tuple[str, ...]:
    """The sidebar's "More cards": catalog GPU names separated by commas (empty: none), or a
    one-line CopeInputError naming the first unknown one."""
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    known = parts.gpus()                        # catalog names only: never a server's path
    for n in names:
        if n not in known:
            raise CopeInputError(f"unknown card {n!r}; nearest: "
                                 f"{', '.join(parts.suggest('gpu', n))} (`cope parts gpus` lists "
                                 "them)", field="More cards")
    return names


def part_name(part: str | parts.GpuPart | parts.CpuPart) -> str:
    """A catalog name, or a part file's part as its name and a hash of its numbers."""
    if isinstance(part, str):
        return part
    digest = hashlib.sha256(repr(part).encode()).hexdigest()[:8]
    return f"{part.name}@{digest}"


def machine_profile(g: ModelGeometry, m: Machine, context: int = DEFAULT_CONTEXT) -> Profile:
    """The ANALYTIC profile of ``g`` on ``m``: CPU threads at powers of two up to the CPU's
    cores and its cores (the default operating point), the machine's label, GPU memory and
    context length in the platform record (:func:`cope_core.app.whatif.default_budget` reads
    ``vram_gib`` and ``context``)."""
    assert m.spec is not None           # the sidebar always composes a GPU
    threads = sorted(set(default_threads(m.spec)) | {m.threads})
    p = analytic_profile(g, m.spec, cpu_threads=threads)
    plat = {**p.platform, "machine": m.spec.name, "vram_gib": m.vram_bytes / GIB,
            "context": int(context)}
    return dataclasses.replace(p, platform=plat)


def is_your_machine(profile: Profile) -> bool:
    return "machine" in (profile.platform or {})


@dataclass(frozen=True)
class OwnParts:
    """A session's parts read from part files (at most one GPU and one CPU)."""

    gpu: parts.GpuPart | None = None
    cpu: parts.CpuPart | None = None

    def usual_memory(self, cpu: str) -> str:
        """The usual memory of the CPU chosen as ``cpu`` (:data:`FILE`: the part file's)."""
        c = self.cpu if cpu == FILE and self.cpu is not None else parts.cpus()[cpu]
        return c.memory


def quant_options(name: str) -> list[str]:
    """Weights a catalog model can be priced in: as the catalog has it (BF16), or a
    llama-quantize preset its published files use (gpt-oss: MXFP4 experts only)."""
    native = name.startswith(NATIVE_MXFP4)
    return [AS_IS, *(p for p in COMMON if p != "BF16"
                     and not (native and p != "MXFP4_MOE"))]


def catalog_geometry(name: str, quant: str) -> ModelGeometry:
    """A catalog model in ``quant`` (:data:`AS_IS`: as the catalog stores it)."""
    return resolve_model(name, None if quant == AS_IS else quant)


def catalog_models(shipped: list[str]) -> list[str]:
    """Catalog models with no shipped example (the app makes their trace)."""
    return [n for n in CATALOG if n not in shipped]


def build_options() -> list[str]:
    """The llama.cpp builds the sidebar offers: the newest known, then each build where a
    feature COPE models arrived, newest first."""
    return [LATEST_BUILD] + [b for b, _ in reversed(milestones())]


def build_label(build: str) -> str:
    """How the sidebar names a build."""
    if build == LATEST_BUILD:
        return f"latest ({latest().label})"
    return f"{build} (from it: {dict(milestones())[build]})"
