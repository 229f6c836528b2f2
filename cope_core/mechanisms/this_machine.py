"""``this`` machine as parts: what the OS and the drivers say, what a short probe measures, and
what had to be assumed, each number said to be which (:class:`~cope_core.parts.Fact`).

- CPU: model name from ``/proc/cpuinfo``; physical cores among those this process may run on
  (``os.sched_getaffinity``; a hybrid Intel part's P-cores from ``/sys/devices/cpu_core/cpus``,
  since threads run on them); a catalog CPU of the same model gives clocks and FMA units,
  otherwise the current clock and the vector flags stand in for them, said to be assumed.
- GPU: ``nvidia-smi``, else ``rocm-smi``, else torch, when present; a catalog GPU of the same
  name gives FLOP/s and bandwidth. None found: the machine is CPU-only, and that is said.
- Memory: bandwidth measured (:func:`cope_core.mechanisms.probe.probe_host_memory`, about a
  second); its type and speed need root (``dmidecode``), so they are not detected.
- The CPU's dot-product kernel: the rate it streams 8-bit weights from memory with one thread and
  with all, and from a core's cache (:func:`cope_core.mechanisms.probe.probe_host_kernel`, about
  half a second), what decode's CPU experts reach rather than a copy's bandwidth.

Nothing here imports torch until a probe or the torch fallback runs.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import CopeInputError
from ..parts import CpuPart, Fact, GpuPart, MemoryPart, cpus, gpus
from ..parts.catalog import key

GB = 1e9
#: Runs a command and returns its standard output, or None when it is absent or fails.
Runner = Callable[[Sequence[str]], str | None]
#: A memory probe's (all-threads bytes/s, one-thread bytes/s, threads, how it was measured).
Probed = tuple[float, float, int, str]
#: A kernel probe's ((one-thread, all-threads, cached bytes/s), threads, how it was measured),
#: or a line saying why there is none.
KernelProbed = tuple[tuple[float, float, float], int, str] | str


def run_command(cmd: Sequence[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


# --- CPU ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuInfo:
    """What the OS says about the CPU this process runs on."""

    model: str
    logical: int            # CPUs this process may run on
    cores: int              # physical cores among them (P-cores on a hybrid part)
    e_cores: int
    flags: frozenset[str]
    mhz: float | None       # the clock /proc/cpuinfo reports now


def read_cpuinfo(text: str, allowed: set[int], p_cpus: set[int] | None = None) -> CpuInfo:
    """Parse ``/proc/cpuinfo``: physical cores are distinct (physical id, core id) pairs of the
    ``allowed`` logical CPUs; with ``p_cpus`` (a hybrid part's P-core CPUs) they are split."""
    blocks = [dict(re.findall(r"^([^\t:]+?)\s*:\s*(.*)$", b, re.M))
              for b in text.strip().split("\n\n") if b.strip()]
    mine = [b for b in blocks if int(b.get("processor", -1)) in allowed] or blocks
    model = mine[0].get("model name", "unknown CPU") if mine else "unknown CPU"

    def core(b: dict[str, str]) -> tuple[str, str]:
        return (b.get("physical id", "0"), b.get("core id", b.get("processor", "")))
    all_cores = {core(b) for b in mine}
    p = {core(b) for b in mine if p_cpus is None or int(b["processor"]) in p_cpus}
    flags = frozenset(mine[0].get("flags", "").split()) if mine else frozenset()
    mhz = float(mine[0]["cpu MHz"]) if mine and "cpu MHz" in mine[0] else None
    return CpuInfo(model=" ".join(model.split()), logical=len(mine), cores=len(p) or 1,
                   e_cores=len(all_cores - p), flags=flags, mhz=mhz)


def _cpu_list(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        if a.strip():
            out.update(range(int(a), int(b or a) + 1))
    return out


def detect_cpu() -> CpuInfo:
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:      # not Linux
        allowed = set(range(os.cpu_count() or 1))
    hybrid = Path("/sys/devices/cpu_core/cpus")
    p_cpus = _cpu_list(hybrid.read_text()) if hybrid.exists() else None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return read_cpuinfo(text, set(allowed), p_cpus)


def match_catalog(detected: str, names: dict[str, str]) -> str | None:
    """The catalog entry whose key the detected name contains, longest first (``rtx4070ti``
    before ``rtx4070``); ``names`` maps each entry to the key to look for."""
    d = key(detected)
    found = [n for n, k in names.items() if k and k in d]
    return max(found, key=lambda n: len(names[n])) if found else None


def this_cpu(info: CpuInfo, one_thread_bw: float | None,
             kernel: KernelProbed | None = None) -> tuple[CpuPart, list[Fact]]:
    """A CPU part for ``info``: a catalog CPU of the same model with the cores found here, or
    one made of the OS's numbers and stated assumptions; ``kernel``: the probed dot-product
    kernel's rates, kept on the part (``CpuPart.kernel``) with their facts."""
    src = "/proc/cpuinfo, sched_getaffinity"
    facts = [Fact("cpu", "model", info.model, "detected", "/proc/cpuinfo"),
             Fact("cpu", "cores (threads run on)", str(info.cores), "detected", src)]
    if info.e_cores:
        facts.append(Fact("cpu", "E-cores (threads beyond the cores)", str(info.e_cores),
                          "detected", "/sys/devices/cpu_core/cpus"))
    name = match_catalog(info.model, {n: key(c.label) for n, c in cpus().items()})
    if name is not None:
        c = cpus()[name]
        part = replace(c, name=f"this ({c.name})", cores=info.cores, e_cores=info.e_cores,
                       origin="detected")
        facts.append(Fact("cpu", "clock, FMA units", f"{c.base_hz / 1e9:g} GHz base, "
                          f"{c.flop_per_cycle} FLOP/cycle", "catalog", c.name))
    else:
        simd = "avx512" if "avx512f" in info.flags else "avx2" if "avx2" in info.flags else "neon"
        bits = {"avx512": 512, "avx2": 256}.get(simd, 128)
        ghz = round((info.mhz or 2000.0) / 1000, 2)
        part = CpuPart(name="this", label=info.model, vendor="detected", cores=info.cores,
                       e_cores=info.e_cores, base_hz=round(ghz * 1000) * 1e6,
                       boost_hz=round(ghz * 1000) * 1e6, simd=simd, fma_units=2, fma_bits=bits,
                       memory="this", per_core_bandwidth=20 * GB, source="detected",
                       origin="detected")
        facts += [Fact("cpu", "catalog entry", "none matches this model", "detected",
                       "cope parts cpus"),
                  Fact("cpu", "clock", f"{ghz:g} GHz", "detected" if info.mhz else "assumed",
                       "/proc/cpuinfo 'cpu MHz' now, taken as the sustained clock"),
                  Fact("cpu", "SIMD", f"{simd}, {bits}-bit", "detected", "/proc/cpuinfo flags"),
                  Fact("cpu", "FMA units per core", "2", "assumed",
                       "two FMA pipes, as every catalog CPU has")]
    if one_thread_bw is not None:
        part = replace(part, per_core_bandwidth=one_thread_bw, measured=True)
        facts.append(Fact("cpu", "bandwidth of one core", f"{one_thread_bw / GB:.1f} GB/s",
                          "measured", "probe_host_memory, one thread"))
    else:
        facts.append(Fact("cpu", "bandwidth of one core",
                          f"{part.per_core_bandwidth / GB:g} GB/s", "assumed",
                          "the catalog's assumption (no vendor publishes it)"))
    if isinstance(kernel, str):
        facts.append(Fact("cpu", "dot-product kernel", "not probed", "detected",
                          f"{kernel}; experts priced at the bandwidths above"))
    elif kernel is not None:
        (one, every, cached), threads, how = kernel
        part = replace(part, kernel=(one, every, cached))
        src = "probe_host_kernel: torch aten._weight_int8pack_mm, one bf16 row"
        facts += [Fact("cpu", "dot-product kernel from memory, one thread",
                       f"{one / GB:.1f} GB/s of 8-bit weights", "measured", f"{src}; {how}"),
                  Fact("cpu", f"dot-product kernel from memory, {threads} threads",
                       f"{every / GB:.1f} GB/s of 8-bit weights", "measured", f"{src}; {how}"),
                  Fact("cpu", "dot-product kernel from cache, one thread",
                       f"{cached / GB:.1f} GB/s of 8-bit weights", "measured",
                       f"{src}, 2 MiB of weights; {how}")]
    return part, facts


# --- GPU ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_bytes: float
    pcie_gen: int | None
    pcie_lanes: int | None
    via: str


def detect_gpus(run: Runner = run_command, torch_probe: bool = True) -> list[GpuInfo]:
    """The GPUs ``nvidia-smi``, else ``rocm-smi``, else torch report (an empty list: none)."""
    out = run(["nvidia-smi", "--query-gpu=name,memory.total,pcie.link.gen.max,"
               "pcie.link.width.max", "--format=csv,noheader,nounits"])
    if out:
        found = []
        for line in out.strip().splitlines():
            f = [x.strip() for x in line.split(",")]
            if len(f) >= 2 and f[1].replace(".", "").isdigit():
                found.append(GpuInfo(f[0], float(f[1]) * 2**20, _int(f, 2), _int(f, 3),
                                     "nvidia-smi"))
        return found
    out = run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"])
    if out:
        return read_rocm_smi(out)
    return _torch_gpus() if torch_probe else []


def read_rocm_smi(text: str) -> list[GpuInfo]:
    """``rocm-smi --showproductname --showmeminfo vram --json``: one object per card, its name
    under "Card Series" (or "Card series", "Card Model" by version), its memory under "VRAM
    Total Memory (B)"."""
    try:
        cards = json.loads(text)
    except ValueError:
        return []
    found = []
    for card in (cards.values() if isinstance(cards, dict) else []):
        if not isinstance(card, dict):
            continue
        low = {str(k).lower(): str(v) for k, v in card.items()}
        name = next((low[k] for k in ("card series", "card model", "card sku") if k in low), "")
        total = low.get("vram total memory (b)", "0")
        if name:
            found.append(GpuInfo(name, float(total) if total.isdigit() else 0.0, None, None,
                                 "rocm-smi"))
    return found


def _int(f: list[str], i: int) -> int | None:
    return int(f[i]) if len(f) > i and f[i].isdigit() else None


def _torch_gpus() -> list[GpuInfo]:
    import torch
    if not torch.cuda.is_available():
        return []
    return [GpuInfo(torch.cuda.get_device_name(i),
                    float(torch.cuda.get_device_properties(i).total_memory), None, None, "torch")
            for i in range(torch.cuda.device_count())]


def this_gpus(found: list[GpuInfo]) -> tuple[tuple[GpuPart, ...], list[Fact]]:
    """A GPU part for every GPU found, in the order the tool lists them (llama.cpp's device
    order under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), each :func:`this_gpu`'s; none found: the
    machine is CPU-only."""
    if len(found) <= 1:
        one, facts = this_gpu(found)
        return (() if one is None else (one,)), facts
    parts_, facts = [], [Fact("gpu", "GPUs found", str(len(found)), "detected", found[0].via)]
    for i, info in enumerate(found):
        part, f = this_gpu([info])
        assert part is not None
        parts_.append(replace(part, name=f"this{i} ({part.name.removeprefix('this (')}"))
        facts += [x._replace(part=f"gpu{i}") for x in f]
    return tuple(parts_), facts


def this_gpu(found: list[GpuInfo]) -> tuple[GpuPart | None, list[Fact]]:
    """A GPU part for the first GPU found: the catalog's numbers with the memory reported here.
    None found: the machine is CPU-only."""
    if not found:
        return None, [Fact("gpu", "GPU", "none found: this machine is CPU-only", "detected",
                           "nvidia-smi, rocm-smi and torch.cuda")]
    g = found[0]
    keys = {n: key(re.sub(r"-\d+gb$", "", n)) for n in gpus()}   # rtx3060-12gb -> rtx3060
    best = match_catalog(g.name, keys)
    names = [n for n in gpus() if best is not None and keys[n] == keys[best]]
    facts = [Fact("gpu", "model", g.name, "detected", g.via),
             Fact("gpu", "memory", f"{g.memory_bytes / 2**30:.1f} GiB", "detected", g.via)]
    if not names:
        raise CopeInputError(f"this machine's GPU {g.name!r} is not in the catalog; give --gpu "
                             "NAME of a similar card or a GPU part file (docs/parts.md)",
                             field="gpu")
    c = min((gpus()[n] for n in names), key=lambda x: abs(x.memory_bytes - g.memory_bytes))
    part = replace(c, name=f"this ({c.name})", memory_bytes=g.memory_bytes or c.memory_bytes,
                   pcie_gen=g.pcie_gen or c.pcie_gen, pcie_lanes=g.pcie_lanes or c.pcie_lanes,
                   link=f"pcie{g.pcie_gen or c.pcie_gen}x{g.pcie_lanes or c.pcie_lanes}",
                   origin="detected")
    facts.append(Fact("gpu", "FLOP/s, bandwidth", f"{c.flops / 1e12:g} TFLOP/s, "
                      f"{c.bandwidth / GB:g} GB/s", "catalog", c.name))
    facts.append(Fact("gpu", "PCIe", part.link, "detected" if g.pcie_gen else "catalog",
                      g.via if g.pcie_gen else c.name))
    return part, facts


# --- memory and the whole machine --------------------------------------------------------------
def this_memory(all_threads_bw: float, threads: int, how: str = "") -> tuple[MemoryPart,
                                                                              list[Fact]]:
    part = MemoryPart(name="this", kind="unknown", mts=0, channels=0, bandwidth=all_threads_bw,
                      source="probe_host_memory", origin="detected", measured=True)
    return part, [
        Fact("memory", "read bandwidth", f"{all_threads_bw / GB:.1f} GB/s", "measured",
             f"probe_host_memory, {threads} threads" + (f"; {how}" if how else "")),
        Fact("memory", "type, speed, channels", "not detected", "detected",
             "needs root (dmidecode); give --memory TYPE-MTSxCHANNELS to price the peak")]


@dataclass(frozen=True)
class ThisMachine:
    """This machine as parts, and every fact behind them."""

    gpu: GpuPart | None
    cpu: CpuPart | None
    memory: MemoryPart | None
    facts: tuple[Fact, ...]
    more_gpus: tuple[GpuPart, ...] = ()     # the second card on, in the tool's order


def this_machine(*, gpu: bool = True, cpu: bool = True, memory: bool = True,
                 seconds: float = 1.0, run: Runner = run_command,
                 probe: Callable[[float], Probed] | None = None,
                 torch_probe: bool = True,
                 kernel_probe: Callable[[float], KernelProbed] | None = None) -> ThisMachine:
    """Detect (and, for ``cpu`` or ``memory``, probe) the parts asked for. ``run`` runs
    ``nvidia-smi`` / ``rocm-smi``; ``torch_probe`` lets torch look for a GPU when neither
    answers; ``probe(seconds)`` returns (all-threads bytes/s, one-thread bytes/s, threads, how it
    was measured), by default :func:`cope_core.mechanisms.probe.probe_host_memory`'s;
    ``kernel_probe(seconds)`` the dot-product kernel's rates for ``cpu``, by default
    :func:`cope_core.mechanisms.probe.probe_host_kernel`'s (not run when a ``probe`` is given
    without one: a stand-in machine has no kernel)."""
    facts: list[Fact] = []
    g, more = None, tuple[GpuPart, ...]()
    if gpu:
        cards, f = this_gpus(detect_gpus(run, torch_probe))
        g, more = (cards[0] if cards else None), cards[1:]
        facts += f
    bw = None
    if cpu or memory:
        bw = (probe or _probe)(seconds)
    c = m = None
    if cpu:
        kp = kernel_probe or (_kernel_probe if probe is None else None)
        c, f = this_cpu(detect_cpu(), bw[1] if bw else None,
                        kp(seconds / 2) if kp is not None else None)
        facts += f
    if memory and bw:
        m, f = this_memory(bw[0], bw[2], bw[3])
        facts += f
    return ThisMachine(gpu=g, cpu=c, memory=m, facts=tuple(facts), more_gpus=more)


def _probe(seconds: float) -> Probed:
    from .probe import probe_host_memory
    r = probe_host_memory(seconds)
    return (r.all_threads, r.one_thread, r.threads,
            f"fastest of {r.samples} reads of {r.buffer_bytes >> 20} MiB in {r.seconds:.1f} s")


def _kernel_probe(seconds: float) -> KernelProbed:
    import torch

    from .probe import probe_host_kernel
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return f"torch {torch.__version__} has no aten._weight_int8pack_mm"
    r = probe_host_kernel(seconds)
    return ((r.one_thread, r.all_threads, r.cached), r.threads,
            f"fastest of {r.samples} products over {r.buffer_bytes >> 20} MiB in "
            f"{r.seconds:.1f} s")
