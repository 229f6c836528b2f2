"""The host's dot-product kernel (issue 41, validation item 5): the probe, the spec fields it
fills, and how the analytic CPU expert prices a probed host (hand-worked), with an unprobed
host priced as before."""
from __future__ import annotations

import dataclasses

import pytest

from cope_core.errors import CopeInputError
from cope_core.estimate.refit import HOST_EXPERTS, scaled_spec
from cope_core.geometry import ExpertTensors, ModelGeometry
from cope_core.machine import compose_machine
from cope_core.mechanisms import this_machine as tm
from cope_core.platforms import KERNEL_FIELDS, PlatformSpec, with_kernel
from cope_core.profile.analytic import consts, cpu_expert

Q8 = ExpertTensors("Q8_0", "Q8_0", "Q8_0", 1000, 1000, 1000)
Q46 = ExpertTensors("Q4_K", "Q4_K", "Q6_K", 500, 500, 700)
GEO = ModelGeometry(name="hand", n_layers=2, n_experts=4, top_k=2, hidden=256,
                    expert_intermediate=1, dtype_bytes=2, n_shared_experts=0, dense_layers=0,
                    n_heads=1, n_kv_heads=1, head_dim=4, vocab=10, non_expert_bytes=1000,
                    weight_format="Q4_K_M", expert_layers=(Q8, Q46), non_expert_params=2000)
BARE = PlatformSpec(name="h", gpu_name="g", gpu_flops=1e12, gpu_bandwidth=1e11, link_name="l",
                    link_bandwidth=1e10, cpu_name="c", cpu_cores=2, cpu_flops_per_thread=1e15,
                    cpu_bandwidth=40e9, cpu_bandwidth_per_thread=30e9, cpu_efficiency=0.5)
# one thread streams 8e9 bytes/s through the kernel from memory, two threads 12e9; one thread
# dots 10e9 bytes/s from its cache (the spec holds measured / efficiency, as a bandwidth)
PROBED = dataclasses.replace(BARE, cpu_kernel_bandwidth_per_thread=16e9,
                             cpu_kernel_bandwidth=24e9, cpu_kernel_cached_per_thread=20e9)


def test_unprobed_host_streams_each_type_as_before():
    c = consts(BARE, 1)
    # memory 20e9 after efficiency; one thread 15e9 times the type's published ratio
    want = (3000 / min(20e9, 0.95 * 15e9) + 1000 / min(20e9, 0.65 * 15e9)
            + 700 / min(20e9, 0.60 * 15e9)) / 2 * 1e6
    assert cpu_expert(GEO, c) == pytest.approx(want, rel=1e-12)
    assert "cpu_kernel_bandwidth" not in BARE.to_dict()


@pytest.mark.parametrize("threads,stream,dot", [
    (1, 8e9, 10e9 / 0.95),      # one thread's kernel rate; the cache rate as a 16-bit rate
    (2, 12e9, 20e9 / 0.95),     # the all-threads rate (below 2 x 8e9 and the memory's 20e9)
    (8, 12e9, 20e9 / 0.95),     # more threads than cores count as the cores
])
def test_a_probed_host_streams_at_the_kernels_rate_or_the_types_cache_rate(threads, stream,
                                                                           dot):
    c = consts(PROBED, threads)
    assert c.cpu_stream_bw == pytest.approx(stream) and c.cpu_dot_bw == pytest.approx(dot)
    want = (3000 / min(stream, 0.95 * dot) + 1000 / min(stream, 0.65 * dot)
            + 700 / min(stream, 0.60 * dot)) / 2 * 1e6
    assert cpu_expert(GEO, c) == pytest.approx(want, rel=1e-12)


def test_the_memory_caps_a_probed_kernel():
    spec = dataclasses.replace(PROBED, cpu_bandwidth=10e9)      # 5e9 after efficiency
    assert consts(spec, 2).cpu_stream_bw == pytest.approx(5e9)
    assert spec.cpu_kernel_bw(1) == 10e9


