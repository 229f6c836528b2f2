"""The record of llama.cpp's own MoE cache at one budget (``llamacpp_cache`` of cope.policy/1,
docs/formats.md#policy-copepolicy1), and the one function that searches, compares and records it
(:func:`llamacpp_record`): ``cope predict``, ``cope export`` and the app call it with the same
settings, so they agree to the digit (docs/design.md#llamacpp-moe-cache)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ...errors import CopeInputError
from ...estimate.uncertainty import DEFAULT_DRAWS
from ...geometry import GIB, ModelGeometry
from ...matrix import LAYER_PARTITION, Residency
from ...placement import k_budget_bytes
from ...platforms import PlatformSpec
from ...profile.data import Profile
from ...replay.engine import ReplayCounts
from ...trace.data import Trace
from ..cache.cache_readings import ReadingTpot, class_lru_readings, spread
from ..cache.cache_search import (
    CACHE_CANDIDATES,
    PREFIX,
    CacheSearch,
    Contender,
    compare,
    placement_tpot,
    search_cache,
)
from ..cache.moe_cache import CacheVersion
from ..placement.command import LlamaFlags
from ..placement.fit import FIT_NAME, FitDefault, fit_default
from .builds import Build, default_before_fit, latest
from .newer import Newer, newer_than, runs_mask
from .prompt import prompt_unpriced, selection_rates
from .request import Request, RequestRecord, search_request
from .settings import LlamaSettings

#: what ``best[].candidate`` may name: the placement alone, or one eviction rule's cache
RECORD_CANDIDATES = (LAYER_PARTITION,) + CACHE_CANDIDATES
#: the candidate whose prediction rests on inferred rules (the class-LRU cache's id)
CLASS_LRU_CANDIDATE = PREFIX + CacheVersion.CLASS_LRU.value
CACHE_STARTS = ("server", "prompt")


def _check(ok: bool, field: str, value: Any, want: str) -> None:
    if not ok:
        raise CopeInputError(f"expected {want}, got {value!r}", field=field)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _amount(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


@dataclass(frozen=True)
class BestConfig:
    """The fastest configuration of one candidate: its flags' values, build, slots, predicted
    TPOT (microseconds) and per-token hits, uploads and CPU misses (summed over layers)."""

    candidate: str
    build: str
    cpu_layers: int
    n_cpu_moe: int
    cache_mib: int
    cpu_share: float
    slots: int
    tpot_us: float
    hits: float
    uploads: float
    cpu_misses: float

    def __post_init__(self) -> None:
        _check(self.candidate in RECORD_CANDIDATES, "candidate", self.candidate,
               f"one of {list(RECORD_CANDIDATES)}")
        _check(isinstance(self.build, str), "build", self.build, "a string")
        for f in fields(self)[2:]:
            v = getattr(self, f.name)
            if f.type == "int":
                _check(_count(v), f.name, v, "a whole number >= 0")
            else:
                _check(_amount(v), f.name, v, "a finite number >= 0")
                object.__setattr__(self, f.name, float(v))    # JSON's 0 reads back as 0.0

    def flags(self, n_blocks: int, threads: int) -> LlamaFlags:
        """Its llama-server flags on a model of ``n_blocks`` blocks."""
        return LlamaFlags.placed(n_blocks, threads, self.n_cpu_moe or None,
                                 cache_mib=self.cache_mib, cpu_share=self.cpu_share)


@dataclass(frozen=True)
class Versus:
    """One contender under the same draws: its TPOT, 95 % interval (None without draws) and how
    often the best configuration beats it (None for the best itself, or the same row)."""

    name: str
    tpot_us: float
    tpot_ci_us: tuple[float, float] | None
    cache_faster: float | None

    def __post_init__(self) -> None:
        _check(isinstance(self.name, str) and bool(self.name), "name", self.name, "a name")
        _check(_amount(self.tpot_us), "tpot_us", self.tpot_us, "a finite number >= 0")
        ci = self.tpot_ci_us
        _check(ci is None or (isinstance(ci, tuple) and len(ci) == 2
                              and all(_amount(x) for x in ci) and ci[0] <= ci[1]),
               "tpot_ci_us", ci, "null or [lo, hi] with 0 <= lo <= hi")
        f = self.cache_faster
        _check(f is None or (_amount(f) and f <= 1), "cache_faster", f, "null or a share in [0, 1]")
        object.__setattr__(self, "tpot_us", float(self.tpot_us))
        if ci is not None:
            object.__setattr__(self, "tpot_ci_us", (float(ci[0]), float(ci[1])))
        if f is not None:
            object.__setattr__(self, "cache_faster", float(f))


@dataclass(frozen=True)
class CacheRecord:
    """llama.cpp's space searched at one budget: the fastest configuration of each candidate,
    fastest first, and the best one against the placement at K, the Policy Matrix's winner and
    llama.cpp's default (``default_fit``, its placement; its prediction is the ``versus`` row
    named :data:`~cope_core.llamacpp.placement.fit.FIT_NAME`; None in a record written without
    it). ``rule_readings``: the class-LRU's fastest configuration under every reading of its
    inferred rules (:mod:`~cope_core.llamacpp.cache.cache_readings`; empty without one, or in a
    record written before them). ``build``: the llama.cpp build the search was restricted to
    (its flags, cache and default; "" in a record written before builds, which assumed the
    newest); ``newer``: what a newer build would add (None: nothing, or the newest assumed);
    ``request``: a request priced at each ``-ub`` (:mod:`~cope_core.llamacpp.answer.request`;
    None: not
    asked, or no peaks to price a prompt with)."""

    expert_budget_gib: float
    configurations: int
    cache_start: str
    best: tuple[BestConfig, ...]
    versus: tuple[Versus, ...]
    default_fit: FitDefault | None = None
    rule_readings: tuple[ReadingTpot, ...] = ()
    build: str = ""
    newer: Newer | None = None
    request: RequestRecord | None = None

    @property
    def assumed(self) -> Build:
        """The build the record is for (the newest known when it does not say)."""
        number = int(self.build.lstrip("b")) if self.build else latest().number
        return latest() if number == latest().number else Build(number, "as recorded")

    def __post_init__(self) -> None:
        _check(isinstance(self.expert_budget_gib, (int, float))
               and not isinstance(self.expert_budget_gib, bool)
               and math.isfinite(self.expert_budget_gib) and self.expert_budget_gib >= 0,
               "expert_budget_gib", self.expert_budget_gib, "a finite size >= 0")
        object.__setattr__(self, "expert_budget_gib", float(self.expert_budget_gib))
        _check(_count(self.configurations) and self.configurations > 0, "configurations",
               self.configurations, "a whole number > 0")
        _check(self.cache_start in CACHE_STARTS, "cache_start", self.cache_start,
               "'server' or 'prompt'")
        _check(bool(self.best) and all(isinstance(b, BestConfig) for b in self.best), "best",
               self.best, "a non-empty list of configurations")
        _check(bool(self.versus) and all(isinstance(v, Versus) for v in self.versus), "versus",
               self.versus, "a non-empty list of contenders")
        _check(self.default_fit is None or isinstance(self.default_fit, FitDefault),
               "default_fit", self.default_fit, "fit's placement or null")
        _check(all(isinstance(r, ReadingTpot) for r in self.rule_readings), "rule_readings",
               self.rule_readings, "a list of readings")
        _check(self.build == "" or (isinstance(self.build, str)
                                    and self.build[:1] == "b" and self.build[1:].isdigit()),
               "build", self.build, "a build such as b12191")
        _check(self.newer is None or isinstance(self.newer, Newer), "newer", self.newer,
               "null or what a newer build adds")
        _check(self.request is None or isinstance(self.request, RequestRecord), "request",
               self.request, "null or a request priced")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (keys and order as cope.policy/1 has always written them)."""
        return {"expert_budget_gib": self.expert_budget_gib,
                "configurations": self.configurations, "cache_start": self.cache_start,
                "best": [dict(b.__dict__) for b in self.best],
                "versus": [{"name": v.name, "tpot_us": v.tpot_us,
                            "tpot_ci_us": None if v.tpot_ci_us is None else list(v.tpot_ci_us),
                            "cache_faster": v.cache_faster} for v in self.versus],
                **({} if self.default_fit is None else
                   {"default_fit": self.default_fit.to_dict()}),
                **({"rule_readings": [dict(r.__dict__) for r in self.rule_readings]}
                   if self.rule_readings else {}),
                **({"build": self.build} if self.build else {}),
                **({} if self.newer is None else {"newer": dict(self.newer.__dict__)}),
                **({} if self.request is None else {"request": self.request.to_dict()})}

    @classmethod
    def from_dict(cls, d: Any, source: str | None = None) -> CacheRecord | None:
        """Read the ``llamacpp_cache`` object (``{}``: None, a record written without it);
        anything malformed is a one-line CopeInputError naming the field."""
        where = "llamacpp_cache"
        try:
            _check(isinstance(d, Mapping), "", d, "an object")
            if not d:
                return None
            # absent from older records
            optional = ("default_fit", "rule_readings", "build", "newer", "request")
            _exactly(d, [f.name for f in fields(cls) if f.name not in optional or f.name in d],
                     "")
            best, versus = d["best"], d["versus"]
            _check(isinstance(best, list) and bool(best), "best", best, "a non-empty list")
            _check(isinstance(versus, list) and bool(versus), "versus", versus,
                   "a non-empty list")
            rows = tuple(_item(BestConfig, row, f"best[{i}]") for i, row in enumerate(best))
            vs = tuple(_item(Versus, {**row, "tpot_ci_us": _pair(row.get("tpot_ci_us"))}
                             if isinstance(row, Mapping) else row, f"versus[{i}]")
                       for i, row in enumerate(versus))
            readings = d.get("rule_readings", [])
            _check(isinstance(readings, list), "rule_readings", readings, "a list")
            rr = tuple(_item(ReadingTpot, row, f"rule_readings[{i}]")
                       for i, row in enumerate(readings))
            newer, req = d.get("newer"), d.get("request")
            return cls(d["expert_budget_gib"], d["configurations"], d["cache_start"], rows, vs,
                       _fit_of(d.get("default_fit")), rr, d.get("build", ""),
                       None if newer is None else _item(Newer, newer, "newer"),
                       None if req is None else RequestRecord.from_dict(req))
        except CopeInputError as exc:
            field = where + ("." + exc.field if exc.field else "")
            raise CopeInputError(exc.detail, source=source, field=field) from None


