"""llama.cpp's --fit ported (cope_core/llamacpp/placement/fit.py) and device memory as llama.cpp
counts it (llamacpp_vram.py): hand-worked cases, a brute-force reference of the search, and the
real llama.cpp b11434 with its Vulkan backend on Mesa's software device (lavapipe): the port's
placement equals llama-fit-params' at several margins, and the model and KV buffers equal what
llama-completion -v allocates. Timing on the software device says nothing about a GPU: no speed
is scored here."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_tools import CACHE, missing_runtime, write_tiny_moe

from cope_core.llamacpp.placement.fit import ALL_EXPERTS, _Layers, _placement, fit
from cope_core.llamacpp.placement.vram import (
    LlamaModel,
    MiB,
    Placement,
    compute_estimate,
    device_memory,
    host_model_bytes,
    kv_bytes,
    read_llama_model,
)

VK = CACHE / "llama.cpp-b11434-vulkan"
#: the Vulkan buffer alignment does not move this model's bytes (every tensor is a multiple)
ALIGNMENT = 256
#: the compute buffer per placement against what llama.cpp reserves: measured on four tiny
#: shapes at contexts 1024-8192, the rule is within 2.02 MiB except where the last block's
#: experts are partly in host memory (4 MiB: the graph allocator's free blocks, not modelled)
COMPUTE_TOLERANCE_MIB = 4.0
#: a second MoE shape (3 blocks, 32 narrow experts: the expert tensors are 4x the FFN's
#: activations, where the default shape's are 2x) so no rule fitted to one shape passes
WIDE = dict(n_blocks=3, n_experts=32, hidden=256, inter=256, heads=4, kv_heads=2, head_dim=64,
            vocab=512)
#: (shape, -c, -fitt) where the port's line is not llama-fit-params': dense-only placements
#: (-ngl below every layer) at -c 4096, where the compute buffer with whole blocks in host
#: memory is 28.00 MiB and the rule's 26.02 (the K and V copies' share is inferred)
KNOWN_MISSES = {("tiny", 4096, 1980), ("tiny", 4096, 1990), ("tiny", 4096, 2020)}
SETUP = "bash scripts/runtimes.sh (its llama.cpp Vulkan section: scripts/runtimes_vulkan.sh)"


def synthetic(expert_bytes=(300, 300), n_ctx_train=8192) -> LlamaModel:
    """Two (or more) blocks with hand-picked bytes: attention 100, experts per projection."""
    tensors = [("token_embd.weight", 1000), ("output_norm.weight", 10),
               ("output.weight", 500)]
    for b, e in enumerate(expert_bytes):
        tensors += [(f"blk.{b}.attn_q.weight", 100)] + [
            (f"blk.{b}.ffn_{p}_exps.weight", e) for p in ("gate", "up", "down")]
    n = len(expert_bytes)
    return LlamaModel("synthetic", "qwen3moe", tuple(tensors), n, n_ctx_train, 8, 64, 100, 4,
                      2, 32, ((64, 64),) * n)


def mem(m, p, n_ctx=100):
    return device_memory(m, p, n_ctx, alignment=1, compute=0)


def test_device_memory_by_hand():
    m = synthetic()
    cells = 256 * (64 * 2 + 64 * 2)                  # 100 cells pad to 256, K and V in f16
    d = mem(m, Placement())
    assert (d.model, d.context, d.compute) == (10 + 500 + 2 * 1000, 2 * cells, 0)
    assert host_model_bytes(m, Placement()) == 1000  # the token embedding stays on the host
    assert mem(m, Placement(-1, (ALL_EXPERTS,))).model == 510 + 200
    assert mem(m, Placement(2)) == mem(m, Placement(2))
    assert (mem(m, Placement(2)).model, mem(m, Placement(2)).context) == (510 + 1000, cells)
    assert mem(m, Placement(1)).model == 510 and mem(m, Placement(1)).context == 0
    assert mem(m, Placement(0)).total == 0
    padded = device_memory(m, Placement(), 100, alignment=256, compute=0).model
    assert padded == 256 + 512 + 2 * (256 + 3 * 512)
    assert kv_bytes(m, [0], 257, "q8_0", "q4_0") == 512 * (68 + 36)
    tied = LlamaModel(**{**m.__dict__, "tensors": tuple(t for t in m.tensors
                                                        if t[0] != "output.weight")})
    assert mem(tied, Placement()).model == 10 + 1000 + 2 * 1000


def test_compute_buffer_by_hand():
    """n_ctx 100: llama.cpp caps the batch at the context (n_batch = min(n_ctx, n_batch),
    n_ubatch <= n_batch, src/llama-context.cpp l. 248-250, before the context is padded to 256
    cells), so the graph is reserved for 100 tokens. F32 hidden state H = 4*100*64, the chosen
    experts' gate output A = 4*100*2*32 (both 25600), logits 4*100*100 = 40000; mask 2*256*100 =
    51200; positions and indices 32*100 = 3200."""
    m = synthetic(expert_bytes=(300000, 300000))
    base = 3200 + 51200 + 3 * 25600 + 4 * 25600           # the FFN's peak beats the output's
    assert compute_estimate(m, 100) == base == 233600
    # block 0's experts in host memory: a 300000-byte copy beside two FFN outputs, 4 H, mask
    block0 = Placement(-1, (r"blk\.0\.ffn_.*_exps",))
    assert compute_estimate(m, 100, block0) == 3200 + 51200 + 300000 + 2 * 25600 + 4 * 25600
    # the last block's copy comes after the last attention: the mask's memory is free again
    block1 = Placement(-1, (r"blk\.1\.ffn_.*_exps",))
    assert compute_estimate(m, 100, block1) == 3200 + 300000 + 2 * 25600 + 4 * 25600
    # -ngl 1: both blocks in host memory; half a block's K and V (256 cells x 2 x 128 bytes)
    assert compute_estimate(m, 100, Placement(1)) == \
        3200 + 51200 + 300000 + 2 * 25600 + 4 * 25600 + 256 * 256 // 2
    # the compute buffer stays on the GPU with nothing else there (-ngl 0)
    assert device_memory(m, Placement(0), 100).compute == compute_estimate(m, 100, Placement(0))
    # a -ub shorter than the context is the batch (src/llama-context.cpp l. 631)
    assert compute_estimate(m, 300, n_ubatch=128) == 32 * 128 + 2 * 512 * 128 + 7 * 4 * 128 * 64
    # -b caps -ub (the physical batch is at most the logical one)
    assert compute_estimate(m, 300, n_ubatch=256, n_batch=128) == \
        compute_estimate(m, 300, n_ubatch=128)
    # op offload: only for batches of 32 tokens or more, and not with --no-op-offload; then no
    # host weight is copied and the buffer is the one of every weight on the GPU
    assert compute_estimate(m, 100, block0, n_ubatch=31) == compute_estimate(m, 100, n_ubatch=31)
    assert compute_estimate(m, 100, block0, n_ubatch=32) == \
        32 * 32 + 2 * 256 * 32 + 300000 + 2 * 4 * 32 * 64 + 4 * 4 * 32 * 64
    assert compute_estimate(m, 100, block0, op_offload=False) == base
    assert device_memory(m, block0, 100, n_ubatch=32).compute == \
        compute_estimate(m, 100, block0, n_ubatch=32)


def test_fit_leaves_more_on_the_host_as_the_batch_grows():
    """A larger -ub reserves a larger compute buffer (the logits and activations of every token
    of the batch), so --fit, at the same free memory, keeps at least as many experts in host
    memory; with the batch at the context's, a larger -ub changes nothing."""
    m = synthetic(expert_bytes=(300000,) * 4)
    free = device_memory(m, Placement(), 4096, alignment=256).total
    host = [host_model_bytes(m, fit(m, free, margin_bytes=0, n_ctx=4096,
                                    n_ubatch=ub).placement) for ub in (32, 512, 2048, 4096)]
    assert host == sorted(host) and host[-1] > host[1] == host_model_bytes(m, Placement())
    assert fit(m, free, 0, 512, n_ubatch=512) == fit(m, free, 0, 512, n_ubatch=4096)


