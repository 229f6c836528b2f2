"""The one recommendation rule (docs/design.md#llamacpp-fit): a configuration is recommended over
llama.cpp's default only when it is faster at the intervals' level, whatever is ranked. Decode
alone is ranked by paired draws (:func:`sure_enough`: faster in at least :data:`KEEP_LEVEL` of
them); a request by the bounds of its time (:func:`surely_faster`: the configuration's slowest
bound beats the default's fastest). :mod:`.answer` applies it once per answer; every surface
prints that answer's verdict, and shares as :func:`share_text` writes them."""
from __future__ import annotations

import math

from ...estimate.uncertainty import LEVEL

#: the best configuration is worth its flags when it is faster in at least this share of the
#: paired draws (the intervals' level); below it: keep the default
KEEP_LEVEL = LEVEL


def sure_enough(faster_share: float) -> bool:
    """Decode: a configuration is recommended over the default only when it is faster in at
    least :data:`KEEP_LEVEL` of the paired draws."""
    return faster_share >= KEEP_LEVEL


def surely_faster(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """A request: ``a`` (its fastest and slowest plausible time) is recommended over ``b`` only
    when its slowest bound is below ``b``'s fastest."""
    return a[1] < b[0]


def share_text(x: float) -> str:
    """A share of draws in percent, as every surface prints it: whole; one decimal, rounded
    down, where rounding would show the level (95) for a share below it (0.949: "94.9")."""
    pct = 100.0 * x
    if not sure_enough(x) and round(pct) >= 100 * KEEP_LEVEL:
        return f"{math.floor(pct * 10 + 1e-9) / 10:.1f}"
    return f"{pct:.0f}"
