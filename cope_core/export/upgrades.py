"""What would help most: the same llama.cpp placement priced on the machine with one part
changed at a time (faster memory, twice the channels, more cores; on a hybrid part, its E-cores
too), for ``cope advise``'s "what would help most" lines. Each is the analytic model of the
changed parts (:func:`cope_core.platforms.spec_from_parts`,
:func:`cope_core.profile.analytic.analytic_profile`) at the same host MoE layers and context, so
the answer moves only with the part."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..estimate.cpu_only import host_spec, published_error, spec_tpot
from ..estimate.speed import tokens_per_s
from ..geometry import ModelGeometry
from ..llamacpp import Cards, blocks_tpot, placement_tpot
from ..machine import Machine
from ..parts import CpuPart, MemoryPart
from ..platforms import spec_from_parts
from ..profile.analytic import analytic_profile

#: how much faster "faster memory" is: a step of 20 % in MT/s (e.g. DDR5-5200 to 6240, about
#: one speed grade of an XMP/EXPO kit)
FASTER_MEMORY = 1.2
#: each block's card and its routed experts' card (-1: host memory; None: none)
Blocks = tuple[list[int], list[int | None]]


@dataclass(frozen=True)
class Upgrade:
    """One part changed: what (``label``) and the predicted decode speed with it, beside the
    machine's own (tokens/s)."""

    label: str
    tokens_per_s: float
    base_tokens_per_s: float
    checked: str = ""           # how the model did on published A/Bs of this change

    @property
    def gain_pct(self) -> float:
        return 100 * (self.tokens_per_s / self.base_tokens_per_s - 1)

    def text(self) -> str:
        return (f"{self.label}: {self.tokens_per_s:.1f} tokens/s ({self.gain_pct:+.0f} %)"
                + (f"; {self.checked}" if self.checked else ""))


def checked(kind: str) -> str:
    """What the published A/Bs say of the model on one kind of change (``memory``,
    ``channels``, ``threads``): its measured error, in words
    (:func:`cope_core.estimate.cpu_only.published_error`)."""
    err = published_error()
    if kind == "memory":
        shares = [p["share"] for p in err["memory_pairs"]]
        if not shares:
            return "no published memory-clock A/B checks it"
        return (f"on {len(shares)} published memory-clock A/Bs the model gave "
                f"{100 * min(shares):.0f}-{100 * max(shares):.0f} % of the measured gain")
    if kind == "channels":
        return "no published channel-count A/B checks it"
    return (f"the model's thread and speed ratios were {100 * err['ratio_error']:.0f} % off on "
            f"average over {err['priced_runs']} published runs")


def _speed(g: ModelGeometry, m: Machine, cpu: CpuPart, memory: MemoryPart, threads: int,
           host_layers: float, context: float, blocks: Blocks | None = None) -> float:
    if m.gpu is None or m.link is None:         # every weight on the CPU
        return tokens_per_s(spec_tpot(g, host_spec(cpu, memory), threads, context))
    if blocks is not None:                      # several cards: the same blocks on each
        cards = Cards.of(replace(m, cpu=cpu, memory=memory, spec=None))
        return tokens_per_s(blocks_tpot(cards.costs(g, threads, context), *blocks,
                                        cards.handoff(g)))
    spec = spec_from_parts(m.gpu, m.link, cpu, memory)
    profile = analytic_profile(g, spec, cpu_threads=[threads])
    return tokens_per_s(float(placement_tpot(profile, g, [host_layers], context,
                                             cpu_threads=threads)[0]))


def as_fast_as(g: ModelGeometry, machine: Machine, tpot_us: float, context: float) -> float:
    """The MoE layers' worth of host experts of the plain placement that decodes in ``tpot_us``
    at ``context`` on this machine: how a MoE-cache configuration (some host layers' experts
    cached on the GPU) is priced for what would help, so that the base of its lines is the
    command's own decode. The plain placement's TPOT rises with its host layers; interpolated
    between whole layers, clipped to [0, the MoE layers]."""
    assert machine.gpu is not None and machine.link is not None
    spec = spec_from_parts(machine.gpu, machine.link, machine.cpu, machine.memory)
    profile = analytic_profile(g, spec, cpu_threads=[machine.threads])
    grid = np.arange(g.n_layers + 1, dtype=np.float64)
    tpot = np.asarray(placement_tpot(profile, g, list(grid), context,
                                     cpu_threads=machine.threads), np.float64)
    return float(np.interp(tpot_us, tpot, grid))


def upgrades(g: ModelGeometry, machine: Machine, host_layers: float, context: float,
             blocks: Blocks | None = None) -> tuple[Upgrade, ...]:
    """Decode speed of llama.cpp's placement with ``host_layers`` MoE layers' experts in host
    memory at ``context`` (on a machine without a GPU, every weight on the CPU:
    :func:`cope_core.estimate.cpu_only.spec_tpot`), with faster memory (:data:`FASTER_MEMORY`),
    twice the memory channels, and more cores (every core when fewer threads run, else a CPU
    with twice the cores; a hybrid part's E-cores too), fastest first; empty with nothing in
    host memory."""
    if machine.gpu is not None and host_layers <= 0:
        return ()
    cpu, mem, threads = machine.cpu, machine.memory, machine.threads
    base = _speed(g, machine, cpu, mem, threads, host_layers, context, blocks)
    mts = int(round(mem.mts * FASTER_MEMORY))
    faster = replace(mem, name=f"{mem.kind}-{mts}x{mem.channels}", mts=mts,
                     bandwidth=mem.bandwidth * FASTER_MEMORY)
    wider = replace(mem, name=f"{mem.kind}-{mem.mts}x{2 * mem.channels}",
                    channels=2 * mem.channels, bandwidth=mem.bandwidth * 2)
    out = [Upgrade(f"faster memory ({faster.name}, +{100 * (FASTER_MEMORY - 1):.0f} % MT/s)",
                   _speed(g, machine, cpu, faster, threads, host_layers, context, blocks), base,
                   checked("memory")),
           Upgrade(f"twice the channels ({wider.name})",
                   _speed(g, machine, cpu, wider, threads, host_layers, context, blocks), base,
                   checked("channels"))]
    if threads < cpu.cores:
        out.append(Upgrade(f"every core ({cpu.cores} threads, -t {cpu.cores})",
                           _speed(g, machine, cpu, mem, cpu.cores, host_layers, context,
                                  blocks), base, checked("threads")))
    else:
        bigger = replace(cpu, cores=2 * cpu.cores)
        out.append(Upgrade(f"twice the cores ({2 * cpu.cores} threads)",
                           _speed(g, machine, bigger, mem, 2 * threads, host_layers, context,
                                  blocks),
                           base, checked("threads")))
    if cpu.e_cores and cpu.e_flops_per_thread and cpu.e_core_bandwidth and threads <= cpu.cores:
        t = cpu.cores + cpu.e_cores     # the slowest core paces every thread (PlatformSpec)
        out.append(Upgrade(f"the E-cores too ({t} threads, -t {t})",
                           _speed(g, machine, cpu, mem, t, host_layers, context, blocks), base,
                           checked("threads")))
    return tuple(sorted(out, key=lambda u: -u.tokens_per_s))
