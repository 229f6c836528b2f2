"""llama.cpp's ``--fit`` across several GPUs (``common_params_fit_impl``, common/fit.cpp of
b11434, l. 598-877), on the device counts of :mod:`.devices`.

fit measures each candidate by loading the model with nothing allocated; here
:func:`~.devices.device_memories` counts it. Ported as the source reads:

1. the default placement (every layer on the devices, split by free memory) is kept when every
   device keeps its margin free (l. 261-370); the context is the caller's (``-c`` given, as the
   answers' runs are), so fit's context cut (l. 373-459) does not apply;
2. "dense-only" layers, every routed expert in host memory, fill the devices **back to front**
   (l. 653-733): device ``nd - 1`` first, as many of the unassigned layers as fit its target
   (free - margin), found by false position; the last device's first layer is the output, which
   is never partial;
3. when the dense weights of every layer fit with room to spare (the surplus with every routed
   expert in host memory, l. 611-638), dense-only layers become full **front to back**
   (l. 735-877): device 0 takes over layers with their experts, then device 1, each by false
   position on its full layers. The extra partial layer fit then tries per device
   (``LAYER_FRACTION_UP/GATE/ATTN``, l. 810-858) is not ported: the placement here may hold up
   to one layer's experts less per device than fit's.

What fit writes is ``-ts`` of each device's layer count and an ``-ot`` of the dense-only layers'
experts (``set_ngl_tensor_split_tbo``, l. 548-586): the layers ``n_full`` of each device come
first in its range, its ``n_part`` dense-only ones after them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .devices import Buffers, DeviceLayout, device_memories, split_counts
from .fit import FIT_MARGIN
from .vram import LlamaModel


@dataclass(frozen=True)
class _Ngl:
    """fit's ``ngl_t`` for one device: its layers, of which ``n_part`` are dense-only."""

    n_layer: int = 0
    n_part: int = 0

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part


def layout_of(hp_ngl: int, ngl: Sequence[_Ngl]) -> DeviceLayout:
    """``set_ngl_tensor_split_tbo`` (fit.cpp l. 548-586): ``-ts`` of the layer counts, the
    dense-only layers after each device's full ones."""
    total = sum(n.n_layer for n in ngl)
    il0 = hp_ngl + 1 - total
    host: set[int] = set()
    for n in ngl:
        il0 += n.n_full
        # the output layer's index (hp_ngl) names no block: its pattern moves nothing
        host.update(range(il0, min(il0 + n.n_part, hp_ngl)))
        il0 += n.n_part
    return DeviceLayout(tuple(n.n_layer for n in ngl), frozenset(host), hp_ngl + 1 - total)


@dataclass(frozen=True)
class DevicesFit:
    """fit's placement across devices: the layout, each device's bytes, and how it was found
    (``kept``: the default fits; ``dense``: dense-only layers only; ``moe``: step 4)."""

    layout: DeviceLayout
    used: tuple[int, ...]
    targets: tuple[int, ...]
    status: str

    @property
    def fits(self) -> bool:
        return all(u <= t for u, t in zip(self.used, self.targets))


def fit_devices(m: LlamaModel, free: Sequence[int], buffers: Buffers,
                margins: Sequence[int] | int = FIT_MARGIN) -> DevicesFit:
    """What ``--fit`` places on devices with ``free`` bytes each (module docstring)."""
    nd = len(free)
    margin = [int(margins)] * nd if isinstance(margins, int) else [int(x) for x in margins]
    targets = tuple(int(f) - mg for f, mg in zip(free, margin))
    hp_ngl = m.n_layer

    def mem(layout: DeviceLayout) -> list[int]:
        return [d.total for d in device_memories(m, layout, buffers)]

    def mem_for(ngl: Sequence[_Ngl]) -> list[int]:
        return mem(layout_of(hp_ngl, ngl))

    by_free = DeviceLayout(split_counts(hp_ngl + 1, free))
    used = mem(by_free)
    if all(u <= t for u, t in zip(used, targets)):
        return DevicesFit(by_free, tuple(used), targets, "kept")
    moe = m.n_expert > 0
    surplus = 0
    if moe:
        every = replace(by_free, host_blocks=frozenset(range(hp_ngl)))
        surplus = sum(t - u for t, u in zip(targets, mem(every)))

    ngl = [_Ngl()] * nd
    cur = mem_for(ngl)
    # dense-only layers back to front (l. 653-733)
    for i in range(nd - 1, -1, -1):
        n_unassigned = hp_ngl + 1 - sum(n.n_layer for n in ngl[i + 1:])
        high = list(ngl)
        parts = (n_unassigned if i < nd - 1 else n_unassigned - 1) if moe else 0
        high[i] = _Ngl(n_unassigned, max(parts, 0))
        if high[i].n_layer == 0:
            continue
        used_high = mem_for(high)
        if used_high[i] <= targets[i]:
            ngl, cur = high, used_high
            continue
        delta = high[i].n_layer - ngl[i].n_layer
        while delta > 1:
            step = _step(delta, targets[i], cur[i], used_high[i])
            test = list(ngl)
            first = i == nd - 1 and ngl[i].n_part == 0
            test[i] = _Ngl(ngl[i].n_layer + step,
                           ngl[i].n_part + ((step - 1 if first else step) if moe else 0))
            used_test = mem_for(test)
            if used_test[i] <= targets[i]:
                ngl, cur = test, used_test
            else:
                high, used_high = test, used_test
            delta = high[i].n_layer - ngl[i].n_layer
    if not moe or surplus <= 0:
        return DevicesFit(layout_of(hp_ngl, ngl), tuple(cur), targets, "dense")

    # step 4: dense-only layers become full, front to back (l. 735-877)
    dense_start = nd
    for i in range(nd - 1, -1, -1):
        if ngl[i].n_layer > 0:
            dense_start = i
            continue
        break
    i = 0
    while i <= dense_start < nd:
        high = list(ngl)
        for j in range(dense_start, nd):
            move = high[j].n_layer if j < nd - 1 else high[j].n_layer - 1
            high[i] = _Ngl(high[i].n_layer + move, high[i].n_part)
            high[j] = _Ngl(high[j].n_layer - move, 0)
        high_start = nd - 1
        used_high = mem_for(high)
        if used_high[i] > targets[i]:
            delta = high[i].n_full - ngl[i].n_full
            while delta > 1:
                step = _step(delta, targets[i], cur[i], used_high[i])
                test, at, done = list(ngl), dense_start, 0
                while at < nd:
                    n = min(step - done, test[at].n_part)
                    test[at] = _Ngl(test[at].n_layer - n, test[at].n_part - n)
                    test[i] = _Ngl(test[i].n_layer + n, test[i].n_part)
                    done += n
                    if test[at].n_part > 0:
                        break
                    at += 1
                used_test = mem_for(test)
                if used_test[i] <= targets[i]:
                    ngl, cur, dense_start = test, used_test, at
                else:
                    high, used_high, high_start = test, used_test, at
                delta = high[i].n_full - ngl[i].n_full
        else:
            ngl, cur, dense_start = high, used_high, high_start
        i += 1
    return DevicesFit(layout_of(hp_ngl, ngl), tuple(cur), targets, "moe")


def _step(delta: int, target: int, used: int, used_high: int) -> int:
    """fit's false-position step, at least 1 and at most ``delta - 1`` (l. 690-692)."""
    step = delta * (target - used) // max(used_high - used, 1)
    return min(max(step, 1), delta - 1)
