"""Several GPUs in one box (``--gpu a,b``): llama.cpp's answer across the cards, made once
(:func:`cope_core.llamacpp.devices_answer`) and handed to every surface as the llama.cpp
runtime's answer: the command places work on every card worth using, its default is what
``--fit`` places on the same cards, and the single card's answer is offered beside it
(docs/design.md#several-gpus). The other runtimes are answered for the first card."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .. import parts
from ..geometry import GIB, ModelGeometry
from ..llamacpp import DevicesAnswer, LlamaSettings, Request, devices_answer
from ..machine import Machine
from ..platforms import PlatformSpec, with_card
from .advice import Alternative, RuntimeAnswer, Speed


def machine_devices(model: ModelGeometry, machine: Machine, *, vram_gib: float | None,
                    context: float, llama: LlamaSettings, rel: float,
                    request: Request | None = None) -> DevicesAnswer | None:
    """The cards' answer for ``machine`` (None with one card, or when nothing fits): every
    card's memory, the first one's at the budget asked for (``--vram-gib``) plus the margin."""
    if len(machine.cards) < 2:
        return None
    sizes = [g.memory_bytes for g, _ in machine.cards]
    if vram_gib is not None:
        sizes[0] = min(sizes[0], vram_gib * GIB + llama.margin_bytes)
    return devices_answer(model, machine.card_specs(), sizes,
                          [g.vendor for g, _ in machine.cards], threads=machine.threads,
                          context=context, llama=llama, rel=rel, request=request)


def profile_devices(model: ModelGeometry, spec: PlatformSpec, first_bytes: float,
                    more: Sequence[str], *, threads: int, context: float, llama: LlamaSettings,
                    rel: float, request: Request | None = None) -> DevicesAnswer | None:
    """The cards' answer when the first card is a profile's (``cope predict``/``export
    --more-gpus``): the others beside it, each a catalog card in its own interface's slot
    with the profile's host (:func:`cope_core.platforms.with_card`)."""
    cards = [parts.gpu_part(n) for n in more]
    first = parts.gpus().get(spec.gpu_name)
    specs = [spec] + [with_card(spec, g, parts.link_between(parts.link_part(g.link), g))
                      for g in cards]
    return devices_answer(model, specs, [first_bytes, *(g.memory_bytes for g in cards)],
                          [first.vendor if first else "nvidia", *(g.vendor for g in cards)],
                          threads=threads, context=context, llama=llama, rel=rel,
                          request=request)


def across_cards_file(text: str, d: DevicesAnswer) -> str:
    """A llama.cpp file led by the cards' command, the one-card file after it commented."""
    head = ["# llama.cpp across the cards (--split-mode layer): docs/design.md#several-gpus",
            d.flags().command()] + [f"# {x.strip()}" for x in d.lines()[1:]]
    rest = [x if x.startswith("#") else f"# one card: {x}" for x in text.splitlines()]
    return "\n".join(head + ["#", "# The first card alone:"] + rest) + "\n"


def relative_half_interval(s: Speed | None) -> float:
    """A speed's relative half-interval (0 without one)."""
    if s is None or s.tpot_ci_us is None or s.tpot_us <= 0:
        return 0.0
    lo, hi = s.tpot_ci_us
    return (hi - lo) / 2 / s.tpot_us


def _speed(tpot_us: float, rel: float) -> Speed:
    return Speed(tpot_us, (tpot_us * (1 - rel), tpot_us * (1 + rel)))


def across_cards(one: RuntimeAnswer, d: DevicesAnswer) -> RuntimeAnswer:
    """llama.cpp's answer for one card (``one``) made the answer across ``d``'s cards."""
    fit = d.fit_tpot_us
    single = Alternative("one card", one.command or "", one.speed,
                         f"the first card alone ({d.names[0]} {d.cards[0]}), its own answer",
                         one.request, "one_card", True)
    notes = tuple(x.strip() for x in d.lines()[2:]) + (
        "several cards: ranked by decode; every card's layers at its own rates, one hand-off "
        "per card boundary; the prompt's host experts cross the first card's link",)
    return replace(one, command=d.flags().command(), runs="llama.cpp across "
                   f"{len(d.best.used)} cards", speed=_speed(d.best.tpot_us, d.rel),
                   default_what="llama.cpp's default on these cards: --fit places -ts "
                   + ",".join(str(c) for c in d.fit.layout.counts)
                   + f" with {len(d.fit.layout.host_blocks)} blocks' experts in host memory"
                   + ("" if fit is not None else " and whole blocks on the CPU (not priced)"),
                   default=None if fit is None else _speed(fit, d.rel),
                   alternatives=(single,), notes=notes,
                   detail=one.detail + tuple(f"one card: {n}" for n in one.notes),
                   request=None, default_request=None,
                   host_layers=float(len(d.best.layout.host_blocks)), cache_mib=0)