def test_fit_patterns_count_the_output_as_the_last_layer():
    """fit's partial layers are the last n_part of n_layer counted from the output layer,
    whose index (4 here) names no block: the first offloaded block keeps its experts."""
    p = _placement(4, _Layers(5, 3, "up"))
    assert p.n_gpu_layers == 5 and p.host_patterns == (
        r"blk\.2\.ffn_(gate|gate_up|down).*", r"blk\.3\.ffn_(up|down|gate_up|gate)_(ch|)exps",
        r"blk\.4\.ffn_(up|down|gate_up|gate)_(ch|)exps")
    assert _placement(4, _Layers(3, 2)).host_patterns == (
        r"blk\.3\.ffn_(up|down|gate_up|gate)_(ch|)exps",
        r"blk\.4\.ffn_(up|down|gate_up|gate)_(ch|)exps")


def test_fit_by_hand():
    m = synthetic()
    kv = 2 * 256 * 256
    # the default fits with 66418 bytes free: kept at a margin of 66418, not at 66419
    full = 2510 + kv
    r = fit(m, 200000, 200000 - full, n_ctx=100, alignment=1, compute=0)
    assert (r.status, r.args()) == ("fits", "-c 100 -ngl -1")
    # target 133000: blocks 1's gate and down (and router) on the host, its up on the GPU
    r = fit(m, 200000, 67000, n_ctx=100, alignment=1, compute=0)
    assert r.status == "placed" and r.args() == (
        r'-c 100 -ngl 3 -ot "blk\.1\.ffn_(gate|gate_up|down).*=CPU,'
        r'blk\.2\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU"')
    assert r.device_bytes == 510 + 1000 + 100 + 300 + kv == 132982
    assert r.host_expert_blocks(m) == ()
    # 18 bytes less (target 132982, exactly the up overflow's use: fit wants strictly under),
    # the attention-only overflow (every ffn_* of block 1 on the host) instead
    r = fit(m, 200000, 67000 + 18, n_ctx=100, alignment=1, compute=0)
    assert r.placement.host_patterns[0] == r"blk\.1\.ffn_(gate|up|gate_up|down).*"
    assert r.host_expert_blocks(m) == (1,)
    # an explicit -ngl, or any -ot (--n-cpu-moe), switches fit off when the default does not
    # fit; a user's -ot that frees enough is simply kept (step 1)
    r = fit(m, 200000, 67000, n_ctx=100, user=Placement(3), alignment=1, compute=0)
    assert (r.status, r.reason) == ("aborted", "n_gpu_layers already set by user to 3, abort")
    own = Placement(-1, (r"blk\.0\.ffn_.*_exps",))
    r = fit(m, 200000, 68000, n_ctx=100, user=own, alignment=1, compute=0)
    assert r.status == "aborted" and "tensor_buft_overrides already set" in r.reason
    assert r.placement == own and r.device_bytes == full - 900
    assert fit(m, 200000, 67000, n_ctx=100, user=own, alignment=1, compute=0).status == "fits"


