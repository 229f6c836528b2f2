"""Several GPUs in one box, priced and answered (docs/design.md#several-gpus).

**Decode across cards.** With ``--split-mode layer`` one token passes the cards in turn: no card
works while another does (a single sequence has nothing to overlap, and any tensor override,
``--n-cpu-moe`` and ``--fit``'s own included, turns the scheduler's pipeline parallelism off:
``llama_context`` in src/llama-context.cpp l. 432-459 of b11434). So a token costs each block at
its own card's rates, priced by that card's analytic profile (:func:`card_costs`: the block's
share of the shared work, and its routed experts on the card or on the CPU as
:func:`~cope_core.llamacpp.cache.cache_search.placement_parts` prices them on one card), plus one
hand-off per boundary between cards in use (:func:`handoff_us`): the scheduler waits for the
previous split and copies its output, the hidden state, to the next card
(``ggml_backend_sched_compute_splits``, ggml/src/ggml-backend.cpp l. 1802-1994), peer to peer
where the driver allows it, else staged through host memory (two link crossings): consumer
GeForce cards have peer copies off on Windows and on the stock Linux driver.

**The answer** (:func:`devices_answer`): the fastest placement every card holds by the project's
own count (:func:`~cope_core.llamacpp.placement.device_search.search_devices`), against what
``--fit`` places on the same cards (the baseline: memory only, no notion of a card's speed,
ggml-org/llama.cpp#18914) and against the fastest single card; a card given no layer is better
left out, and the command says so with ``-dev``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...errors import CopeInputError
from ...geometry import GIB, ModelGeometry
from ...machine import Machine
from ...platforms import PlatformSpec
from ...profile.analytic import analytic_profile
from ..cache.cache_search import placement_parts
from ..placement.command import LlamaFlags, all_layers
from ..placement.device_search import (
    BlockCosts,
    DevicePlan,
    plan_cost,
    search_devices,
)
from ..placement.devices import (
    Buffers,
    DeviceLayout,
    block_bytes,
    check_split,
    device_memories,
    n_cpu_moe_layout,
)
from ..placement.fit_devices import DevicesFit, fit_devices
from ..placement.vram import DeviceMemory
from .builds import Build
from .prompt import PromptRun, PromptTime, prompt_time
from .request import Request
from .settings import LlamaSettings

#: llama.cpp's backend names by vendor, as ``--list-devices`` prints them (CUDA0, ROCm0, ...)
BACKENDS = {"nvidia": "CUDA", "amd": "ROCm", "intel": "SYCL"}


def device_names(vendors: Sequence[str]) -> tuple[str, ...]:
    """Each card's llama.cpp device name, numbered per backend in device order."""
    seen: dict[str, int] = {}
    out = []
    for v in vendors:
        b = BACKENDS.get(v, "Vulkan")
        out.append(f"{b}{seen.get(b, 0)}")
        seen[b] = seen.get(b, 0) + 1
    return tuple(out)


#: One hand-off between cards per token, as llama.cpp's own decode measures it: gpt-oss-120b
#: MXFP4 fully offloaded on 2, 4 and 6 Radeon MI50 (ggml-org/llama.cpp PR #19922, its baseline
#: table before the change: tg1024 82.44, 76.84 and 73.43 tokens/s, 12.13, 13.01 and 13.62 ms a
#: token, the same weights on more cards) costs 0.44 and 0.305 ms per added boundary; the mean.
#: The wait and the staged copy of the hidden state account for some 25 µs of it on a PCIe card
#: (:func:`handoff_us`'s parts); the rest is inferred to be the next card's launches, which the
#: wait exposes (each card's split is launched only after its input arrived).
HANDOFF_MEASURED_US = (0.44 + 0.305) / 2 * 1e3


def handoff_us(a: PlatformSpec, b: PlatformSpec, hidden_bytes: float, peer: bool = False
               ) -> float:
    """Microseconds one token's hand-off from card ``a`` to card ``b`` costs: the measured
    boundary (:data:`HANDOFF_MEASURED_US`, cards without peer copies), of which a peer copy
    saves one link crossing of the hidden state (staged through host memory it goes down one
    link and up the other)."""
    link = min(a.link_bandwidth, b.link_bandwidth) * a.link_efficiency
    crossing = a.link_latency_us + hidden_bytes / link * 1e6
    return HANDOFF_MEASURED_US - (crossing if peer else 0.0)