def test_kernel_fields_round_trip_and_are_checked():
    d = PROBED.to_dict()
    assert {k: d[k] for k in KERNEL_FIELDS} == {"cpu_kernel_bandwidth": 24e9,
                                                "cpu_kernel_bandwidth_per_thread": 16e9,
                                                "cpu_kernel_cached_per_thread": 20e9}
    assert PlatformSpec.from_dict(d) == PROBED
    assert PlatformSpec.from_dict(BARE.to_dict()) == BARE
    with pytest.raises(CopeInputError, match="cpu_kernel_bandwidth"):
        dataclasses.replace(PROBED, cpu_kernel_bandwidth=-1.0)
    k = with_kernel(BARE, (8e9, 12e9, 10e9))     # measured rates enter over 0.8, as bandwidths
    assert (k.cpu_kernel_bandwidth, k.cpu_kernel_bandwidth_per_thread,
            k.cpu_kernel_cached_per_thread) == (12e9 / 0.8, 8e9 / 0.8, 10e9 / 0.8)
    assert with_kernel(BARE, None) is BARE


def test_the_host_throughput_knob_scales_a_probed_kernel_and_leaves_an_unprobed_one():
    s = scaled_spec(PROBED, [HOST_EXPERTS.at(2)], [0.5], 2)
    assert (s.cpu_kernel_bandwidth, s.cpu_kernel_bandwidth_per_thread,
            s.cpu_kernel_cached_per_thread, s.cpu_bandwidth) == (12e9, 8e9, 10e9, 20e9)
    assert scaled_spec(PROBED, [HOST_EXPERTS.at(2)], [0.5], 1) == PROBED
    assert scaled_spec(BARE, [HOST_EXPERTS], [0.5], 1).cpu_kernel_bandwidth is None


def test_this_machine_keeps_the_kernels_rates_as_measured_facts():
    this = tm.this_machine(gpu=True, cpu=True, memory=True, run=lambda cmd: None,
                           probe=lambda s: (12e9, 9e9, 2, "a fake probe"), torch_probe=False,
                           kernel_probe=lambda s: ((5e9, 8e9, 7e9), 2, "a fake kernel"))
    assert this.cpu.kernel == (5e9, 8e9, 7e9)
    facts = {f.quantity: f for f in this.facts if f.part == "cpu"}
    f = facts["dot-product kernel from memory, 2 threads"]
    assert (f.value, f.how) == ("8.0 GB/s of 8-bit weights", "measured")
    assert "_weight_int8pack_mm" in f.source and "a fake kernel" in f.source
    m = compose_machine(gpu="this", cpu="this", memory="this", this=this)
    from cope_core.estimate.cpu_only import host_spec
    c = consts(host_spec(m.cpu, m.memory), 2)
    assert c.cpu_stream_bw == pytest.approx(8e9)         # as measured, not times 0.8
    assert c.cpu_dot_bw == pytest.approx(2 * 7e9 / 0.95)


def test_a_torch_without_the_kernel_says_so():
    this = tm.this_machine(gpu=False, cpu=True, memory=False,
                           probe=lambda s: (12e9, 9e9, 2, "a fake probe"),
                           kernel_probe=lambda s: "torch 2.2 has no aten._weight_int8pack_mm")
    assert this.cpu.kernel is None
    f = next(f for f in this.facts if f.quantity == "dot-product kernel")
    assert (f.value, f.how) == ("not probed", "detected") and "torch 2.2" in f.source


def test_a_stand_in_probe_has_no_kernel():
    this = tm.this_machine(gpu=False, cpu=True, memory=True,
                           probe=lambda s: (12e9, 9e9, 2, "a fake probe"))
    assert this.cpu.kernel is None
    assert not any("dot-product" in f.quantity for f in this.facts)


def test_the_kernel_probe_here():
    """On this machine, for real: short, and within physical bounds."""
    from cope_core.mechanisms.probe import probe_host_kernel
    r = probe_host_kernel(seconds=0.2, buffer_bytes=16 << 20, threads=2)
    assert r.threads == 2 and r.buffer_bytes == 16 << 20 and r.samples >= 9
    assert 1e8 < r.one_thread <= r.all_threads < 1e13
    assert r.one_thread <= r.cached < 1e13