def test_fit_cuts_an_unset_context_by_interpolation():
    """8192 trained, 4096 minimum, 512 bytes per cell: target 3,000,000 -> 4096 + 4096 *
    (3000000 - 2099662) // (4196814 - 2099662) = 5854, rounded down to 256: 5632."""
    m = synthetic()
    r = fit(m, 3_001_000, 1000, alignment=1, compute=0)
    assert (r.status, r.n_ctx, r.args()) == ("context", 5632, "-c 5632 -ngl -1")
    assert r.device_bytes == 2510 + 5632 * 512 <= 3_000_000


def _reference(m, target):
    """Plain enumeration of what fit's step 4 converges to when memory grows with every
    expert on the GPU: the fewest partial layers that fit, then the richest overflow of the
    next layer strictly under the target (up -> gate; else attention only)."""
    hp = m.n_layer

    def used(n_part, overflow="moe"):
        return mem(m, _placement(hp, _Layers(hp + 1, n_part, overflow))).total
    n_part = min(p for p in range(hp + 1) if used(p) <= target)
    if n_part == 0:
        return _placement(hp, _Layers(hp + 1, 0))
    best = "moe"
    if used(n_part, "up") < target:
        best = "gate" if used(n_part, "gate") < target else "up"
    elif used(n_part, "attn") < target:
        best = "attn"
    return _placement(hp, _Layers(hp + 1, n_part, best))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(50, 5000), min_size=2, max_size=12), st.floats(0.0, 1.0))