def card_costs(g: ModelGeometry, spec: PlatformSpec, threads: int, context: float
               ) -> BlockCosts:
    """One block's cost per token on the card of ``spec``: its share of the shared work
    (attention, norms, router; spread evenly over the blocks) and, for a MoE block, its routed
    experts on the card or in host memory, from the card's analytic profile."""
    profile = analytic_profile(g, spec, cpu_threads=[threads])
    shared, gpu_layer, cpu_layer = placement_parts(profile, g, context, cpu_threads=threads)
    s = shared / (g.dense_layers + g.n_layers)
    return BlockCosts(full=s + gpu_layer, host=s + cpu_layer, dense=s)


@dataclass(frozen=True)
class Cards:
    """A machine's cards as llama.cpp sees them, in device order: each one's platform, memory
    (bytes) and device name (``CUDA0``...)."""

    specs: tuple[PlatformSpec, ...]
    memory: tuple[float, ...]
    names: tuple[str, ...]

    @classmethod
    def of(cls, machine: Machine) -> Cards:
        return cls(machine.card_specs(), tuple(g.memory_bytes for g, _ in machine.cards),
                   device_names([g.vendor for g, _ in machine.cards]))

    def costs(self, g: ModelGeometry, threads: int, context: float) -> list[BlockCosts]:
        return [card_costs(g, s, threads, context) for s in self.specs]

    def handoff(self, g: ModelGeometry, peer: bool = False) -> float:
        """The dearest hand-off between two of the cards (one hidden state of ``g``)."""
        return max(handoff_us(a, b, 4 * g.hidden, peer) for a in self.specs for b in self.specs)


def devices_prompt(g: ModelGeometry, specs: Sequence[PlatformSpec], blocks_per_card:
                   Sequence[int], host_layers: int, run: PromptRun, hand_us: float,
                   build: Build | None = None) -> PromptTime:
    """A prompt across the cards: each card's share of the blocks at that card's own rates
    (:func:`~cope_core.llamacpp.answer.prompt.prompt_time` on each card, weighed by its share),
    the host experts' copy and CPU work as the first card runs them (op offload sends every
    host weight to device 0, ggml-backend.cpp l. 1101-1121, over its link), and one hand-off
    per boundary between cards in use for every physical batch."""
    times = [prompt_time(g, s, host_layers, run, build) for s in specs]
    total = sum(blocks_per_card)
    gpu = sum(t.gpu_s * n / total for t, n in zip(times, blocks_per_card))
    used = sum(1 for n in blocks_per_card if n)
    gpu += len(run.chunks()) * max(used - 1, 0) * hand_us * 1e-6
    first = times[next(i for i, n in enumerate(blocks_per_card) if n)]
    return replace(first, gpu_s=gpu)


