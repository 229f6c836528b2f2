"""``this`` machine (issue 40): CPU and GPU detection from what the OS and drivers print, the
host memory probe, and a machine composed of detected and measured parts, every number said to
be detected, measured or assumed."""
from __future__ import annotations

import os

import pytest

from cope_core.errors import CopeInputError
from cope_core.machine import compose_machine
from cope_core.mechanisms import this_machine as tm
from cope_core.profile.analytic import consts

# two sockets x two cores x two hyperthreads; this process may run on CPUs 0-5
CPUINFO = "\n\n".join(
    f"processor\t: {i}\nmodel name\t: AMD Ryzen 7 5700X 8-Core Processor\n"
    f"physical id\t: {i // 4}\ncore id\t\t: {i % 2}\ncpu MHz\t\t: 3400.000\n"
    "flags\t\t: fpu sse avx avx2 fma"
    for i in range(8))


def test_physical_cores_are_distinct_socket_core_pairs_of_the_allowed_cpus():
    info = tm.read_cpuinfo(CPUINFO, allowed={0, 1, 2, 3, 4, 5})
    # CPUs 0-3 are socket 0's cores 0,1,0,1; CPUs 4,5 socket 1's cores 0,1
    assert (info.logical, info.cores, info.e_cores) == (6, 4, 0)
    assert info.model == "AMD Ryzen 7 5700X 8-Core Processor" and info.mhz == 3400.0
    assert {"avx2", "fma"} <= info.flags


def test_a_hybrid_parts_threads_run_on_its_p_cores():
    info = tm.read_cpuinfo(CPUINFO, allowed=set(range(8)), p_cpus={0, 1, 2, 3})
    assert (info.cores, info.e_cores) == (2, 2)


@pytest.mark.parametrize("model,name", [
    ("AMD Ryzen 7 5700X 8-Core Processor", "ryzen-7-5700x"),
    ("AMD Ryzen 7 5800X3D 8-Core Processor", "ryzen-7-5800x3d"),
    ("13th Gen Intel(R) Core(TM) i9-13900K", "core-i9-13900k"),
    ("Intel(R) Core(TM) Ultra 9 285K", "core-ultra-9-285k"),
    ("Intel(R) Xeon(R) Gold 6430", "xeon-gold-6430"),
    ("AMD EPYC", None),
])
def test_cpu_model_names_match_the_catalog(model, name):
    from cope_core.parts import cpus
    from cope_core.parts.catalog import key
    assert tm.match_catalog(model, {n: key(c.label) for n, c in cpus().items()}) == name


def _smi(text: str | None):
    def run(cmd):
        return text if cmd[0] == "nvidia-smi" else None
    return run


@pytest.mark.parametrize("line,name,gib", [
    ("NVIDIA GeForce RTX 4060 Ti, 16380, 4, 8", "rtx4060ti-16gb", 16380 / 1024),
    ("NVIDIA GeForce RTX 4060 Ti, 8188, 4, 8", "rtx4060ti-8gb", 8188 / 1024),
    ("NVIDIA GeForce RTX 3060, 12288, 4, 16", "rtx3060-12gb", 12.0),
    ("NVIDIA A100-SXM4-80GB, 81920, 4, 16", "a100-80gb", 80.0),
    ("NVIDIA GeForce RTX 4070 Ti SUPER, 16376, 4, 16", "rtx4070ti-super", 16376 / 1024),
])
def test_nvidia_smi_gpus_take_catalog_numbers_and_their_own_memory(line, name, gib):
    gpu, facts = tm.this_gpu(tm.detect_gpus(_smi(line + "\n"), torch_probe=False))
    assert gpu.name == f"this ({name})" and gpu.memory_bytes == gib * 2**30
    assert {f.how for f in facts} >= {"detected", "catalog"}


def test_rocm_smi_gpus():
    text = ('{"card0": {"Card Series": "Radeon RX 7900 XTX", "Card Vendor": "Advanced Micro '
            'Devices, Inc. [AMD/ATI]", "VRAM Total Memory (B)": "25753026560"}}')
    found = tm.detect_gpus(lambda cmd: text if cmd[0] == "rocm-smi" else None, torch_probe=False)
    assert found == [tm.GpuInfo("Radeon RX 7900 XTX", 25753026560.0, None, None, "rocm-smi")]
    gpu, _ = tm.this_gpu(found)
    assert gpu.name == "this (rx7900xtx)" and gpu.link == "pcie4x16"   # PCIe from the catalog


def test_a_gpu_the_catalog_lacks_is_one_line():
    with pytest.raises(CopeInputError, match="not in the catalog; give --gpu NAME"):
        tm.this_gpu(tm.detect_gpus(_smi("NVIDIA Mystery 9000, 4096, 4, 16\n"),
                                   torch_probe=False))


def _fake_this(gpu_line: str | None = None) -> tm.ThisMachine:
    # a probe that measured 12 GB/s with every thread and 9 GB/s with one
    return tm.this_machine(gpu=True, cpu=True, memory=True, run=_smi(gpu_line),
                           probe=lambda s: (12e9, 9e9, 2, "a fake probe"), torch_probe=False)


def test_no_gpu_makes_a_cpu_only_machine_and_says_so():
    this = _fake_this()
    m = compose_machine(gpu="this", cpu="this", memory="this", link="4x16", this=this)
    assert m.cpu_only and m.spec is None and m.vram_bytes == 0
    hows = {(f.part, f.quantity): f.how for f in m.facts}
    assert hows[("gpu", "GPU")] == "detected"
    assert hows[("memory", "read bandwidth")] == "measured"
    assert hows[("cpu", "bandwidth of one core")] == "measured"
    assert hows[("memory", "achieved fraction")] == "assumed"
    assert "none found: this machine is CPU-only" in m.describe()
    assert "probe_host_memory, 2 threads; a fake probe" in m.describe()


def test_measured_bandwidths_are_what_the_analytic_model_reaches():
    this = _fake_this("NVIDIA GeForce RTX 3090, 24576, 4, 16\n")
    m = compose_machine(gpu="this", cpu="this", memory="this", this=this)
    assert m.gpu.name == "this (rtx3090)" and m.link.name == "pcie4x16"
    c = consts(m.spec, threads=1)
    # the model multiplies CPU peaks by cpu_efficiency: a measured bandwidth must come out as is
    assert c.cpu_mem_bw == pytest.approx(12e9) and c.cpu_lane_bw == pytest.approx(9e9)
    assert m.threads == m.cpu.cores == tm.detect_cpu().cores


def test_this_machine_here():
    """On this machine, for real: the OS's cores and a short probe (no GPU is assumed or
    required: whatever is found is reported)."""
    from cope_core.mechanisms.probe import probe_host_memory
    info = tm.detect_cpu()
    assert 1 <= info.cores <= info.logical <= len(os.sched_getaffinity(0))
    r = probe_host_memory(seconds=0.2, buffer_bytes=64 << 20)
    assert r.buffer_bytes == 64 << 20 and r.samples >= 6
    assert 1e8 < r.one_thread <= r.all_threads < 1e13       # 0.1 GB/s .. 10 TB/s
