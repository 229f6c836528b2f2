"""The class-LRU's inferred rules, stated as a spread: its fastest configuration replayed and
priced under every plausible reading of what upstream's readable source does not show
(``llamacpp.moe_cache.READINGS``: the clock a key's age is read on, and which misses the CPU share
takes), so a prediction can say how far it rests on COPE's reading
(docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import CopeInputError
from ...estimate.costs import cope_costs
from ...profile.data import Profile
from ...trace.data import Trace
from .cache_search import CacheSearch, cache_costs, expert_tpot
from .moe_cache import OURS, READINGS, CacheCounts, CacheVersion, replay_cache


@dataclass(frozen=True)
class ReadingTpot:
    """One reading's prediction of a configuration: TPOT (microseconds) and hits per token
    (summed over layers)."""

    reading: str
    tpot_us: float
    hits: float

    def __post_init__(self) -> None:
        if not isinstance(self.reading, str) or not self.reading:
            raise CopeInputError(f"expected a reading's name, got {self.reading!r}",
                                 field="reading")
        for name in ("tpot_us", "hits"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise CopeInputError(f"expected a finite number >= 0, got {v!r}", field=name)
            object.__setattr__(self, name, float(v))


def class_lru_readings(found: CacheSearch, trace: Trace, profile: Profile
                       ) -> tuple[ReadingTpot, ...]:
    """The class-LRU's fastest configuration of ``found`` under every reading, COPE's first
    (its numbers are the search's own); empty when the search has no class-LRU configuration.

    Only the counts change between readings: the same operating point and rows price each."""
    df = found.frame
    best = found.best()
    rows = best[best["version"] == CacheVersion.CLASS_LRU.value]
    if not len(rows):
        return ()
    i = int(rows.index[0])
    cfg, layout = found.counts.configs[i], found.counts.layouts[i]
    op = profile.resolve(df.attrs["cpu_threads"], df.attrs["gpu_share"], model=trace.model)
    costs = cache_costs(op)
    shared = cope_costs(op).shared_per_prompt(trace.context, trace.prompt_start)
    tokens = trace.tokens_per_prompt
    others = [r for r in READINGS if r != OURS]
    # the other readings in one replay: the kernel runs them on parallel threads
    replayed = replay_cache(trace, [cfg] * len(others), persist=bool(df.attrs["persist"]),
                            reading=others)
    out = []
    for r in READINGS:
        j = others.index(r) if r != OURS else -1
        counts = CacheCounts((cfg,), (layout,), found.counts.cnt[i:i + 1] if j < 0 else
                             replayed.cnt[j:j + 1])
        tpot = expert_tpot(counts, costs, tokens)[0] + shared
        hits = counts.per_token(tokens)["hits"][0]
        out.append(ReadingTpot(r.label, float(np.mean(tpot)), float(np.mean(hits))))
    return tuple(out)


def spread(readings: tuple[ReadingTpot, ...]) -> tuple[ReadingTpot, ReadingTpot] | None:
    """The fastest and the slowest reading (ties to the earlier, COPE's first); None without."""
    if not readings:
        return None
    lo = min(readings, key=lambda r: r.tpot_us)
    hi = max(readings, key=lambda r: r.tpot_us)
    return lo, hi
