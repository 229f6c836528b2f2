"""A machine composed from parts, in one call: what the analytic profile prices, and every
number behind it with where it came from.

``compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2", link="4x16")``
looks the parts up in the catalog (:mod:`cope_core.parts`; a path is a user's part file),
negotiates the link with the card (a PCIe 4.0 x8 card in a 3.0 x16 slot runs at 3.0 x8), takes
threads as the CPU's physical cores (a hybrid part's P-cores) unless told, and returns a
:class:`Machine` whose ``spec`` is the :class:`~cope_core.platforms.PlatformSpec` that
:func:`cope_core.profile.analytic.analytic_profile` takes (at ``cpu_threads=[machine.threads]``)
and whose ``vram_bytes`` caps the budgets. ``"this"`` for the GPU, CPU or memory detects and
probes this machine (:mod:`cope_core.mechanisms.this_machine`); no GPU makes the machine
CPU-only (``spec`` is None, and the facts say so).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import parts
from .errors import CopeInputError
from .parts import CpuPart, Fact, GpuPart, LinkPart, MemoryPart
from .platforms import PlatformSpec, spec_from_parts

THIS = "this"
GB = 1e9


@dataclass(frozen=True)
class Machine:
    """Parts, the operating point's threads, the platform they make and the facts behind it."""

    gpu: GpuPart | None
    link: LinkPart | None
    cpu: CpuPart
    memory: MemoryPart
    threads: int
    spec: PlatformSpec | None      # None: CPU-only
    facts: tuple[Fact, ...]
    #: the second card on (``--gpu a,b``), each with the link it runs at, in device order
    more: tuple[tuple[GpuPart, LinkPart], ...] = ()

    @property
    def cpu_only(self) -> bool:
        return self.gpu is None

    @property
    def cards(self) -> tuple[tuple[GpuPart, LinkPart], ...]:
        """Every card with its link, in llama.cpp's device order (CUDA0 first)."""
        if self.gpu is None or self.link is None:
            return ()
        return ((self.gpu, self.link), *self.more)

    def card_specs(self) -> tuple[PlatformSpec, ...]:
        """One platform per card: that card and its link with this machine's CPU and memory
        (``spec`` is the first's)."""
        return tuple(self.spec if i == 0 and self.spec is not None else
                     spec_from_parts(g, lk, self.cpu, self.memory,
                                     name=f"{g.name}+{lk.name}+{self.cpu.name}+{self.memory.name}")
                     for i, (g, lk) in enumerate(self.cards))

    @property
    def vram_bytes(self) -> float:
        return self.gpu.memory_bytes if self.gpu else 0.0

    def describe(self) -> str:
        """The facts as a table: part, quantity, value, how it is known, and from where."""
        rows = [("part", "quantity", "value", "how", "source")] + [tuple(f) for f in self.facts]
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(r[i].ljust(w[i]) for i in range(4)) + "  " + r[4]
                         for r in rows)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu.name if self.gpu else None,
                "link": self.link.name if self.link else None,
                "gpus": [{"gpu": g.name, "link": lk.name, "vram_gib": g.memory_bytes / 2**30}
                         for g, lk in self.cards], "cpu": self.cpu.name,
                "memory": self.memory.name, "threads": self.threads, "cpu_only": self.cpu_only,
                "vram_gib": self.vram_bytes / 2**30,
                "spec": self.spec.to_dict() if self.spec else None,
                "facts": [f._asdict() for f in self.facts]}