def test_fit_step_four_equals_enumeration(expert_bytes, where):
    m = synthetic(tuple(expert_bytes))
    # from the least fit's step 3 can reach with every layer (the first offloaded block keeps
    # its experts) to the default
    lo = mem(m, _placement(m.n_layer, _Layers(m.n_layer + 1, m.n_layer))).total
    hi = mem(m, Placement()).total
    target = int(lo + 1 + where * (hi - lo - 2))
    r = fit(m, 10**9, 10**9 - target, n_ctx=100, alignment=1, compute=0)
    assert r.placement == _reference(m, target)
    assert r.device_bytes <= target


# --- real llama.cpp on the software Vulkan device ------------------------------------------


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    return write_tiny_moe(tmp_path_factory.mktemp("fit") / "tiny-moe.gguf")


@pytest.fixture(scope="module")
def wide_moe(tmp_path_factory) -> Path:
    return write_tiny_moe(tmp_path_factory.mktemp("fit") / "wide-moe.gguf", **WIDE)


def vulkan(tool: str, *args: str) -> subprocess.CompletedProcess:
    exe = VK / "bin" / tool
    if not exe.is_file():
        missing_runtime(f"llama.cpp b11434 with Vulkan ({tool}) is not built", SETUP)
    env = dict(os.environ, LD_LIBRARY_PATH=str(VK / "bin"), GGML_VK_VISIBLE_DEVICES="0")
    # a random-weight model's token may be any bytes: decode what it prints leniently
    return subprocess.run([str(exe), *args], capture_output=True, text=True, errors="replace",
                          env=env, timeout=600)


def free_bytes() -> int:
    """The software device's free memory, as llama.cpp lists it (Mesa 22.3.6: a fixed 2 GiB)."""
    r = vulkan("llama-fit-params", "--list-devices")
    m = re.search(r"Vulkan0: .*\((\d+) MiB, (\d+) MiB free\)", r.stdout + r.stderr)
    assert m, (r.stdout + r.stderr)[-3000:]
    return int(m.group(2)) * MiB


def measured(out: str) -> dict[str, float]:
    """The buffers llama.cpp allocated on Vulkan0 (model, KV, compute), in MiB."""
    got = {}
    for kind, pat in (("model", r"Vulkan0 model buffer size = +([\d.]+) MiB"),
                      ("context", r"Vulkan0 KV buffer size = +([\d.]+) MiB"),
                      ("compute", r"Vulkan0 compute buffer size = +([\d.]+) MiB")):
        m = re.search(pat, out)
        got[kind] = float(m.group(1)) if m else 0.0
    return got


#: -fitt margins (MiB) from "the default fits" through every step-4 outcome to dense-only
MARGINS = (1024, 1900, 1930, 1950, 1965, 1980, 1990, 2000, 2010, 2020, 2035)


def fit_lines(path: Path, name: str, points) -> list[tuple[tuple, str, str]]:
    """(point, the port's line, llama-fit-params' line) at each (shape, -c, -fitt) point."""
    free = free_bytes()
    m = read_llama_model(path)
    out = []
    for ctx, margin in points:
        c = ("-c", str(ctx)) if ctx else ()
        r = vulkan("llama-fit-params", "-m", str(path), *c, "-fitc", "2048", "-fitt",
                   str(margin))
        assert r.returncode == 0, r.stderr[-3000:]
        port = fit(m, free, margin * MiB, n_ctx=ctx, n_ctx_min=2048, alignment=ALIGNMENT)
        out.append(((name, ctx, margin), port.args(), r.stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.slow
def test_the_port_chooses_what_llama_fit_params_chooses(tiny_moe, wide_moe):
    """At each margin the port's arguments are the line real llama-fit-params prints, on the
    software Vulkan device, with the context set (-c 4096) and with it left to fit, for two
    MoE shapes; the points it misses are exactly KNOWN_MISSES (a miss fixed must leave it)."""
    points = [(ctx, margin) for ctx in (4096, 0) for margin in MARGINS]
    differ = set()
    for path, name in ((tiny_moe, "tiny"), (wide_moe, "wide")):
        for point, port, real in fit_lines(path, name, points):
            if port != real:
                assert point in KNOWN_MISSES, (point, port, real)
                differ.add(point)
    assert differ == KNOWN_MISSES, f"now matching: {sorted(KNOWN_MISSES - differ)}"


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "with whole blocks in host memory (-ngl below every layer) at -c 4096 llama.cpp reserves "
    "a 28.00 MiB compute buffer on the tiny shape and the rule counts 26.02: the copies of "
    "the host blocks' K and V for the offloaded attention are inferred as half a block's"))
