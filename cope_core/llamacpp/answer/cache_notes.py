"""What a llama.cpp cache answer says about its own footing: the size cliff (the smallest cache
that can hit, per group) and the spread of the class-LRU's inferred rules; ``cope predict``,
the llama.cpp export and the app show these lines (docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

from ...estimate.speed import tokens_per_s
from ...geometry import ModelGeometry
from ..cache.cache_cliff import cliff_mib, group_cliffs
from ..cache.cache_readings import ReadingTpot, spread
from ..cache.moe_cache import CacheVersion
from .builds import Build, default_words, first_build
from .cache_record import CLASS_LRU_CANDIDATE, BestConfig, CacheRecord


def cliff_line(g: ModelGeometry, n_cpu: int) -> str | None:
    """The smallest ``--moe-cache-mib`` that can hit with ``n_cpu`` host MoE layers, under each
    rule, and per group under the LRU (None without host layers)."""
    lru = group_cliffs(g, n_cpu, CacheVersion.LRU)
    if not lru:
        return None
    cls = cliff_mib(g, n_cpu, CacheVersion.CLASS_LRU)
    groups = "; ".join(f"{len(c.layers)} layer{'s' if len(c.layers) > 1 else ''} "
                       f"{c.slots} slots at {c.mib} MiB" for c in lru)
    return (f"smallest --moe-cache-mib that can hit at --n-cpu-moe {g.dense_layers + n_cpu}: "
            f"LRU {cliff_mib(g, n_cpu, CacheVersion.LRU)} MiB (per group: {groups}; a group "
            f"with fewer slots evicts every expert before its layer comes back: 0 hits), "
            f"class-LRU {cls} MiB; no size below is recommended")


def row_spread(rec: CacheRecord, row: BestConfig) -> tuple[ReadingTpot, ReadingTpot] | None:
    """The fastest and slowest reading of the inferred rules for one row of ``rec.best``: the
    class-LRU's row (the configuration ``rule_readings`` replayed); None for a row whose rules
    are all read (the LRU, no cache) or a record without readings."""
    return spread(rec.rule_readings) if row.candidate == CLASS_LRU_CANDIDATE else None


def spread_text(rec: CacheRecord, row: BestConfig) -> str:
    """:func:`row_spread` in words, ``"22.081-23.034 ms under 6 readings"`` (empty without)."""
    ends = row_spread(rec, row)
    if ends is None:
        return ""
    return (f"{ends[0].tpot_us / 1e3:.3f}-{ends[1].tpot_us / 1e3:.3f} ms under "
            f"{len(rec.rule_readings)} readings")


def readings_line(rec: CacheRecord) -> str | None:
    """The class-LRU's best configuration under every reading of its inferred rules: which
    reading gives each end (None without readings)."""
    ends = spread(rec.rule_readings)
    if ends is None:
        return None
    lo, hi = ends
    covered = ("; the interval above covers them" if rec.best[0].candidate == CLASS_LRU_CANDIDATE
               else "")
    return (f"the class-LRU's clock and which misses its CPU share takes are inferred, not "
            f"read: its fastest configuration under {len(rec.rule_readings)} readings runs "
            f"{lo.tpot_us / 1e3:.3f} ms/token ({lo.reading}) to {hi.tpot_us / 1e3:.3f} "
            f"({hi.reading}); COPE's: {rec.rule_readings[0].reading}{covered}")


def cache_note_lines(rec: CacheRecord | None, g: ModelGeometry) -> list[str]:
    """The cliff at the fastest cache configuration's host layers, and the readings' spread."""
    if not rec:
        return []
    cached = next((b for b in rec.best if b.cache_mib), None)
    lines = [cliff_line(g, cached.cpu_layers) if cached else None, readings_line(rec)]
    return [x for x in lines if x]


def build_lines(rec: CacheRecord | None, build: Build | None = None) -> list[str]:
    """Which build the answer is for (``build`` as the user named it, else the record's), what
    it lacks, and one line for what a newer build would add (none when it adds nothing)."""
    b = build if build is not None else (rec.assumed if rec is not None else None)
    if b is None:
        return []
    lacks = []
    if not b.has("moe_cache"):
        lacks.append(f"no MoE expert cache (--moe-cache-mib came in b{first_build('moe_cache')})")
    elif not b.has("moe_cache_cpu_share"):
        lacks.append("no --moe-cache-cpu-share (came in "
                     f"b{first_build('moe_cache_cpu_share')})")
    if not b.n_cpu_moe_flag:
        lacks.append(f"no --n-cpu-moe (came in b{first_build('n_cpu_moe')}): placed with -ot")
    out = [f"for {b.describe()}" + (f": {'; '.join(lacks)}" if lacks else "")
           + f"; with no placement flag: {default_words(b.default_kind)}"]
    if rec is not None and rec.newer is not None:
        n = rec.newer
        out.append(f"llama.cpp {n.build} or newer would add {n.gain_pct:+.1f} % "
                   f"({tokens_per_s(n.tpot_us):.1f} tokens/s: {n.flags()})")
    return out