def compose_machine(*, gpu: str | GpuPart | Sequence[str | GpuPart] | None,
                    cpu: str | CpuPart, memory: str | MemoryPart | None = None,
                    link: str | LinkPart | Sequence[str | LinkPart] | None = None,
                    threads: int | None = None, probe_seconds: float = 1.0,
                    this: Any = None) -> Machine:
    """Compose a machine from catalog names, part files, parts or ``"this"``.

    Parameters
    ----------
    gpu : str, GpuPart or None
        A catalog GPU, a GPU part file, ``"this"``, or None / ``"none"`` for CPU-only.
    cpu : str or CpuPart
        A catalog CPU, a CPU part file or ``"this"``.
    memory : str or MemoryPart, optional
        ``TYPE-MTSxCHANNELS`` (``ddr4-3200x2``) or ``"this"`` (measured); default the CPU's
        usual memory (``"this"`` for a detected CPU the catalog lacks).
    link : str or LinkPart, optional
        The slot, ``pcieGENxLANES`` or ``GENxLANES``; default the card's own interface.
    threads : int, optional
        CPU threads of the operating point; default the CPU's physical (P-)cores.
    probe_seconds : float
        How long the memory probe of ``"this"`` runs.
    this : ThisMachine, optional
        Already detected parts (tests, or a caller that detected once); default detect now.

    Several cards: ``gpu`` lists them, comma-separated (``"rtx3090,rtx3060-12gb"``, names or
    part files in any mix) in llama.cpp's device order, and ``link`` gives one slot for all or
    one per card; ``"this"`` finds every card. The first card is ``gpu``/``link``/``spec``,
    the others :attr:`Machine.more`.
    """
    gpus, links = _listed(gpu), _listed(link)
    if len(gpus) > 1 or len(links) > 1:
        return _several(gpus, links, cpu=cpu, memory=memory, threads=threads,
                        probe_seconds=probe_seconds, this=this)
    card: str | GpuPart | None = gpus[0]
    slot_given: str | LinkPart | None = links[0]
    want = {k for k, v in (("gpu", gpu), ("cpu", cpu), ("memory", memory))
            if isinstance(v, str) and v.strip().lower() == THIS}
    if want and this is None:
        from .mechanisms.this_machine import this_machine
        this = this_machine(gpu="gpu" in want, cpu="cpu" in want, memory="memory" in want,
                            seconds=probe_seconds)
    facts: list[Fact] = list(this.facts) if want else []

    c = this.cpu if "cpu" in want else parts.cpu_part(cpu)
    if c is None:
        raise CopeInputError("this machine's CPU was not detected", field="cpu")
    if "cpu" not in want:
        facts += _catalog_facts("cpu", c)
    mem_name = memory if memory is not None else c.memory
    if isinstance(mem_name, MemoryPart):
        m = mem_name
    elif mem_name.strip().lower() == THIS:
        if "memory" not in want:        # a detected CPU the catalog lacks: measure its memory
            from .mechanisms.this_machine import this_machine
            extra = this_machine(gpu=False, cpu=False, memory=True, seconds=probe_seconds)
            facts += list(extra.facts)
            this = extra
        m = this.memory
    else:
        m = parts.memory_part(mem_name)
        if memory is None:
            facts.append(Fact("memory", "type x speed x channels", m.name, "assumed",
                              f"{c.name}'s usual memory; --memory says yours"))
        facts.append(Fact("memory", "peak bandwidth", f"{m.bandwidth / GB:g} GB/s",
                          "derived", m.note))
    eff = PlatformSpec.cpu_efficiency
    facts.append(Fact("memory", "achieved fraction", f"{eff:g} of peak", "assumed",
                      "PlatformSpec.cpu_efficiency, fitted on the paper's A100 cells "
                      "(docs/design.md#overheads-and-efficiencies)"
                      + (f"; a measured bandwidth enters as measured / {eff:g}" if m.measured
                         else "")))

    g = _gpu(card, this if "gpu" in want else None)
    if "gpu" not in want and g is not None:
        facts += _catalog_facts("gpu", g)
    lk = None
    if g is not None:
        slot = slot_given if isinstance(slot_given, LinkPart) \
            else parts.link_part(slot_given or g.link)
        lk = parts.link_between(slot, g)
        facts.append(Fact("link", "per direction", f"{lk.name}: {lk.bandwidth / GB:.2f} GB/s",
                          "derived", lk.note))
        if lk is not slot:
            facts.append(Fact("link", "negotiated", f"a pcie{g.pcie_gen}x{g.pcie_lanes} card in "
                              f"a {slot.name} slot runs at {lk.name}", "derived",
                              "the lower generation and the fewer lanes of the two"))
    elif slot_given is not None:
        facts.append(Fact("link", "link", "none: the machine is CPU-only", "derived",
                          f"{slot_given if isinstance(slot_given, str) else slot_given.name} "
                          "not used"))

    if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
        raise CopeInputError(f"expected a positive whole number, got {threads!r}",
                             field="threads")
    t = int(threads) if threads is not None else c.cores
    facts.append(Fact("cpu", "threads", str(t), "assumed" if threads is None else "given",
                      "the physical cores threads run on (P-cores on a hybrid part)"
                      if threads is None else "--threads"))
    spec = None
    if g is not None and lk is not None:
        spec = spec_from_parts(g, lk, c, m, name=f"{g.name}+{lk.name}+{c.name}+{m.name}")
    more = tuple(_card(x, x.link, i + 1, facts) for i, x in
                 enumerate(this.more_gpus)) if "gpu" in want and this is not None else ()
    return Machine(gpu=g, link=lk, cpu=c, memory=m, threads=t, spec=spec, facts=tuple(facts),
                   more=more)


