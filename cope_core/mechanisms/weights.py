"""Synthetic weights, the host expert store, and slot memory on the accelerator.

Weights are deterministic pseudo-random normals scaled by ``1/sqrt(fan_in)`` (so activations stay
O(1) through the layers). Drawing gigabytes of normals is slow on a small CPU, so every tensor is
filled with windows of one random *bank* per scale: window offsets come from the tensor's key,
so different experts get different matrices while filling runs at memcpy speed.
"""
from __future__ import annotations

import math

import torch

from ..errors import CopeInputError
from ..geometry import ModelGeometry

DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                                  "float32": torch.float32}
_BANK = 1 << 22          # random values per bank
_PAD = 65521             # a prime: keys below it get distinct window offsets


def model_dtype(g: ModelGeometry, name: str | None = None) -> torch.dtype:
    """The torch dtype the model's weights are stored in.

    ``dtype_bytes`` 2 defaults to bfloat16 (what the catalog models ship in), 4 to float32;
    ``name`` picks another of the same width. A model whose experts are stored quantised is
    refused: torch's CPU weight-only kernels (int8 per channel, packed int4 per group) store
    other layouts than GGUF's blocks, so timing them would time a format nobody runs
    (docs/design.md#bytes-as-stored); price such a model with an analytic profile."""
    quantised = sorted({t for x in g.expert_layers for t, _ in x.projections()}
                       - {"F32", "F16", "BF16"})
    if quantised:
        raise CopeInputError(f"the torch executor and profiler time 16- or 32-bit weights; "
                             f"this model stores its experts as {', '.join(quantised)} "
                             f"({g.format_name}): make an analytic profile of it (cope profile "
                             "--analytic --model FILE)", field="model.weight_format")
    if name is None:
        by_width = {2: "bfloat16", 4: "float32"}
        if g.dtype_bytes not in by_width:
            raise CopeInputError(f"no torch dtype for {g.dtype_bytes}-byte weights; the executor "
                                 "runs 2-byte (bfloat16/float16) or 4-byte models",
                                 field="model.dtype_bytes")
        name = by_width[g.dtype_bytes]
    if name not in DTYPES:
        raise CopeInputError(f"expected one of {list(DTYPES)}, got {name!r}", field="--dtype")
    dt = DTYPES[name]
    if torch.empty((), dtype=dt).element_size() != g.dtype_bytes:
        raise CopeInputError(f"{name} has {torch.empty((), dtype=dt).element_size()} bytes per "
                             f"weight but the model has dtype_bytes={g.dtype_bytes}",
                             field="--dtype")
    return dt


class Filler:
    """Fills tensors with scaled pseudo-random normals, deterministically per key."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self._banks: dict[tuple, torch.Tensor] = {}

    def _bank(self, scale: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (round(scale, 12), dtype, str(device))
        if key not in self._banks:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + len(self._banks))
            bank = torch.randn(_BANK + _PAD, generator=gen).mul_(scale).to(dtype)
            self._banks[key] = bank.to(device)
        return self._banks[key]

    def fill(self, out: torch.Tensor, key: int, fan_in: int) -> torch.Tensor:
        """Fill contiguous ``out`` in place; ``key`` picks the windows, ``fan_in`` the scale."""
        bank = self._bank(1.0 / math.sqrt(fan_in), out.dtype, out.device)
        flat = out.view(-1)
        for i, start in enumerate(range(0, flat.numel(), _BANK)):
            n = min(_BANK, flat.numel() - start)
            off = ((key * 7919 + i * 104729 + self.seed) * 40503) % _PAD
            flat[start:start + n].copy_(bank[off:off + n])
        return out


def expert_numel(g: ModelGeometry) -> int:
    """Weights of one routed expert: gate and up ``[2I, H]`` then down ``[H, I]``, flat."""
    return 3 * g.hidden * g.expert_intermediate


def fill_expert(filler: Filler, flat: torch.Tensor, g: ModelGeometry, key: int) -> None:
    n13 = 2 * g.hidden * g.expert_intermediate
    filler.fill(flat[:n13], 2 * key, g.hidden)
    filler.fill(flat[n13:], 2 * key + 1, g.expert_intermediate)


class ExpertStore:
    """Host copies of routed experts, ``[layers, experts, 3*H*I]`` (pinned on CUDA).

    The executor's store holds every expert of the model. The profiler's holds a few, and ids
    wrap around (``expert(l, e)`` reads ``[l % layers, e % experts]``): it needs distinct
    memory per sample, not every expert.
    """

    def __init__(self, acc, g: ModelGeometry, dtype: torch.dtype, *, layers: int | None = None,
                 experts: int | None = None, filler: Filler | None = None):
        self.g = g
        self.layers = g.n_layers if layers is None else int(layers)
        self.experts = g.n_experts if experts is None else int(experts)
        self.data = acc.host_alloc((self.layers, self.experts, expert_numel(g)), dtype)
        filler = filler or Filler()
        for layer in range(self.layers):
            for e in range(self.experts):
                fill_expert(filler, self.data[layer, e], g, layer * self.experts + e)

    def expert(self, layer: int, e: int) -> torch.Tensor:
        return self.data[layer % self.layers, e % self.experts]


class SlotPool:
    """Expert slots in accelerator memory, each holding one expert's flat weights.

    ``content[s]`` says which (layer, expert) slot ``s`` holds. Residency decides what goes where;
    the pool only moves weights: :meth:`load` synchronously (setting up a state, never timed)
    and :meth:`stage` asynchronously on the copy stream (staging and prefetch).
    """

    def __init__(self, acc, n_slots: int, numel: int, dtype: torch.dtype):
        self.acc = acc
        self.n_slots = int(n_slots)
        self.data = acc.alloc((max(self.n_slots, 1), numel), dtype)
        self.content: list[tuple[int, int] | None] = [None] * max(self.n_slots, 1)

    def slot(self, s: int) -> torch.Tensor:
        return self.data[s % self.data.shape[0]]

    def load(self, store: ExpertStore, assignment: dict[int, tuple[int, int]]) -> int:
        """Make slots hold the given (layer, expert); copy only what differs. Returns copies."""
        todo = [(s, le) for s, le in assignment.items()
                if self.content[s % len(self.content)] != le]
        if not todo:
            return 0
        self.acc.synchronize()
        for s, (layer, e) in todo:
            self.slot(s).copy_(store.expert(layer, e))
            self.content[s % len(self.content)] = (layer, e)
        self.acc.synchronize()
        return len(todo)

    def stage(self, s: int, store: ExpertStore, layer: int, e: int) -> None:
        """Queue the host-to-slot copy of expert (layer, e) on the copy stream."""
        self.acc.copy.submit(self.acc.link_copy, self.slot(s), store.expert(layer, e))
        self.content[s % len(self.content)] = (layer, e)

