"""Device memory reads a placement's tensors at once (``Placement.device_flags``, kept per
pattern list and table) instead of asking ``on_device`` tensor by tensor: the same answer for
every tensor of a GGUF header's table and of a catalog model's, under ``--n-cpu-moe``, ``-ngl``,
fit's overflow patterns and ``-ot`` lists; and the model buffer and the host's bytes as the
per-tensor sums make them."""
from __future__ import annotations

import pytest

from cope_core.llamacpp.placement.command import ALL_EXPERTS, n_cpu_moe_patterns
from cope_core.llamacpp.placement.vram import (
    Placement,
    device_memory,
    host_model_bytes,
    llama_model_of,
    read_llama_model,
)
from cope_core.models import resolve_model

GGUF = "data/models/qwen3-30b-a3b-Q4_K_M.header.gguf"


def _tables():
    return [read_llama_model(GGUF),
            llama_model_of(resolve_model("glm-4.5-air", "Q4_K_M")),
            llama_model_of(resolve_model("qwen3-30b-a3b"))]


def _placements(n_layer: int) -> list[Placement]:
    return [Placement(), Placement(0), Placement(n_layer // 2), Placement(n_layer + 1),
            Placement(-1, (ALL_EXPERTS,)),
            *(Placement(-1, n_cpu_moe_patterns(n)) for n in (0, 1, 7, n_layer)),
            Placement(n_layer - 3, n_cpu_moe_patterns(5)),
            # fit's partial layers, a pattern naming no tensor, one naming the embedding and the
            # output, and one matching part of a name only (re.search, not a full match)
            Placement(n_layer, (r"blk\.3\.ffn_(gate|up|gate_up|down).*", r"blk\.4\.ffn_down")),
            Placement(-1, (r"nothing",)), Placement(-1, (r"token_embd", r"^output\.")),
            Placement(-1, (r"exps",)), Placement(-1, [r"blk\.1\d\.", r"attn"])]


@pytest.mark.parametrize("m", _tables(), ids=lambda m: m.path)
def test_device_flags_are_on_device(m):
    for p in _placements(m.n_layer):
        flags = p.device_flags(m)
        assert flags == tuple(p.on_device(m, name) for name, _ in m.tensors), p
        assert p.device_flags(m) is flags          # kept for the next ask


@pytest.mark.parametrize("m", _tables(), ids=lambda m: m.path)
def test_memory_is_the_per_tensor_sum(m):
    for p in _placements(m.n_layer):
        mem = device_memory(m, p, 4096, alignment=256)
        on = sum((b + 255) // 256 * 256 for name, b in m.tensors if p.on_device(m, name))
        tied = 0 if m.has_output or p.gpu_start(m) > m.n_layer else \
            (dict(m.tensors)["token_embd.weight"] + 255) // 256 * 256
        assert mem.model == on + tied
        assert host_model_bytes(m, p) == sum(b for name, b in m.tensors
                                             if not p.on_device(m, name))