def _listed(v: Any) -> list[Any]:
    """A part's value as a list: ``"a,b"`` split, a sequence as is, one value alone."""
    if isinstance(v, str):
        return [x.strip() for x in v.split(",")] if "," in v else [v]
    if isinstance(v, (list, tuple)):
        return list(v)
    return [v]


def _several(gpus: list[Any], links: list[Any], **rest: Any) -> Machine:
    """:func:`compose_machine` of several cards: the first as one machine, the rest beside it."""
    names = [x if isinstance(x, str) else x.name for x in gpus]
    if any(not n or n.lower() in (THIS, "none") for n in names if isinstance(n, str)):
        raise CopeInputError(f"expected card names or part files, got {','.join(names)!r}"
                             " ('this' finds every card; 'none' stands alone)", field="--gpu")
    if len(links) not in (1, len(gpus)) or (len(links) > 1 and len(gpus) == 1):
        raise CopeInputError(f"{len(links)} slots for {len(gpus)} card"
                             f"{'s' if len(gpus) > 1 else ''}: give one --pcie for every card "
                             "or one per card, comma-separated", field="--pcie")
    one = compose_machine(gpu=gpus[0], link=links[0], **rest)
    facts = list(one.facts)
    more = tuple(_card(parts.gpu_part(x), links[0] if len(links) == 1 else links[i + 1], i + 1,
                       facts) for i, x in enumerate(gpus[1:]))
    return dataclasses.replace(one, more=more, facts=tuple(facts))


def _card(g: GpuPart, link: str | LinkPart | None, i: int, facts: list[Fact]
          ) -> tuple[GpuPart, LinkPart]:
    """Card ``i`` (from 1) and its negotiated link; its facts appended to ``facts``."""
    slot = link if isinstance(link, LinkPart) else parts.link_part(link or g.link)
    lk = parts.link_between(slot, g)
    if g.origin != "detected":
        facts += [f._replace(part=f"gpu{i}") for f in _catalog_facts("gpu", g)]
    facts.append(Fact(f"gpu{i}", "link per direction", f"{lk.name}: {lk.bandwidth / GB:.2f} "
                      "GB/s", "derived", lk.note))
    return g, lk


def _gpu(gpu: str | GpuPart | None, this: Any) -> GpuPart | None:
    if this is not None:
        return this.gpu
    if gpu is None or (isinstance(gpu, str) and gpu.strip().lower() in ("none", "")):
        return None
    return parts.gpu_part(gpu)


def _catalog_facts(kind: str, p: GpuPart | CpuPart) -> list[Fact]:
    how = "catalog" if p.origin == "catalog" else "file"
    src = p.source if how == "catalog" else f"{p.origin}: {p.source}"
    if isinstance(p, GpuPart):
        return [Fact(kind, "model", p.label, how, src),
                Fact(kind, "memory", f"{p.memory_bytes / 2**30:.1f} GiB", how, p.name),
                Fact(kind, "bandwidth", f"{p.bandwidth / GB:g} GB/s", how, p.name),
                Fact(kind, "FP16 FLOP/s", f"{p.flops / 1e12:g} T ({p.flops_kind})",
                     "derived" if p.flops_basis == "derived" else how, p.note or p.name)]
    return [Fact(kind, "model", p.label, how, src),
            Fact(kind, "cores (threads run on)", str(p.cores), how, p.name),
            Fact(kind, "FLOP/s per core", f"{p.flops_per_thread / 1e9:g} G = "
                 f"{p.base_hz / 1e9:g} GHz base x {p.flop_per_cycle} FLOP/cycle", "derived",
                 f"{p.fma_units} x {p.fma_bits}-bit FMA"),
            Fact(kind, "bandwidth of one core", f"{p.per_core_bandwidth / GB:g} GB/s",
                 "derived" if "Little's law" in p.note else "assumed", p.note or p.name)] + ([
            Fact(kind, "E-cores (threads beyond the cores)", f"{p.e_cores} x "
                 f"{p.e_flops_per_thread / 1e9:g} GFLOP/s, {p.e_core_bandwidth / GB:g} GB/s "
                 "each", how, p.name)] if p.e_cores and p.e_flops_per_thread
            and p.e_core_bandwidth else [])
