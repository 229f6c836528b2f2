"""llama-bench rows on several devices: where a row's command put each block, read from its own
fields (``devices``, ``tensor_split``, ``split_mode``, ``-ot`` with ``CUDA1``-style buffers and
``--n-cpu-moe``), for the block-by-block price of
:func:`~cope_core.llamacpp.answer.devices_answer.blocks_tpot` (docs/design.md#several-gpus).

The rule is llama.cpp's: the layers split across the row's devices by ``-ts`` (all 0: each
card's free memory, taken as its whole memory), then each tensor to the buffer of the first
``-ot`` pattern that matches its name (``--n-cpu-moe``'s patterns after the row's own). A row
is priced when every tensor but the routed experts stays on its layer's device and each block's
routed experts are whole, on one device or in host memory; the others say why.
"""
from __future__ import annotations

import re

from ..answer.devices_answer import Cards
from ..placement.command import EXPERT_TENSORS, n_cpu_moe_patterns
from ..placement.devices import DeviceLayout, split_counts
from ..placement.vram import LlamaModel
from .bench_file import BenchRow

_EXPERTS = re.compile(rf"^blk\.(\d+){EXPERT_TENSORS}\.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def row_device_names(row: BenchRow, cards: Cards) -> tuple[str, ...]:
    """The devices a row ran on: ``-dev``'s list, every card for ``auto``, the main GPU alone
    with ``-sm none``."""
    if row.split_mode == "none":
        return (cards.names[row.main_gpu],) if row.main_gpu < len(cards.names) else ()
    if row.devices in ("auto", ""):
        return cards.names
    return () if row.devices == "none" else tuple(row.devices.split("/"))


def uses_several(row: BenchRow, cards: Cards | None) -> bool:
    """Whether the row spread its layers over more than one device: ``-dev`` names several,
    ``-ts`` weighs several, or ``auto`` on a machine given with several cards (``gpu_info``
    joins the devices' descriptions with ``", "``, which a description may hold too: it is not
    counted)."""
    if row.split_mode == "none":
        return False
    if row.devices not in ("auto", "none", ""):
        n = len(row.devices.split("/"))
    else:
        n = len(cards.names) if cards is not None else 1
    return n > 1 or sum(x > 0 for x in row.tensor_split) > 1


def row_blocks(row: BenchRow, m: LlamaModel, cards: Cards
               ) -> tuple[list[int], list[int | None], list[int], str]:
    """Each block's layer card and experts' card (-1: host memory; None: no routed experts),
    the cards used (indices into ``cards``), or why the row is not priced."""
    if row.split_mode not in ("layer", "none"):
        return [], [], [], (f"-sm {row.split_mode} splits each layer's weights across the "
                            "cards: COPE prices the layer split (-sm layer)")
    names = row_device_names(row, cards)
    unknown = [n for n in names if n not in cards.names]
    if unknown or not names:
        return [], [], [], (f"ran on {row.devices} (-dev): the machine's cards are "
                            f"{', '.join(cards.names)} (give them with --gpu a,b)")
    used = [cards.names.index(n) for n in names]
    ts = list(row.tensor_split) + [0.0] * max(len(used) - len(row.tensor_split), 0)
    if any(x > 0 for x in ts[len(used):]):
        return [], [], [], (f"-ts {'/'.join(f'{x:g}' for x in row.tensor_split)} names more "
                            f"devices than the {len(used)} it ran on")
    weights = ts[:len(used)] if any(ts) else [cards.memory[i] for i in used]
    layout = DeviceLayout(split_counts(m.n_layer + 1, weights))
    attention = [used[i] for i in layout.cards(m.n_layer)]
    rules = [(re.compile(p), b) for p, b in row.overrides] \
        + [(re.compile(p), "CPU") for p in n_cpu_moe_patterns(row.n_cpu_moe)]
    experts: list[int | None] = [None] * m.n_layer
    seen: dict[int, set[int]] = {}
    for name, _ in m.tensors:
        buf = next((b for rx, b in rules if rx.search(name)), None)
        block = _BLOCK.match(name)
        e = _EXPERTS.match(name)
        where = None if buf is None else _where(buf, cards.names)
        if where == -2:
            return [], [], [], f"-ot {name}={buf}: no such device on this machine"
        if e:
            b = int(e.group(1))
            seen.setdefault(b, set()).add(attention[b] if where is None else where)
        elif where is not None and name != "token_embd.weight" and not (
                block and where == attention[int(block.group(1))]):
            return [], [], [], (f"the overrides move {name} off its layer's card: COPE prices "
                                "routed experts moved, the rest on the layer's card")
    for b, targets in seen.items():
        if len(targets) > 1:
            return [], [], [], (f"block {b}'s routed experts are split between devices: COPE "
                                "prices whole blocks")
        experts[b] = next(iter(targets))
    return attention, experts, sorted(set(attention) | {x for x in experts if x is not None
                                                         and x >= 0}), ""


def _where(buffer: str, names: tuple[str, ...]) -> int:
    """-1: host memory; a card's index; -2: a device this machine does not have."""
    if buffer.upper().startswith("CPU") or buffer.endswith("_Host"):
        return -1
    return names.index(buffer) if buffer in names else -2