def test_the_known_misses_match(tiny_moe):
    for point, port, real in fit_lines(tiny_moe, "tiny",
                                       sorted(p[1:] for p in KNOWN_MISSES)):
        assert port == real, (point, port, real)


#: placements the accounting is checked at: the default, fit's shapes, --n-cpu-moe's
PLACEMENTS = (Placement(), Placement(5, (r"blk\.1\.ffn_(gate|gate_up|down).*",
                                         r"blk\.2\.ffn_(up|down|gate_up|gate)_(ch|)exps")),
              Placement(3))


@pytest.mark.slow
def test_vram_accounting_matches_the_buffers_llama_cpp_allocates(tiny_moe):
    """llama-completion -v on the software device: the model buffer and the KV cache on
    Vulkan0 are the port's to the printed 0.01 MiB, at two contexts and two cache types; the
    compute buffer is an estimate, within the stated bound."""
    m = read_llama_model(tiny_moe)
    for ctx, ctk in ((4096, "f16"), (1000, "q8_0")):
        for p in PLACEMENTS[: 3 if ctx == 4096 else 1]:
            ot = ("-ot", ",".join(f"{x}=CPU" for x in p.host_patterns)) if p.host_patterns \
                else ()
            r = vulkan("llama-completion", "-m", str(tiny_moe), "-c", str(ctx), "-n", "1",
                       "-p", "w1 w2", "-no-cnv", "--fit", "off", "-ngl", str(p.n_gpu_layers),
                       *ot, "-ctk", ctk, "-ctv", ctk, "-fa", "on", "-v")
            assert r.returncode == 0, r.stderr[-3000:]
            got = measured(r.stdout + r.stderr)
            want = device_memory(m, p, ctx, ctk, ctk, alignment=ALIGNMENT)
            assert abs(got["model"] - want.model / MiB) <= 0.006, (p, got, want)
            assert abs(got["context"] - want.context / MiB) <= 0.006, (p, got, want)
            assert abs(got["compute"] - want.compute / MiB) <= COMPUTE_TOLERANCE_MIB, got


def compute_buffer(path: Path, ctx: int, p: Placement) -> float:
    """The compute buffer llama.cpp reserves on Vulkan0 for ``p`` (MiB), from fit's own
    memory query (llama-fit-params -v with a placement of the user's: nothing is allocated)."""
    ot = ("-ot", ",".join(f"{x}=CPU" for x in p.host_patterns)) if p.host_patterns else ()
    r = vulkan("llama-fit-params", "-m", str(path), "-c", str(ctx), "-fitt", "0", "-v",
               "-ngl", str(p.n_gpu_layers), *ot)
    m = re.search(r"Vulkan0 compute buffer size = +([\d.]+) MiB", r.stdout + r.stderr)
    assert m, (r.stdout + r.stderr)[-3000:]
    return float(m.group(1))


@pytest.mark.slow
def test_the_compute_buffer_follows_the_placement(tiny_moe, wide_moe):
    """llama.cpp's compute buffer on the GPU grows when weights it reads are in host memory
    (their copies for the offloaded products) and with the context (the attention mask): at
    fit's placements, --n-cpu-moe's and -ngl's, for two shapes at three contexts, the rule is
    within the stated bound, and on these two shapes exact to the printed 0.01 MiB where
    nothing is in host memory."""
    moe = r"blk\.{}\.ffn_(up|down|gate_up|gate)_(ch|)exps"
    for path, n in ((tiny_moe, 4), (wide_moe, 3)):
        m = read_llama_model(path)
        cases = (Placement(), Placement(-1, (r"exps",)), Placement(-1, (moe.format(0),)),
                 Placement(n + 1, (r"blk\.1\.ffn_(gate|up|gate_up|down).*",
                                   *(moe.format(b) for b in range(2, n + 1)))),
                 Placement(0), Placement(2))
        for ctx in (128, 1024, 4096):       # 128: a context shorter than -ub is the batch
            for p in cases:
                got, want = compute_buffer(path, ctx, p), compute_estimate(m, ctx, p) / MiB
                tol = 0.006 if p == Placement() else COMPUTE_TOLERANCE_MIB
                assert abs(got - want) <= tol, (path.name, ctx, p, got, want)
