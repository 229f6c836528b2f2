"""Published peak numbers of GPUs, host links and CPUs, for the roofline estimator (HRM) and
for analytic what-if profiles.

The numbers live in the parts catalog (:mod:`cope_core.parts`, data files with a source per
row, docs/parts.md); :func:`spec_from_parts` is the one rule that turns a GPU, a link, a CPU and
its memory into a :class:`PlatformSpec`. GPU FLOP/s are dense FP16/BF16 tensor throughput (no
sparsity; GeForce cards with FP32 accumulation, as PyTorch uses), memory bandwidth is the vendor
figure. Links are per direction. CPU FLOP/s per thread are clock x FP32 FMA width, i.e. derived
from published clocks and vector units; memory bandwidth is channels x transfer rate x 8 bytes.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import parts
from .errors import CopeInputError

GB = 1e9
GIB = 1024**3
TFLOP = 1e12


@dataclass(frozen=True)
class GpuSpec:
    name: str
    flops: float          # FLOP/s, dense FP16/BF16
    bandwidth: float      # bytes/s
    vram_bytes: float     # memory sizes are binary (an "80GB" card holds 80 GiB); H200: 141 GB
    default_link: str


@dataclass(frozen=True)
class LinkSpec:
    name: str
    bandwidth: float      # bytes/s, one direction


@dataclass(frozen=True)
class CpuSpec:
    name: str
    cores: int
    flops_per_thread: float   # FLOP/s of one core
    bandwidth: float          # bytes/s of the whole socket(s)
    bandwidth_per_thread: float  # what one core can stream on its own


#: The catalog's entries before issue 40, by name: the choices the app's Compare page offers.
#: Their numbers come from the parts catalog like every other part's (tests/test_parts.py holds
#: them to the values they always had); :func:`platform_spec` accepts every catalog name.
SHIPPED_GPUS = ("a100-80gb", "h100", "h200", "rtx4090", "rtx5090", "l40s")
SHIPPED_LINKS = ("pcie4", "pcie5")
SHIPPED_CPUS = ("xeon-gold-6430", "ryzen-9-7950x", "epyc-7763")


def _gpu_spec(g: parts.GpuPart) -> GpuSpec:
    return GpuSpec(g.name, g.flops, g.bandwidth, g.memory_bytes, g.link)


def _cpu_spec(c: parts.CpuPart) -> CpuSpec:
    return CpuSpec(c.name, c.cores, c.flops_per_thread, parts.memory_part(c.memory).bandwidth,
                   c.per_core_bandwidth)


GPUS: dict[str, GpuSpec] = {n: _gpu_spec(parts.gpus()[n]) for n in SHIPPED_GPUS}
LINKS: dict[str, LinkSpec] = {n: LinkSpec(n, parts.link_part(n).bandwidth) for n in SHIPPED_LINKS}
CPUS: dict[str, CpuSpec] = {n: _cpu_spec(parts.cpus()[n]) for n in SHIPPED_CPUS}
DEFAULT_CPU = "xeon-gold-6430"


@dataclass(frozen=True)
class PlatformSpec:
    """Peak numbers of one GPU + host link + CPU, all in SI units (FLOP/s, bytes/s)."""

    name: str
    gpu_name: str
    gpu_flops: float
    gpu_bandwidth: float
    link_name: str
    link_bandwidth: float
    cpu_name: str
    cpu_cores: int
    cpu_flops_per_thread: float
    cpu_bandwidth: float
    cpu_bandwidth_per_thread: float
    source: str = "published"
    # Overheads and achieved efficiencies at batch-1 decode shapes, for analytic profiles (the
    # roofline estimator, HRM, ignores them, as MoE-Lightning's does). Sources and fitted values
    # in docs/design.md#overheads-and-efficiencies; a spec written before they existed reads
    # with these defaults.
    gpu_launch_us: float = 3.0          # one kernel launch (host issue + device start)
    gpu_sync_us: float = 6.0            # one stream/event synchronisation round trip
    link_latency_us: float = 8.0        # one host-to-device (or back) transfer, beside bytes/bw
    # fitted on the paper's A100 cells (scripts/paper_table.py --fit), within plausible bounds;
    # refitted once the analytic profile priced a prefetch beside CPU misses:
    cpu_dispatch_us: float = 20.0       # handing a layer's misses to the CPU workers and back
    link_efficiency: float = 0.3        # achieved / peak link bandwidth of an expert's copy
    gpu_efficiency: float = 0.6         # achieved / peak memory bandwidth and FLOP/s of a GEMV
    cpu_efficiency: float = 0.8         # achieved / peak CPU bandwidth and FLOP/s of a GEMV
    gpu_kernels_per_expert_group: int = 4   # gate, up, activation, down over the routed ids
    gpu_kernels_per_block: int = 16     # one decode block's attention, norms, router, adds
    # ggml's thread barrier on the host, which every graph node ends with: a fixed part and a
    # part per thread (each thread's atomic on one cache line); llama.cpp PR #9598 measured
    # 1.96 µs at 4 threads and 3.04 µs at 8 on an EPYC (docs/design.md#the-cpu-side)
    cpu_barrier_us: float = 0.88
    cpu_barrier_us_per_thread: float = 0.27
    # A hybrid part's E-cores, which threads beyond the (P-)cores land on: how many, and one
    # E-core's FLOP/s and streaming bandwidth (0 and None: none, or their rates unknown, so a
    # thread beyond the cores is an SMT sibling)
    cpu_e_cores: int = 0
    cpu_e_flops_per_thread: float | None = None
    cpu_e_bandwidth_per_thread: float | None = None
    # The host's dot-product kernel as probed (``--cpu this``: probe_host_kernel), in bytes/s of
    # 8-bit weights, each divided by ``cpu_efficiency`` as a measured bandwidth is: from memory
    # with all threads and with one, and with one thread from its cache. None: not probed, the
    # bandwidths above stand in (docs/design.md, "Validation against llama.cpp's CPU kernels").
    cpu_kernel_bandwidth: float | None = None
    cpu_kernel_bandwidth_per_thread: float | None = None
    cpu_kernel_cached_per_thread: float | None = None
    # The prompt model's two machine rates (cope_core.llamacpp.answer.prompt_rates), set by a
    # refit from the user's own llama-bench prompt rows (``cope evaluate --llama-bench --refit``):
    # the host's pageable host-to-device copy (bytes/s) and the GPU's achieved / peak FLOP/s on a
    # prompt. None: the published card's rate and the fitted pageable copy.
    host_copy_bandwidth: float | None = None
    gpu_prompt_efficiency: float | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            least = 0 if f.name == "cpu_e_cores" else 1
            if f.type == "int" and (isinstance(v, bool) or not isinstance(v, int) or v < least):
                raise CopeInputError(f"expected a positive whole number, got {v!r}",
                                     field=f"spec.{f.name}")
            if f.type == "float | None" and v is None:
                continue
            if f.type in ("float", "float | None") and (
                    isinstance(v, bool) or not isinstance(v, (int, float))
                    or not math.isfinite(v) or v <= 0):
                if f.name in LATENCY_FIELDS and v == 0 and not isinstance(v, bool):
                    continue        # a latency may be zero (the pure roofline)
                raise CopeInputError(f"expected a positive number, got {v!r}",
                                     field=f"spec.{f.name}")
        for name in ("link_efficiency", "gpu_efficiency", "cpu_efficiency"):
            if getattr(self, name) > 1:
                raise CopeInputError(f"expected a fraction of the peak in (0, 1], got "
                                     f"{getattr(self, name)!r}", field=f"spec.{name}")

    def at_share(self, share: float) -> PlatformSpec:
        """The platform with ``share`` % of the GPU (CUDA MPS): its FLOP/s and bandwidth scale,
        its latencies (launch, synchronisation, link) do not."""
        if not 0 < share <= 100:
            raise CopeInputError(f"expected a GPU share in (0, 100], got {share!r}",
                                 field="gpu_share")
        f = share / 100.0
        return dataclasses.replace(self, gpu_flops=self.gpu_flops * f,
                                   gpu_bandwidth=self.gpu_bandwidth * f)

    def cpu_flops(self, threads: int) -> float:
        return self._paced(self.cpu_flops_per_thread, self.cpu_e_flops_per_thread, threads)

    def cpu_bw(self, threads: int) -> float:
        return min(self.cpu_bandwidth, self._paced(self.cpu_bandwidth_per_thread,
                                                   self.cpu_e_bandwidth_per_thread, threads))

    def cpu_placed(self, threads: int) -> tuple[int, int]:
        """The (P-)cores and E-cores ``threads`` threads run on: the cores first, then a hybrid
        part's E-cores where their rates are known, then SMT siblings, which share a core's
        miss buffers and FMA units and so add neither bandwidth nor FLOP/s."""
        t = max(threads, 1)
        p = min(t, self.cpu_cores)
        known = self.cpu_e_flops_per_thread and self.cpu_e_bandwidth_per_thread
        return p, (min(t - p, self.cpu_e_cores) if known else 0)

    def cpu_busy(self, threads: int) -> int:
        """The cores ``threads`` threads keep busy (:meth:`cpu_placed`)."""
        return sum(self.cpu_placed(threads))

    def _paced(self, p_rate: float, e_rate: float | None, threads: int) -> float:
        """The threads' rate when each gets an equal share of the rows, as ggml splits a MoE
        matrix product at decode: the slowest core sets every thread's pace."""
        p, e = self.cpu_placed(threads)
        return (p + e) * (min(p_rate, e_rate) if e and e_rate else p_rate)

    def cpu_barrier(self, threads: int) -> float:
        """Microseconds one ggml thread barrier costs ``threads`` threads (none for one: it
        waits for nobody); every thread counts, a core's SMT sibling too."""
        if threads <= 1:
            return 0.0
        return self.cpu_barrier_us + self.cpu_barrier_us_per_thread * threads

    def cpu_kernel_bw(self, threads: int) -> float:
        """Bytes/s the host's dot-product kernels stream weights from memory at ``threads``:
        the probed kernel's (one thread's rate per thread, at most the all-threads rate and the
        memory's), else :meth:`cpu_bw`."""
        one = self.cpu_kernel_bandwidth_per_thread
        if one is None:
            return self.cpu_bw(threads)
        n = self.cpu_busy(threads)
        return min(self.cpu_bandwidth, one * n, self.cpu_kernel_bandwidth or one * n)

    def cpu_kernel_cached(self, threads: int) -> float:
        """Bytes/s of 8-bit weights ``threads`` threads dot from their caches: the probed
        kernel's, else the per-thread bandwidth (as before the probe)."""
        one = self.cpu_kernel_cached_per_thread
        if one is None:
            return self._paced(self.cpu_bandwidth_per_thread, self.cpu_e_bandwidth_per_thread,
                               threads)
        return one * self.cpu_busy(threads)

    def to_dict(self) -> dict[str, Any]:
        # an unprobed kernel, absent E-cores and unrefitted prompt rates are left out, so a
        # spec reads and writes as before they existed
        return {k: v for k, v in dataclasses.asdict(self).items()
                if not (k in KERNEL_FIELDS + PROMPT_FIELDS and v is None)
                and not (k in HYBRID_FIELDS and not self.cpu_e_cores)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | None = None) -> PlatformSpec:
        names = [f.name for f in dataclasses.fields(cls)]
        required = [n for n in names if n != "source" and n not in OVERHEAD_FIELDS
                    and n not in KERNEL_FIELDS + PROMPT_FIELDS and n not in HYBRID_FIELDS]
        if not isinstance(data, Mapping):
            raise CopeInputError("expected a JSON object", source=source, field="spec")
        missing = [n for n in required if n not in data]
        if missing:
            raise CopeInputError(f"missing keys {missing}", source=source, field="spec")
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise CopeInputError(f"unknown keys {unknown}; expected {names}", source=source,
                                 field="spec")
        try:
            return cls(**{n: data[n] for n in names if n in data})
        except CopeInputError as exc:
            raise CopeInputError(exc.detail, source=source, field=exc.field) from None