@dataclass(frozen=True)
class DevicesAnswer:
    """Several cards' answer: the placement to run, fit's, the fastest single card's, each
    device's bytes, and the flags."""

    cards: tuple[str, ...]
    names: tuple[str, ...]
    caps: tuple[int, ...]
    best: DevicePlan
    memory: tuple[DeviceMemory, ...]
    fit: DevicesFit
    fit_tpot_us: float | None
    one_card: DevicePlan | None
    rel: float
    n_blocks: int
    threads: int
    moe_blocks: frozenset[int] = frozenset()
    request: Request | None = None
    ttft_s: float | None = None          # the request's prompt under the answer's placement
    fit_ttft_s: float | None = None      # and under fit's

    @property
    def left_out(self) -> tuple[int, ...]:
        return tuple(i for i in range(len(self.cards)) if i not in self.best.used)

    def flags(self) -> LlamaFlags:
        """``-dev`` (a card left out), ``-ts`` of whole layers and the host blocks' ``-ot``."""
        used = self.best.used
        counts = tuple(self.best.layout.counts[i] for i in used)
        host = tuple(sorted(self.best.layout.host_blocks))
        return LlamaFlags(n_gpu_layers=all_layers(self.n_blocks), fit=False,
                          threads=self.threads, cpu_blocks=host or None,
                          tensor_split=counts if len(used) > 1 else None,
                          devices=tuple(self.names[i] for i in used) if self.left_out else None)

    def blocks(self) -> tuple[list[int], list[int | None]]:
        """Each block's card and its routed experts' card (-1: host memory) under the answer's
        placement, as :func:`~cope_core.llamacpp.placement.device_search.blocks_tpot` takes them."""
        return self.best.layout.blocks(self.n_blocks, self.moe_blocks)

    def request_s(self, ttft_s: float, tpot_us: float) -> float:
        """The request's time: its first token, then its answer decoded."""
        assert self.request is not None
        return ttft_s + self.request.gen_tokens * tpot_us * 1e-6

    def gain_over_fit(self) -> float | None:
        return None if self.fit_tpot_us is None else self.fit_tpot_us / self.best.tpot_us

    def gain_over_one(self) -> float | None:
        return None if self.one_card is None else self.one_card.tpot_us / self.best.tpot_us

    def lines(self) -> list[str]:
        """What advise prints for the cards."""
        tps = 1e6 / self.best.tpot_us
        lo, hi = tps / (1 + self.rel), tps / max(1 - self.rel, 1e-9)
        out = [f"several GPUs (--split-mode layer): {self.flags().command()}",
               f"  predicted {tps:.1f} tokens/s"
               + (f" [{lo:.1f}, {hi:.1f}]" if self.rel else "")]
        if self.request is not None and self.ttft_s is not None:
            theirs = "" if self.fit_ttft_s is None or self.fit_tpot_us is None else \
                f"; fit's {self.request_s(self.fit_ttft_s, self.fit_tpot_us):.1f} s"
            out.append(f"  request ({self.request.describe()}): first token in "
                       f"{self.ttft_s:.1f} s, "
                       f"{self.request_s(self.ttft_s, self.best.tpot_us):.1f} s in all{theirs}")
        out += [f"  {line}" for line in self.device_lines(self.best.layout, self.memory)]
        gain, fit_us = self.gain_over_fit(), self.fit_tpot_us
        out.append("  llama.cpp's --fit on these cards: " + _ts(self.fit.layout)
                   + ("" if gain is None or fit_us is None else
                      f", {1e6 / fit_us:.1f} tokens/s; x{gain:.2f} faster with the command"))
        one = self.gain_over_one()
        if self.one_card is not None and one is not None and len(self.best.used) > 1:
            i = self.one_card.used[0]
            out.append(f"  the fastest single card, {self.cards[i]} ({self.names[i]}): "
                       f"{1e6 / self.one_card.tpot_us:.1f} tokens/s; x{one:.2f} faster on "
                       f"{len(self.best.used)} cards")
        for i in self.left_out:
            out.append(f"  {self.cards[i]} ({self.names[i]}) is better left out: its layers "
                       "decode faster elsewhere than its memory saves (-dev lists the others)")
        return out

    def device_lines(self, layout: DeviceLayout, memory: Sequence[DeviceMemory]) -> list[str]:
        out = []
        for i, (r, mem) in enumerate(zip(layout.ranges(), memory)):
            blocks = [b for b in r if b < self.n_blocks]
            host = sum(b in layout.host_blocks for b in blocks)
            where = (f"blocks {blocks[0]}-{blocks[-1]}" if blocks else "left out") + \
                (" and the output" if self.n_blocks in r else "")
            out.append(f"{self.names[i]} {self.cards[i]}: {where}, {host} with experts in host "
                       f"memory; {mem.total / GIB:.2f} of {self.caps[i] / GIB:.2f} GiB "
                       f"(weights {mem.model / GIB:.2f}, KV {mem.context / GIB:.2f}, compute "
                       f"{mem.compute / GIB:.2f})")
        return out

    def to_dict(self) -> dict[str, Any]:
        def devices(layout: DeviceLayout, memory: Sequence[DeviceMemory]) -> list[dict]:
            return [{"device": self.names[i], "gpu": self.cards[i],
                     "blocks": [b for b in r if b < self.n_blocks],
                     "output": self.n_blocks in r,
                     "host_expert_blocks": sorted(b for b in r if b in layout.host_blocks),
                     "weights_gib": m.model / GIB, "kv_gib": m.context / GIB,
                     "compute_gib": m.compute / GIB, "total_gib": m.total / GIB,
                     "budget_gib": self.caps[i] / GIB}
                    for i, (r, m) in enumerate(zip(layout.ranges(), memory))]
        total = None if self.request is None or self.ttft_s is None \
            else self.request_s(self.ttft_s, self.best.tpot_us)
        return {"command": self.flags().command(), "tokens_per_s": 1e6 / self.best.tpot_us,
                "ttft_s": self.ttft_s, "request_s": total,
                "tpot_us": self.best.tpot_us, "devices": devices(self.best.layout, self.memory),
                "left_out": [self.names[i] for i in self.left_out],
                "fit": {"tensor_split": list(self.fit.layout.counts),
                        "host_expert_blocks": sorted(self.fit.layout.host_blocks),
                        "tokens_per_s": None if self.fit_tpot_us is None
                        else 1e6 / self.fit_tpot_us, "gain": self.gain_over_fit()},
                "one_card": None if self.one_card is None else
                {"device": self.names[self.one_card.used[0]],
                 "tokens_per_s": 1e6 / self.one_card.tpot_us, "gain": self.gain_over_one()}}


def _ts(layout: DeviceLayout) -> str:
    host = len(layout.host_blocks)
    return (f"-ts {','.join(str(c) for c in layout.counts)}, {host} blocks' experts in host "
            "memory" + ("" if not layout.start else f", {layout.start} blocks wholly on the CPU "
                        "(not priced)"))


