"""llama.cpp's own MoE-cache counters, read from a ``llama-server`` log and set against the replay
(docs/design.md#llamacpp-moe-cache).

The lines (ggml-org/llama.cpp ``src/llama-moe-cache.cpp`` @4b060f27, b11480): at start, per
device ``"%s: %10s MoE cache size = %8.2f MiB for %.2f MiB of host experts"`` and per group
``"%s: %2zu layers, %s: %5d slots (%.1f%%)"`` (the type is the group's last bank, the down
projection); at exit (``log_stats``, from the destructor) ``"llama_moe_cache: %s: hits = %zu,
misses = %zu, hit rate = %.2f%%, uploaded = %.2f MiB"`` for ``ubatch <= 8`` (decode) and
``ubatch  > 8``. A hit is a distinct expert of a layer lookup found cached, a miss one uploaded.
b12191's exit line could not be read; a line that keeps these fields reads the same.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import CopeInputError
from ...trace.data import Trace
from .moe_cache import CacheConfig, cache_layout, replay_cache

_STATS = re.compile(r"llama_moe_cache: (ubatch <= 8|ubatch  > 8): hits = (\d+), misses = (\d+), "
                    r"hit rate = ([0-9.]+)%, uploaded = ([0-9.]+) MiB")
_GROUP = re.compile(r": +(\d+) layers, (\w+): +(\d+) slots \(([0-9.]+)%\)")
_SIZE = re.compile(r"MoE cache size = +([0-9.]+) MiB for ([0-9.]+) MiB of host experts")


@dataclass(frozen=True)
class CacheLog:
    """What one ``llama-server`` run logged about its MoE cache.

    ``groups``: (layers, down type, slots) per group at start; ``decode``: (hits, misses,
    uploaded MiB) of the ``ubatch <= 8`` line; ``size_mib``: the device's cache buffer."""

    groups: tuple[tuple[int, str, int], ...]
    decode: tuple[int, int, float]
    size_mib: float | None

    @property
    def hit_rate(self) -> float:
        h, m, _ = self.decode
        return h / (h + m) if h + m else float("nan")


def read_cache_log(path: str | Path) -> CacheLog:
    """Parse a log file; one-line errors name the file and the line that is missing."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise CopeInputError(f"cannot read: {exc.strerror}", source=str(path)) from None
    return parse_cache_log(text, str(path))


def parse_cache_log(text: str, source: str | None = None) -> CacheLog:
    stats = {m.group(1): m for m in _STATS.finditer(text)}
    if "ubatch <= 8" not in stats:
        raise CopeInputError("no 'llama_moe_cache: ubatch <= 8: hits = ..., misses = ...' line "
                             "(llama-server prints it at exit, with --moe-cache-mib > 0)",
                             source=source, field="log")
    d = stats["ubatch <= 8"]
    groups = tuple((int(m.group(1)), m.group(2), int(m.group(3))) for m in _GROUP.finditer(text))
    size = _SIZE.search(text)
    return CacheLog(groups, (int(d.group(2)), int(d.group(3)), float(d.group(5))),
                    float(size.group(1)) if size else None)


@dataclass(frozen=True)
class LogCheck:
    """The replay of one configuration against the counters one server run logged."""

    predicted_slots: tuple[int, ...]
    logged_slots: tuple[int, ...]
    predicted_hit_rate: float
    logged_hit_rate: float
    predicted_hits: int
    predicted_misses: int
    logged: CacheLog

    def lines(self) -> list[str]:
        same = "as logged" if self.predicted_slots == self.logged_slots or not self.logged_slots \
            else f"logged {list(self.logged_slots)}"
        h, m, mib = self.logged.decode
        return [f"slots per group: {list(self.predicted_slots)} ({same})",
                f"decode hit rate: predicted {100 * self.predicted_hit_rate:.2f} % "
                f"({self.predicted_hits} hits, {self.predicted_misses} uploads) | logged "
                f"{100 * self.logged_hit_rate:.2f} % ({h} hits, {m} misses, {mib:.2f} MiB "
                "uploaded)"]


def check_cache_log(trace: Trace, config: CacheConfig, log: CacheLog, *,
                    persist: bool = True) -> LogCheck:
    """Replay ``config`` over ``trace`` (the routing the server decoded) and set its hit rate and
    slot counts beside the log's. The log counts a miss computed on the CPU (b12191) in a way
    that could not be read: with a CPU share the comparison uses uploads only."""
    lay = cache_layout(trace.model, config.n_cpu, config.cache_mib)
    total = replay_cache(trace, [config], persist=persist).totals()
    hits, ups = int(total["hits"][0].sum()), int(total["uploads"][0].sum())
    return LogCheck(tuple(g.n_slots for g in lay.groups if g.n_slots),
                    tuple(s for _, _, s in log.groups), hits / (hits + ups) if hits + ups
                    else float("nan"), log.hit_rate, hits, ups, log)