#: Spec fields beyond the peak numbers: optional in a JSON spec (defaults as above).
OVERHEAD_FIELDS = ("gpu_launch_us", "gpu_sync_us", "link_latency_us", "cpu_dispatch_us",
                   "link_efficiency", "gpu_efficiency", "cpu_efficiency",
                   "gpu_kernels_per_expert_group", "gpu_kernels_per_block", "cpu_barrier_us",
                   "cpu_barrier_us_per_thread")
#: A hybrid part's E-cores: optional, none by default.
HYBRID_FIELDS = ("cpu_e_cores", "cpu_e_flops_per_thread", "cpu_e_bandwidth_per_thread")
#: The probed kernel's rates: optional, None when not probed.
KERNEL_FIELDS = ("cpu_kernel_bandwidth", "cpu_kernel_bandwidth_per_thread",
                 "cpu_kernel_cached_per_thread")
#: The prompt model's refitted rates: optional, None when not refitted.
PROMPT_FIELDS = ("host_copy_bandwidth", "gpu_prompt_efficiency")
LATENCY_FIELDS = ("gpu_launch_us", "gpu_sync_us", "link_latency_us", "cpu_dispatch_us",
                  "cpu_barrier_us", "cpu_barrier_us_per_thread")


def roofline_only(spec: PlatformSpec) -> PlatformSpec:
    """``spec`` without overheads and at full efficiency: the pure roofline of the peaks."""
    return dataclasses.replace(spec, gpu_launch_us=0.0, gpu_sync_us=0.0, link_latency_us=0.0,
                               cpu_dispatch_us=0.0, cpu_barrier_us=0.0,
                               cpu_barrier_us_per_thread=0.0, link_efficiency=1.0,
                               gpu_efficiency=1.0, cpu_efficiency=1.0)


