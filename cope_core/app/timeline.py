"""One MoE layer of an execution strategy drawn as a timeline from a profile's atomic costs.

The placement follows the atomic-op simulation (docs/design.md#the-estimators) literally: operations
that the strategy overlaps start together, serial ones follow each other, so the timeline's end
equals that estimator's layer cost. The activation copy ``A`` (to the CPU and the result back) is
drawn as two halves on the device->host and host->device lanes around the CPU work. Like the
formula, the drawing does not make copies on one link wait for each other.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..matrix import EXECUTIONS, Execution
from ..profile.data import OperatingPoint
from ..profile.pricing import cost_selected_split

CPU, GPU, H2D, D2H = "CPU", "GPU", "host→device", "device→host"
LANES = (CPU, GPU, H2D, D2H)


@dataclass(frozen=True)
class Segment:
    """One operation on one lane, in microseconds from the start of the layer."""

    lane: str
    label: str
    start_us: float
    end_us: float

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class Timeline:
    """A layer's operations for one strategy and hit count.

    Attributes
    ----------
    name : str
        Strategy name shown in the figure (an execution id, or a layer-partition side).
    hits, cpu, staged : int
        ``h`` resident experts, ``c`` misses on the CPU, ``u`` misses copied to the GPU.
    segments : tuple of Segment
    measured_us : float or None
        The profile's whole-layer schedule cost for the same case (COPE's number), to compare
        with the composed end.
    """

    name: str
    hits: int
    cpu: int
    staged: int
    segments: tuple[Segment, ...]
    measured_us: float | None = None

    @property
    def total_us(self) -> float:
        return max((s.end_us for s in self.segments), default=0.0)


class _Builder:
    def __init__(self) -> None:
        self.segments: list[Segment] = []

    def add(self, lane: str, label: str, start: float, duration: float) -> float:
        self.segments.append(Segment(lane, label, float(start), float(start + duration)))
        return float(start + duration)

    def cpu_chain(self, op: OperatingPoint, n: int, start: float = 0.0) -> float:
        """Activation to the CPU, ``n`` experts there, result back; returns the end time."""
        half = op.act_copy / 2
        t = self.add(D2H, "activation to CPU (A/2)", start, half)
        t = self.add(CPU, f"C[{n}] CPU experts", t, op.atomic["cpu_expert"][n])
        return self.add(H2D, "result to GPU (A/2)", t, half)

    def finish(self, op: OperatingPoint, t: float) -> None:
        t = self.add(GPU, "sync (F)", t, op.sync)
        self.add(GPU, "merge (M)", t, op.merge)


def execution_timeline(op: OperatingPoint, execution: Execution | str, hits: int) -> Timeline:
    """The timeline of ``execution`` at ``hits`` hits (``m = top_k - hits`` misses).

    Parameters
    ----------
    op : OperatingPoint
        Resolved costs of one operating point (``Profile.resolve``).
    execution : Execution or str
    hits : int
        ``h`` in ``[0, top_k]``.

    Returns
    -------
    Timeline
        Its ``total_us`` equals the atomic-op simulation's layer cost for the same case.
    """
    e = Execution(execution)
    k = op.top_k
    if not 0 <= hits <= k:
        raise ValueError(f"hits must be in [0, {k}], got {hits}")
    m = k - hits
    R, S = op.atomic["gpu_expert"], op.atomic["stage"]
    G = op.atomic["staged_gpu_expert"]
    b = _Builder()
    ei = EXECUTIONS.index(e)
    if e is Execution.PARALLEL:
        c, u = m, 0
        gpu_end = b.add(GPU, f"R[{hits}] resident experts", 0.0, R[hits])
        cpu_end = b.cpu_chain(op, m)
        b.finish(op, max(gpu_end, cpu_end))
    elif e is Execution.WAIT_THEN_GPU:
        c, u = 0, m
        t = b.add(H2D, f"S[{m}] stage weights", 0.0, S[m])
        t = b.add(GPU, f"R[{hits}] resident experts", t, R[hits])
        t = b.add(GPU, f"G[{m}] staged experts", t, G[m])
        b.finish(op, t)
    elif e is Execution.READY_FIRST:
        c, u = 0, m
        gpu_end = b.add(GPU, f"R[{hits}] resident experts", 0.0, R[hits])
        copy_end = b.add(H2D, f"S[{m}] stage weights", 0.0, S[m])
        t = b.add(GPU, f"G[{m}] staged experts", max(gpu_end, copy_end), G[m])
        b.finish(op, t)
    else:
        split, _ = cost_selected_split(op)
        c = int(split[hits])
        u = m - c
        gpu_end = b.add(GPU, f"R[{hits}] resident experts", 0.0, R[hits])
        cpu_end = b.cpu_chain(op, c)
        copy_end = b.add(H2D, f"S[{u}] stage weights", 0.0, S[u])
        t = b.add(GPU, f"G[{u}] staged experts", max(gpu_end, cpu_end, copy_end), G[u])
        b.finish(op, t)
    measured = float(op.schedule[ei, hits, c])
    return Timeline(e.value, hits, c, u, tuple(b.segments), measured)


def layer_partition_timelines(op: OperatingPoint) -> tuple[Timeline, Timeline]:
    """The baseline's two kinds of layer: all ``top_k`` experts on the CPU (``C[k] + A + F +
    M``) or all resident on the GPU (``R[k] + M``), with the profile's whole-layer costs."""
    k = op.top_k
    cpu = _Builder()
    cpu.finish(op, cpu.cpu_chain(op, k))
    gpu = _Builder()
    t = gpu.add(GPU, f"R[{k}] resident experts", 0.0, op.atomic["gpu_expert"][k])
    gpu.add(GPU, "merge (M)", t, op.merge)
    return (Timeline("layer_partition · CPU layer", 0, k, 0, tuple(cpu.segments), op.cpu_layer),
            Timeline("layer_partition · GPU layer", k, 0, 0, tuple(gpu.segments), op.gpu_layer))
