"""The parts catalog (issue 40): GPUs, CPUs, host memory and links as data with a source per
number (``data/*.csv``, listed in docs/parts.md), looked up by name, with nearest-name
suggestions, and parts the catalog lacks read from a user's part file. Machines are composed
from parts by :func:`cope_core.machine.compose_machine`."""
from .catalog import (
    cpu_part,
    cpus,
    gpu_part,
    gpus,
    link_between,
    link_part,
    memory_part,
    names,
    read_part_file,
    search,
    suggest,
)
from .records import KINDS, CpuPart, Fact, GpuPart, LinkPart, MemoryPart, Part

__all__ = ["KINDS", "CpuPart", "Fact", "GpuPart", "LinkPart", "MemoryPart", "Part", "cpu_part",
           "cpus", "gpu_part", "gpus", "link_between", "link_part", "memory_part", "names",
           "read_part_file", "search", "suggest"]