def _exactly(d: Mapping, keys: list[str], at: str) -> None:
    if set(d) != set(keys):
        raise CopeInputError(f"expected exactly the keys {sorted(keys)}, got {sorted(d)}",
                             field=at)


def _item(kind: type, row: Any, at: str) -> Any:
    if not isinstance(row, Mapping):
        raise CopeInputError(f"expected an object, got {row!r}", field=at)
    _exactly(row, [f.name for f in fields(kind)], at)
    try:
        return kind(**row)
    except CopeInputError as exc:
        raise CopeInputError(exc.detail, field=f"{at}.{exc.field}") from None


def _fit_of(d: Any) -> FitDefault | None:
    if d is None:
        return None
    _check(isinstance(d, Mapping), "default_fit", d, "an object")
    _exactly(d, [f.name for f in fields(FitDefault)], "default_fit")
    try:
        return FitDefault.from_dict(d)
    except (TypeError, ValueError):
        raise CopeInputError(f"expected fit's placement, got {dict(d)!r}",
                             field="default_fit") from None


def _pair(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def record_of(result: CacheSearch, versus: Sequence[Contender],
              default_fit: FitDefault | None = None,
              readings: tuple[ReadingTpot, ...] = (), build: str = "",
              newer: Newer | None = None) -> CacheRecord:
    """The record of a search and its comparison (and fit's placement, when compared). When the
    best configuration is the class-LRU's, its interval is widened to cover every reading of the
    inferred rules (``readings``)."""
    df = result.frame
    best = tuple(BestConfig(
        candidate=str(r.candidate), build=str(r.build), cpu_layers=int(r.n_cpu),
        n_cpu_moe=int(r.n_cpu_moe), cache_mib=int(r.cache_mib), cpu_share=float(r.cpu_share),
        slots=int(r.slots), tpot_us=float(r.tpot_us), hits=float(r.hits),
        uploads=float(r.uploads), cpu_misses=float(r.cpu_misses))
        for r in result.best().itertuples(index=False))
    vs = [Versus(c.name, c.tpot_us, None if not np.isfinite(c.lo_us) else (c.lo_us, c.hi_us),
                 c.cache_faster) for c in versus]
    ends = spread(readings)
    if ends and best[0].candidate == CLASS_LRU_CANDIDATE and vs[0].tpot_ci_us is not None:
        lo, hi = vs[0].tpot_ci_us
        vs[0] = Versus(vs[0].name, vs[0].tpot_us,
                       (min(lo, ends[0].tpot_us), max(hi, ends[1].tpot_us)), vs[0].cache_faster)
    return CacheRecord(
        expert_budget_gib=float(df.attrs["budget_bytes"]) / GIB, configurations=len(df),
        cache_start="server" if df.attrs["persist"] else "prompt", best=best,
        versus=tuple(vs), default_fit=default_fit, rule_readings=readings, build=build,
        newer=newer)


def expert_budget(g: ModelGeometry, experts_per_layer: int, vram_gib: float | None,
                  llama: LlamaSettings | None = None) -> float:
    """Bytes for routed experts the search gets: what llama.cpp's own count leaves of a VRAM
    budget (:meth:`LlamaSettings.fixed_bytes`), else, K given directly, K's bytes
    (:func:`cope_core.placement.k_budget_bytes`)."""
    if vram_gib is None:
        return k_budget_bytes(g, experts_per_layer)
    return vram_gib * GIB - (llama or LlamaSettings()).fixed_bytes(g)


def default_fit_of(g: ModelGeometry, vram_gib: float, llama: LlamaSettings | None = None
                   ) -> FitDefault:
    """What the build does with no placement flag at the same budget: from b7407 ``--fit``'s
    placement (it keeps its margin free, so it sees the budget plus the margin as the device's
    free memory); before, every layer on the GPU (from b6325) or none
    (:func:`~cope_core.llamacpp.answer.builds.default_before_fit`)."""
    s = llama or LlamaSettings()
    if s.runs_on.default_kind != "fit":
        return default_before_fit(s.runs_on, s.table(g), vram_gib, s.n_ctx, s.type_k, s.type_v,
                                  n_ubatch=s.n_ubatch, n_batch=s.n_batch,
                                  op_offload=s.op_offload)
    return fit_default(s.table(g), int(vram_gib * GIB) + s.margin_bytes,
                       margin_bytes=s.margin_bytes, n_ctx=s.n_ctx, type_k=s.type_k,
                       type_v=s.type_v, n_ubatch=s.n_ubatch, n_batch=s.n_batch,
                       op_offload=s.op_offload)


def llamacpp_record(trace: Trace, profile: Profile, calibration: Trace | None, *,
                    experts_per_layer: int, vram_gib: float | None, matrix_winner: str,
                    cpu_threads: int, gpu_share: float, persist: bool = True,
                    draws: int = DEFAULT_DRAWS, seed: int = 0,
                    raw_samples: Mapping[str, Sequence[float]] | None = None,
                    counts: Mapping[Residency, ReplayCounts] | None = None,
                    llama: LlamaSettings | None = None,
                    request: Request | None = None) -> CacheRecord | None:
    """Search llama.cpp's space at the budget for routed experts (:func:`expert_budget`), compare
    its best with
    ``layer_partition`` at ``experts_per_layer`` and ``matrix_winner`` under the same profile
    draws and prompt bootstrap, and record both; None when the budget is below 0 (not even the
    non-expert weights fit).

    Parameters
    ----------
    experts_per_layer, vram_gib
        K, and the VRAM budget in GiB it came from (None when K was given directly).
    persist : bool
        The cache kept across prompts (a server's, upstream's behaviour), else emptied per prompt.
    draws, seed, raw_samples
        As for the prediction (its defaults): the same draws price every contender.
    counts : mapping, optional
        The Policy Matrix's replay at ``experts_per_layer`` when the caller has it (it is
        replayed otherwise; either gives the same numbers).
    llama : LlamaSettings, optional
        The model file, context, cache types and fit margin llama.cpp runs with (default: the
        geometry's table, 4096 tokens, f16, 1 GiB). With a VRAM budget, llama.cpp's default
        (``--fit`` at the same budget, :func:`default_fit_of`) is compared too.
    request : Request, optional
        A request to price at each ``-ub``
        (:func:`~cope_core.llamacpp.answer.request.search_request`),
        with a VRAM budget and an analytic profile (its peaks price the prompt).
    """
    budget_bytes = expert_budget(trace.model, experts_per_layer, vram_gib, llama)
    if budget_bytes < 0:
        return None
    build = (llama or LlamaSettings()).runs_on
    whole = search_cache(trace, profile, budget_bytes, cpu_threads=cpu_threads,
                         gpu_share=gpu_share, persist=persist)
    # the build's share of the space; the whole space says what a newer build would add
    found = whole.subset(runs_mask(whole.frame, build))
    newer = None if build.is_latest else newer_than(
        whole.subset(runs_mask(whole.frame, latest())).best(), found.best())
    fit = None if vram_gib is None else default_fit_of(trace.model, vram_gib, llama)
    versus = compare(found, trace, profile, matrix_winner, calibration=calibration,
                     experts_per_layer=experts_per_layer, draws=draws, seed=seed,
                     raw_samples=raw_samples, counts=counts,
                     baseline=(FIT_NAME, fit.host_layers) if fit and fit.priced else None)
    rec = record_of(found, versus, fit, class_lru_readings(found, trace, profile),
                    build.label, newer)
    spec = (profile.platform or {}).get("spec")
    if request is None or vram_gib is None or not profile.analytic or not isinstance(spec, dict):
        return rec                          # a measured profile holds no peaks for a prompt
    peaks = PlatformSpec.from_dict(spec)
    if prompt_unpriced(trace.model, peaks) is not None:
        return rec                          # ranked by decode; advise says why
    return replace(rec, request=_request(rec, trace, profile, peaks, request, vram_gib,
                                         llama or LlamaSettings(), cpu_threads, gpu_share))


def _rel(v: Versus) -> float:
    """A prediction's relative half-interval (0 without one)."""
    ci = v.tpot_ci_us
    return 0.0 if ci is None or v.tpot_us <= 0 else (ci[1] - ci[0]) / 2 / v.tpot_us


def _request(rec: CacheRecord, trace: Trace, profile: Profile, spec: PlatformSpec,
             request: Request, vram_gib: float, llama: LlamaSettings, cpu_threads: int,
             gpu_share: float) -> RequestRecord:
    """The record's decode-best and default priced for ``request``, beside each ``-ub``."""
    g = trace.model

    def tpot_at(host: float, context: float) -> float:
        return float(placement_tpot(profile, g, [host], context, cpu_threads=cpu_threads,
                                    gpu_share=gpu_share)[0])
    b, v = rec.best[0], rec.versus[0]
    fit = next((x for x in rec.versus if x.name == FIT_NAME), None)
    default = None
    if fit is not None and rec.default_fit is not None and rec.default_fit.priced:
        default = (rec.default_fit.host_layers, fit.tpot_us, _rel(fit))
    return search_request(g, spec, request, vram_gib=vram_gib, llama=llama,
                          build=llama.runs_on, tpot_at=tpot_at,
                          context0=float(trace.context.mean()), threads=cpu_threads,
                          decode_best=(b.n_cpu_moe, b.cache_mib, b.cpu_layers, v.tpot_us,
                                       _rel(v)),
                          default=default, rates=selection_rates(trace.routed, g.n_experts))