def spec_from_parts(gpu: parts.GpuPart, link: parts.LinkPart, cpu: parts.CpuPart,
                    memory: parts.MemoryPart, *, name: str | None = None) -> PlatformSpec:
    """The platform of these parts. A measured bandwidth (``measured`` memory, or a CPU whose
    per-core bandwidth was measured) is what the analytic model should *reach*, so it enters
    divided by the CPU efficiency the model multiplies every CPU peak by."""
    mem_bw, core_bw = host_bandwidths(cpu, memory)
    return with_kernel(PlatformSpec(
        name=name or f"{gpu.name}+{link.name}+{cpu.name}", gpu_name=gpu.name,
        gpu_flops=gpu.flops, gpu_bandwidth=gpu.bandwidth, link_name=link.name,
        link_bandwidth=link.bandwidth, cpu_name=cpu.name, cpu_cores=cpu.cores,
        cpu_flops_per_thread=cpu.flops_per_thread, cpu_bandwidth=mem_bw,
        cpu_bandwidth_per_thread=core_bw, **e_cores(cpu)), cpu.kernel)


def with_card(spec: PlatformSpec, gpu: parts.GpuPart, link: parts.LinkPart) -> PlatformSpec:
    """``spec``'s host (CPU, memory, overheads) with another card in another slot: a second
    card of the same machine, when only the first card's platform is known (a profile's)."""
    return dataclasses.replace(spec, name=f"{gpu.name}+{link.name}+{spec.cpu_name}",
                               gpu_name=gpu.name, gpu_flops=gpu.flops,
                               gpu_bandwidth=gpu.bandwidth, link_name=link.name,
                               link_bandwidth=link.bandwidth, gpu_prompt_efficiency=None)


