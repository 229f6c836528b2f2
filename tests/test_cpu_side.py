"""The CPU side of the analytic model (docs/design.md#the-cpu-side): threads beyond the cores add
nothing, ggml's thread barrier grows with the threads, and the catalog's per-core bandwidths
follow Little's law from the sources their rows state."""
from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cope_core import parts
from cope_core.estimate import cpu_only
from cope_core.models import resolve_model
from cope_core.platforms import PlatformSpec, roofline_only
from cope_core.profile import analytic as an

SPEC = PlatformSpec(name="t", gpu_name="g", gpu_flops=1e14, gpu_bandwidth=1e12, link_name="l",
                    link_bandwidth=3e10, cpu_name="c", cpu_cores=4, cpu_flops_per_thread=1e11,
                    cpu_bandwidth=6e10, cpu_bandwidth_per_thread=1e10)


def test_the_barrier_is_pr_9598s_measurement_and_free_for_one_thread():
    # llama.cpp PR #9598: 1.96 µs at 4 threads, 3.04 µs at 8 on an EPYC
    assert SPEC.cpu_barrier(4) == pytest.approx(1.96)
    assert SPEC.cpu_barrier(8) == pytest.approx(3.04)
    assert SPEC.cpu_barrier(1) == 0.0
    assert roofline_only(SPEC).cpu_barrier(64) == 0.0


def test_threads_beyond_the_cores_add_no_bandwidth_or_flops():
    assert SPEC.cpu_busy(8) == SPEC.cpu_busy(4) == 4 and SPEC.cpu_busy(0) == 1
    assert SPEC.cpu_bw(2) == 2e10 and SPEC.cpu_bw(8) == SPEC.cpu_bw(4) == 4e10
    assert SPEC.cpu_flops(8) == SPEC.cpu_flops(4) == 4e11
    assert SPEC.cpu_kernel_cached(16) == SPEC.cpu_kernel_cached(4) == 4e10


def test_the_barrier_term_of_a_cpu_only_token_is_exact():
    g = resolve_model("qwen3-30b-a3b", "Q4_K_M")
    for t in (1, 2, 8, 64):
        c = cpu_only._on_host(an.consts(SPEC, t))
        free = c._replace(barrier=0.0)
        extra = cpu_only.host_tpot(g, c, 512) - cpu_only.host_tpot(g, free, 512)
        blocks = g.n_layers + g.dense_layers
        assert extra == pytest.approx(blocks * cpu_only.BARRIERS_PER_BLOCK * SPEC.cpu_barrier(t))


@given(st.integers(min_value=4, max_value=256))
def test_past_saturation_more_threads_make_a_token_slower(t):
    # the socket saturates at 6 threads (60 GB/s over 10 GB/s a core), the cores at 4
    g = resolve_model("qwen3-30b-a3b", "Q4_K_M")
    assert cpu_only.spec_tpot(g, SPEC, t + 1, 512) > cpu_only.spec_tpot(g, SPEC, t, 512)


def test_draws_perturb_the_barrier_like_the_other_latencies():
    import numpy as np
    c = an.consts(SPEC, 8)
    d = an.drawn_consts(c, 500, np.random.default_rng(0))
    assert d.barrier.shape == (500,) and abs(np.log(d.barrier / c.barrier).std()
                                             - an.LATENCY_SPREAD) < 0.05


def test_old_specs_read_with_the_barrier_defaults():
    old = {k: v for k, v in SPEC.to_dict().items()
           if k not in ("cpu_barrier_us", "cpu_barrier_us_per_thread")}
    assert PlatformSpec.from_dict(old) == SPEC
    assert PlatformSpec.from_dict(SPEC.to_dict() | {"cpu_barrier_us": 0}).cpu_barrier(2) \
        == pytest.approx(0.54)
    assert dataclasses.replace(SPEC, cpu_barrier_us_per_thread=0.0).cpu_barrier(64) == 0.88


LITTLE = re.compile(r"Little's law: (\d+) .*? x 64 B / ([\d.]+) ns")


