"""A decode speed as users read it: tokens per second beside the time per output token.

The library computes TPOT in microseconds; everything a user reads (the CLI's tables and
winner lines, the exports' comments, ``cope advise``) shows it in ms/token and tokens/s through
these functions, so both units are always written the same way.
"""
from __future__ import annotations

import math


def tokens_per_s(tpot_us: float) -> float:
    """Decode tokens per second of a time per output token in µs (``inf`` at 0)."""
    return 1e6 / tpot_us if tpot_us > 0 else math.inf


def speed(tpot_us: float, ci_us: tuple[float, float] | None = None) -> str:
    """``"8.241 ms/token · 121.3 tokens/s"``; with an interval ``ci_us`` on TPOT,
    ``"8.241 ms/token [7.100, 9.500] · 121.3 tokens/s [105.3, 140.8]"``."""
    if ci_us is None:
        return f"{tpot_us / 1e3:.3f} ms/token · {tokens_per_s(tpot_us):.1f} tokens/s"
    lo, hi = ci_us
    return (f"{tpot_us / 1e3:.3f} ms/token [{lo / 1e3:.3f}, {hi / 1e3:.3f}] · "
            f"{tokens_per_s(tpot_us):.1f} tokens/s [{tokens_per_s(hi):.1f}, "
            f"{tokens_per_s(lo):.1f}]")


def rate(tpot_us: float, ci_us: tuple[float, float] | None = None) -> str:
    """Tokens per second first, as ``cope advise`` leads with them:
    ``"121.3 tokens/s [105.3, 140.8] (8.241 ms/token)"`` (the interval only with ``ci_us``)."""
    band = "" if ci_us is None else \
        f" [{tokens_per_s(ci_us[1]):.1f}, {tokens_per_s(ci_us[0]):.1f}]"
    return f"{tokens_per_s(tpot_us):.1f} tokens/s{band} ({tpot_us / 1e3:.3f} ms/token)"


def tokens_per_s_interval(lo_us: float, hi_us: float) -> str:
    """An interval on TPOT ``[lo, hi]`` µs as tokens per second: ``"[80.3, 95.1] tokens/s"``
    (the slow end of TPOT is the low end of the speed)."""
    return f"[{tokens_per_s(hi_us):.1f}, {tokens_per_s(lo_us):.1f}] tokens/s"