def e_cores(cpu: parts.CpuPart) -> dict[str, Any]:
    """A hybrid part's E-cores as :class:`PlatformSpec` fields (none where their rates are not
    known)."""
    if not (cpu.e_cores and cpu.e_flops_per_thread and cpu.e_core_bandwidth):
        return {}
    return {"cpu_e_cores": cpu.e_cores, "cpu_e_flops_per_thread": cpu.e_flops_per_thread,
            "cpu_e_bandwidth_per_thread": cpu.e_core_bandwidth}


def host_bandwidths(cpu: parts.CpuPart, memory: parts.MemoryPart) -> tuple[float, float]:
    """The memory's and one core's bandwidth as the analytic model takes them (a measured one
    divided by the CPU efficiency the model multiplies every CPU peak by)."""
    eff = PlatformSpec.cpu_efficiency
    return (memory.bandwidth / eff if memory.measured else memory.bandwidth,
            cpu.per_core_bandwidth / eff if cpu.measured else cpu.per_core_bandwidth)


def with_kernel(spec: PlatformSpec, rates: tuple[float, float, float] | None) -> PlatformSpec:
    """``spec`` with a probed kernel's (one-thread, all-threads, cached) bytes/s
    (:data:`KERNEL_FIELDS`; ``CpuPart.kernel``), each divided by the CPU efficiency as
    :func:`host_bandwidths` divides; ``spec`` itself when not probed."""
    if rates is None:
        return spec
    eff = PlatformSpec.cpu_efficiency
    one, every, cached = rates
    return dataclasses.replace(spec, cpu_kernel_bandwidth=every / eff,
                               cpu_kernel_bandwidth_per_thread=one / eff,
                               cpu_kernel_cached_per_thread=cached / eff)


def platform_spec(gpu: str, *, link: str | None = None, cpu: str = DEFAULT_CPU) -> PlatformSpec:
    """Combine catalog entries: ``platform_spec("rtx4090")`` uses its usual link and the default
    CPU with its usual memory. Any catalog GPU and CPU (or part file); the link as named (no
    negotiation with the card's own interface: :func:`cope_core.machine.compose_machine` does
    that)."""
    g = parts.gpu_part(gpu)
    c = parts.cpu_part(cpu)
    return spec_from_parts(g, parts.link_part(link or g.link), c, parts.memory_part(c.memory))


def load_spec(path: str | Path) -> PlatformSpec:
    """A user-given platform spec: a JSON object with the fields of :class:`PlatformSpec`."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise CopeInputError("file not found", source=str(p)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CopeInputError(f"not a readable JSON spec ({exc})", source=str(p)) from None
    return dataclasses.replace(PlatformSpec.from_dict(data, source=str(p)), source="user")


def resolve_platform(name: str, *, link: str | None = None, cpu: str = DEFAULT_CPU) -> PlatformSpec:
    """A catalog GPU name, a GPU part file (JSON or TOML with ``kind``), or the path of a JSON
    spec file (:class:`PlatformSpec`'s fields)."""
    if name.endswith((".json", ".toml")) or Path(name).exists():
        if not _is_part_file(name):
            return load_spec(name)
    return platform_spec(name, link=link, cpu=cpu)  # raises with the nearest catalog names


def _is_part_file(path: str) -> bool:
    """A part file names its ``kind``; a spec file has :class:`PlatformSpec`'s fields."""
    if path.lower().endswith(".toml"):
        return True
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False                    # load_spec says what is wrong with it
    return isinstance(data, dict) and "kind" in data