def test_catalog_per_core_bandwidths_follow_littles_law_as_their_rows_state():
    derived = 0
    for c in parts.cpus().values():
        m = LITTLE.search(c.note)
        if m is None or "kept as assumed" in c.note:
            continue
        lines, ns = int(m.group(1)), float(m.group(2))
        assert c.per_core_bandwidth == pytest.approx(lines * 64 / (ns * 1e-9), rel=0.005), c.name
        derived += 1
    assert derived >= 30          # every Zen row, Sapphire and Granite Rapids
    # worked: 32 lines x 64 B / 112.34 ns = 18.2 GB/s for a Zen server core
    assert parts.cpu_part("epyc-7773x").per_core_bandwidth == pytest.approx(18.2e9)
    # the default CPU keeps the value the paper's cells were fitted with
    assert parts.cpu_part("xeon-gold-6430").per_core_bandwidth == 12e9


# --- hybrid parts: threads beyond the P-cores land on the E-cores -------------------------------
HYBRID = dataclasses.replace(SPEC, cpu_cores=6, cpu_flops_per_thread=3.7e9 * 32,
                             cpu_bandwidth=1e12, cpu_bandwidth_per_thread=20e9, cpu_e_cores=4,
                             cpu_e_flops_per_thread=2.8e9 * 16, cpu_e_bandwidth_per_thread=15e9)


def test_threads_fill_the_p_cores_then_the_e_cores_then_smt_siblings():
    assert [HYBRID.cpu_placed(t) for t in (1, 6, 8, 10, 16)] == \
        [(1, 0), (6, 0), (6, 2), (6, 4), (6, 4)]
    # E-cores whose rates are unknown take no thread: a thread beyond the cores is a sibling
    assert dataclasses.replace(HYBRID, cpu_e_bandwidth_per_thread=None).cpu_placed(10) == (6, 0)


def test_the_slowest_core_paces_every_thread():
    # ggml gives every thread an equal share of a MoE product's rows at decode
    assert HYBRID.cpu_flops(6) == pytest.approx(6 * 118.4e9)
    assert HYBRID.cpu_flops(10) == pytest.approx(10 * 44.8e9)       # slower than 6 P-cores
    assert HYBRID.cpu_bw(6) == pytest.approx(120e9) and HYBRID.cpu_bw(10) == pytest.approx(150e9)
    assert HYBRID.cpu_kernel_cached(8) == pytest.approx(8 * 15e9)


def test_a_hybrid_spec_round_trips_and_a_plain_one_has_no_e_core_keys():
    assert PlatformSpec.from_dict(HYBRID.to_dict()) == HYBRID
    assert not any(k.startswith("cpu_e_") for k in SPEC.to_dict())
    from cope_core.errors import CopeInputError
    with pytest.raises(CopeInputError) as e:
        dataclasses.replace(SPEC, cpu_e_cores=-1)
    assert e.value.field == "spec.cpu_e_cores"


def test_catalog_hybrid_parts_price_their_e_cores():
    from cope_core.platforms import platform_spec
    s = platform_spec("rtx4090", cpu="core-i5-12600k")
    assert (s.cpu_e_cores, s.cpu_e_flops_per_thread, s.cpu_e_bandwidth_per_thread) == \
        (4, 2.8e9 * 16, 15e9)
    assert s.cpu_flops(10) < s.cpu_flops(6)
    assert platform_spec("rtx4090", cpu="core-ultra-9-285k").cpu_e_flops_per_thread == 3.2e9 * 32


def test_e_core_columns_come_all_or_none(tmp_path):
    from cope_core.errors import CopeInputError
    from cope_core.parts.catalog import read_rows
    head = ("name,label,vendor,cores,e_cores,base_ghz,boost_ghz,simd,fma_units,fma_bits,memory,"
            "per_core_gbs,e_base_ghz,e_flop_per_cycle,e_core_gbs,source,note\n")
    path = tmp_path / "cpus.csv"
    path.write_text(head + "x,X,intel,6,4,3.7,4.9,avx2,2,256,ddr5-4800x2,20,2.8,,15,s,\n")
    with pytest.raises(CopeInputError) as e:
        read_rows("cpu", path)
    assert e.value.field == "e_cores" and "cpus.csv" in str(e.value)
    path.write_text(head + "x,X,intel,6,4,3.7,4.9,avx2,2,256,ddr5-4800x2,20,2.8,16,15,s,\n")
    (row,) = read_rows("cpu", path)
    assert (row["e_base_ghz"], row["e_flop_per_cycle"], row["e_core_gbs"]) == (2.8, 16, 15.0)