def devices_answer(g: ModelGeometry, specs: Sequence[PlatformSpec], card_bytes: Sequence[float],
                   vendors: Sequence[str], *, threads: int, context: float,
                   llama: LlamaSettings, rel: float = 0.0, peer: bool = False,
                   request: Request | None = None) -> DevicesAnswer | None:
    """The answer for ``specs``' cards (device order) of ``card_bytes`` memory each, the margin
    of ``llama`` kept free on every card (module docstring); None when no placement fits."""
    m = llama.table(g)
    buffers = Buffers(llama.n_ctx, llama.type_k, llama.type_v, llama.n_ubatch, llama.n_batch,
                      llama.op_offload)
    caps = tuple(int(b) - llama.margin_bytes for b in card_bytes)
    cards = Cards(tuple(specs), tuple(float(b) for b in card_bytes), device_names(vendors))
    costs = cards.costs(g, threads, context)
    hand = cards.handoff(g, peer)
    best = search_devices(m, caps, costs, hand, buffers)
    if best is None:
        return None
    singles = [search_devices(m, tuple(c if j == i else -1 for j, c in enumerate(caps)), costs,
                              hand, buffers) for i in range(len(caps))]
    one = min((p for p in singles if p is not None), key=lambda p: p.tpot_us, default=None)
    fit = fit_devices(m, [int(b) for b in card_bytes], buffers, llama.margin_bytes)
    fit_cost = plan_cost(m, fit.layout, costs, hand)
    names = cards.names
    moe = frozenset(int(b) for b in np.flatnonzero(block_bytes(m, 1).moe))
    ttft = fit_ttft = None
    if request is not None:
        run = PromptRun(request.prompt_tokens, 0, llama.n_ubatch, llama.n_batch,
                        llama.op_offload, threads)

        def ttft_of(layout: DeviceLayout) -> float:
            per_card = [sum(1 for b in r if b < m.n_layer) for r in layout.ranges()]
            return devices_prompt(g, specs, per_card, len(layout.host_blocks & moe), run, hand,
                                  llama.runs_on).seconds
        ttft = ttft_of(best.layout)
        fit_ttft = None if fit.layout.start else ttft_of(fit.layout)
    return DevicesAnswer(tuple(s.gpu_name for s in specs), names, caps, best,
                         device_memories(m, best.layout, buffers, best.used[0]), fit,
                         None if fit_cost == float("inf") else fit_cost, one, rel,
                         m.n_layer, threads, moe, request, ttft, fit_ttft)


def devices_memory(g: ModelGeometry, card_bytes: Sequence[float], names: Sequence[str], *,
                   n_cpu_moe: int, tensor_split: Sequence[float] | None,
                   llama: LlamaSettings) -> tuple[DeviceLayout, tuple[DeviceMemory, ...]]:
    """llama.cpp's count of each card under ``-ngl 99 [-ts ...] --n-cpu-moe N``: the split by
    ``-ts`` (else by each card's memory, all of it free), then the first N blocks' experts to
    host memory; refused, naming the card, when any card cannot hold its share."""
    m = llama.table(g)
    if isinstance(n_cpu_moe, bool) or not 0 <= n_cpu_moe <= m.n_layer:
        raise CopeInputError(f"expected a whole number of blocks in [0, {m.n_layer}], got "
                             f"{n_cpu_moe!r}", field="--n-cpu-moe")
    weights = check_split(tensor_split, len(card_bytes)) if tensor_split is not None \
        else tuple(card_bytes)
    layout = n_cpu_moe_layout(m, weights, n_cpu_moe)
    buffers = Buffers(llama.n_ctx, llama.type_k, llama.type_v, llama.n_ubatch, llama.n_batch,
                      llama.op_offload)
    mem = device_memories(m, layout, buffers)
    over = [(i, x.total - b) for i, (x, b) in enumerate(zip(mem, card_bytes)) if x.total > b]
    if over:
        i, by = max(over, key=lambda t: t[1])
        r = [b for b in layout.ranges()[i] if b < m.n_layer]
        raise CopeInputError(
            f"--n-cpu-moe {n_cpu_moe} does not fit {names[i]}: llama.cpp splits the layers "
            f"-ts {','.join(str(c) for c in layout.counts)} and counts "
            f"{mem[i].total / GIB:.2f} GiB there (blocks {r[0]}-{r[-1]}) of its "
            f"{card_bytes[i] / GIB:.2f}: over by {by / GIB:.2f} GiB", field="--n-cpu-moe")
    return layout, mem
