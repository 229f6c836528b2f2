"""llama.cpp's answer for one set of inputs, made once (:func:`llamacpp_answer`): the recommended
command, its verdict from the one rule (:mod:`.rule`), the commands offered beside it as typed
kinds (:class:`Kind`), and every number at one operating point: decode at the request's depth
when a request is priced, else at the trace's context. ``cope advise``, ``cope predict``,
``cope export`` and the app render this record (a policy holds it:
:attr:`cope_core.export.policy.Policy.llamacpp_answer`); none of them decides again
(docs/design.md#llamacpp-fit)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ...geometry import ModelGeometry
from ...matrix import LAYER_PARTITION
from ...placement import layer_plan
from ..placement.command import LlamaFlags
from ..placement.fit import FIT_NAME
from ..placement.vram import N_BATCH, N_UBATCH
from .baseline import FitBaseline, baseline_of
from .builds import Build
from .cache_record import BestConfig, CacheRecord
from .request import DECODE_BEST, DEFAULT, PROMPT_RATIO_ERROR, RequestRecord, RequestSetting
from .rule import share_text, sure_enough, surely_faster

Interval = tuple[float, float] | None
#: a TPOT and interval moved to the answer's operating point (by a request's setting, or None)
At = Callable[[float | None, Interval, RequestSetting | None], tuple[float | None, Interval]]
Spell = Callable[[LlamaFlags], LlamaFlags]


class Verdict(Enum):
    """What the rule decided: the words every surface says before the command."""

    FASTER = "faster than the default"          # our flags surely beat the default
    KEPT = "default kept"                       # a faster setting is not sure enough
    DEFAULT_FASTEST = "default fastest"         # the default is predicted the fastest (or same)
    UNCOMPARED = "default not priced"           # nothing to compare with: the best leads
    NO_GPU = "no GPU"                           # nothing to place


class Kind(Enum):
    """What an offer is (its label is the value, or the offer's own words for a newer build)."""

    BEST = "the best configuration llama.cpp can run"
    FOR_REQUEST = "the fastest setting for this request"
    DEFAULT = "llama.cpp's default"
    CPU_ONLY = "every weight on the CPU"
    RISK = "if you accept the risk"
    REQUEST_RISK = "faster for this request, if you accept the risk"
    SLOWER = "the best explicit placement, predicted slower than the default"
    FASTEST_DECODE = "fastest decode"
    PLAIN = "plain placement (no MoE cache; runs on every build with --n-cpu-moe)"
    NEWER = "with a newer llama.cpp"
    NEAREST = "the Policy Matrix's layer partition at K"
    NEAREST_OT = "the same placement as an explicit tensor override"

    @property
    def acted_on(self) -> bool:
        """Offered beside the command by default (the rest under ``--explain`` or in the file's
        notes)."""
        return self in (Kind.RISK, Kind.REQUEST_RISK, Kind.SLOWER, Kind.FASTEST_DECODE,
                        Kind.NEWER)


@dataclass(frozen=True)
class Offer:
    """One llama.cpp command: what it is (``kind``; ``label`` its words), its flags, what it runs
    (a candidate, :data:`~cope_core.llamacpp.placement.fit.FIT_NAME` or ``cpu_only``), its
    decode TPOT and
    interval at the answer's operating point (microseconds; None: not predicted), why it is not
    first (``note``), its request's figures and the MoE layers' worth of routed experts it keeps
    in host memory."""

    kind: Kind
    flags: LlamaFlags
    runs: str
    tpot_us: float | None
    tpot_ci_us: tuple[float, float] | None = None
    note: str = ""
    request: RequestSetting | None = None
    host_layers: float | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.kind.value)

    def command(self, model: str = "MODEL.gguf") -> str:
        return self.flags.command(model)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.name.lower(), "label": self.label, "command": self.command(),
                "runs": self.runs, "tpot_us": self.tpot_us,
                "tokens_per_s": None if self.tpot_us is None else 1e6 / self.tpot_us,
                "tpot_ci_us": None if self.tpot_ci_us is None else list(self.tpot_ci_us),
                "note": self.note, "host_layers": self.host_layers,
                "request": None if self.request is None else self.request.summary()}


@dataclass(frozen=True)
class LlamaAnswer:
    """What llama.cpp should run here.

    Attributes
    ----------
    recommended : Offer
        The one command to paste (the only one a file runs).
    verdict : Verdict
    why : str
        The verdict in words: the sentence every surface prints before the command ("" when
        there is nothing to compare).
    alternatives : tuple of Offer
        Offered beside it, each with its kind, reason and speed.
    default : Offer or None
        llama.cpp's default at the same operating point (None: not priced).
    best : Offer or None
        The fastest decode configuration llama.cpp can run (None: no search).
    baseline : FitBaseline or None
        The default against the best, as facts at the trace's context (``--explain``).
    build : Build
        The build the answer is for (its flags, cache and default).
    request : RequestRecord or None
        The request priced at each ``-ub`` (None: decode alone ranks).
    best_config : BestConfig or None
        The record's row of the best configuration.
    needs : str or None
        The build the best configuration needs, when it uses the MoE cache.
    """

    recommended: Offer
    verdict: Verdict
    why: str
    alternatives: tuple[Offer, ...]
    default: Offer | None
    best: Offer | None
    baseline: FitBaseline | None
    build: Build
    request: RequestRecord | None = None
    best_config: BestConfig | None = None
    needs: str | None = None

    @property
    def keeps_default(self) -> bool:
        return self.recommended.kind is Kind.DEFAULT

    @property
    def notes(self) -> tuple[str, ...]:
        """What the recommendation needs, then how sure it is (the last: the lead sentence)."""
        needs = self.needs if self.recommended.flags.cache_mib else None
        return tuple(x for x in (needs, self.why) if x)

    def offered(self, *kinds: Kind) -> tuple[Offer, ...]:
        """The alternatives of these kinds (all without any)."""
        return tuple(o for o in self.alternatives if not kinds or o.kind in kinds)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.name.lower(), "why": self.why,
                "recommended": self.recommended.to_dict(),
                "default": None if self.default is None else self.default.to_dict(),
                "alternatives": [o.to_dict() for o in self.alternatives],
                "build": self.build.label,
                "operating_point": "request depth" if self.request is not None
                else "trace context"}


def cpu_only_answer(threads: int, tpot_us: float, tpot_ci_us: tuple[float, float] | None,
                    build: Build) -> LlamaAnswer:
    """No GPU: every weight on the CPU, nothing to place or compare."""
    o = Offer(Kind.CPU_ONLY, LlamaFlags.cpu_only(threads), "cpu_only", tpot_us, tpot_ci_us,
              host_layers=None)
    return LlamaAnswer(o, Verdict.NO_GPU, "", (), o, None, None, build)


def llamacpp_answer(rec: CacheRecord, g: ModelGeometry, cpu_threads: int,
                    build: Build | None = None, experts_per_layer: int | None = None
                    ) -> LlamaAnswer:
    """The answer a ``llamacpp_cache`` record holds for a model run with ``cpu_threads``
    threads, on ``build`` (default the record's); ``experts_per_layer``: the Policy Matrix's K,
    whose layer partition is offered as its nearest llama.cpp translation."""
    build = build if build is not None else rec.assumed
    n_blocks = g.dense_layers + g.n_layers
    base = baseline_of(rec)
    n_ctx = None if rec.default_fit is None else rec.default_fit.n_ctx
    req = rec.request
    # every number at one operating point: a configuration the request did not price is moved
    # to its depth by the decode-best's attention difference (as request.py moves it)
    dec_req = None if req is None else req.of(DECODE_BEST)
    shift = 0.0 if dec_req is None else dec_req.depth_tpot_us - dec_req.tpot_us

    def at(tpot: float | None, ci: Interval, r: RequestSetting | None
           ) -> tuple[float | None, Interval]:
        if tpot is None:
            return None, None
        s = shift if r is None else r.depth_tpot_us - r.tpot_us
        return tpot + s, None if ci is None else (ci[0] + s, ci[1] + s)

    def flags(f: LlamaFlags) -> LlamaFlags:
        return build.spell(replace(f, n_ctx=n_ctx))

    b, v = rec.best[0], rec.versus[0]
    needs = f"needs llama.cpp {b.build} or newer (its MoE expert cache)" if b.cache_mib else None
    best = Offer(Kind.BEST, flags(b.flags(n_blocks, cpu_threads)), b.candidate,
                 *at(v.tpot_us, v.tpot_ci_us, dec_req), request=dec_req,
                 host_layers=float(b.cpu_layers))
    default = None
    if base is not None and base.tpot_us is not None:
        d_req = None if req is None else req.of(DEFAULT)
        default = Offer(Kind.DEFAULT, LlamaFlags.default(base.default.n_ctx), FIT_NAME,
                        *at(base.tpot_us, base.tpot_ci_us, d_req), request=d_req,
                        host_layers=base.default.host_layers)
    others = _others(rec, g, cpu_threads, build, flags, at, experts_per_layer)
    if req is None:
        lead, verdict, why, rest = _decide_decode(best, default, base, needs)
    else:
        lead, verdict, why, rest = _decide_request(req, best, default, needs, n_blocks,
                                                   cpu_threads, flags, at)
    return LlamaAnswer(lead, verdict, why, tuple(rest + others), default, best, base, build,
                       req, b, needs)


def _others(rec: CacheRecord, g: ModelGeometry, threads: int, build: Build, flags: Spell,
            at: At, k: int | None) -> list[Offer]:
    """The offers whichever leads: the plain placement beside a MoE-cache configuration, what a
    newer build runs, and the Policy Matrix's layer partition at K (both spellings)."""
    n_blocks = g.dense_layers + g.n_layers
    out = []
    b = rec.best[0]
    plain = next((x for x in rec.best if not x.cache_mib), None)
    near = layer_plan(g, k) if k is not None else None
    same = near is not None and plain is not None and plain.n_cpu_moe == near.n_cpu_moe
    if b.cache_mib and plain is not None and not same:     # else offered as the nearest below
        out.append(Offer(Kind.PLAIN, flags(plain.flags(n_blocks, threads)), plain.candidate,
                         *at(plain.tpot_us, None, None), host_layers=float(plain.cpu_layers)))
    if (n := rec.newer) is not None:
        out.append(Offer(Kind.NEWER, flags(LlamaFlags.placed(
            n_blocks, threads, n.n_cpu_moe or None, cache_mib=n.cache_mib,
            cpu_share=n.cpu_share)), n.candidate, *at(n.tpot_us, None, None),
            note=f"{n.gain_pct:+.1f} % over the best {build.label} runs",
            label=f"with llama.cpp {n.build} or newer"))
    # compare's contender at K's placement (the record's first row may be a layer partition too)
    row = next((x for x in rec.versus if x.name.startswith(f"{LAYER_PARTITION} at K")), None)
    if near is not None and row is not None:
        plan = near
        short, explicit = (flags(f) for f in LlamaFlags.of_plan(plan, threads))
        tpot, ci = at(row.tpot_us, row.tpot_ci_us, None)
        why = (f"K = {k}: {plan.n_gpu} of {g.n_layers} MoE layers' experts on the GPU, the most "
               "whose experts fit K's bytes")
        out += [Offer(Kind.NEAREST, short, LAYER_PARTITION, tpot, ci, why,
                      host_layers=float(plan.n_cpu)),
                Offer(Kind.NEAREST_OT, explicit, LAYER_PARTITION, tpot, ci, why,
                      host_layers=float(plan.n_cpu))]
    return out


def _decide_decode(best: Offer, default: Offer | None, base: FitBaseline | None,
                   needs: str | None) -> tuple[Offer, Verdict, str, list[Offer]]:
    """Decode ranks: the best leads when it is faster in at least the level's share of the
    paired draws (:func:`~.rule.sure_enough`), else the default leads and the best is offered
    at its risk (or as slower); the same placement needs no flags."""
    if default is None or base is None:
        return best, Verdict.UNCOMPARED, "", []
    if base.same_placement:
        who = "--fit places" if base.fit else "the default places"
        return (default, Verdict.DEFAULT_FASTEST,
                f"{who} the model the same way: the default needs no flags", [])
    share = base.faster_share
    if share is None:                       # no draws: the prediction alone
        if base.best_is_faster:
            return best, Verdict.FASTER, "predicted faster than the default (no paired draws)", []
        return default, Verdict.DEFAULT_FASTEST, "the default is predicted as fast: keep it", []
    said = f"faster than the default in {share_text(share)} % of the paired draws"
    if sure_enough(share):
        return best, Verdict.FASTER, said, []
    kind = Kind.RISK if base.best_is_faster else Kind.SLOWER
    note = base.gain() + ("" if needs is None else "; " + needs)
    why = said + (": not sure enough, keep the default" if base.best_is_faster
                  else ": keep the default")
    return default, Verdict.KEPT, why, [replace(best, kind=kind, label=kind.value, note=note)]


def _versus(a: RequestSetting, b: RequestSetting) -> str:
    pinned = (f"; loaded without mmap, it pins its {a.pinned_gib:.1f} GiB of host experts in "
              "host memory"
              if a.pinned and not b.pinned else "")
    return (f"request {a.request_s:.1f} s against {b.request_s:.1f} s, decode "
            f"{a.decode_tokens_per_s:.1f} against {b.decode_tokens_per_s:.1f} tokens/s{pinned}")


def _decide_request(req: RequestRecord, best: Offer, default: Offer | None, needs: str | None,
                    n_blocks: int, threads: int, flags: Spell, at: At
                    ) -> tuple[Offer, Verdict, str, list[Offer]]:
    """A request ranks: its fastest setting leads when it is the default or surely faster than
    it at every bound (:func:`~.rule.surely_faster`), else the default leads and the fastest is
    offered at its risk; the decode-best configuration is offered beside whichever leads when
    it decodes faster."""
    d = None if default is None else default.request
    r = min((s for s in req.settings if d is not None or s.label != DEFAULT),
            key=lambda s: s.request_s)
    if d is not None and r.request_s >= d.request_s:
        r = d                                   # a tie: the default needs no flags
    if r.label == DECODE_BEST:
        fastest = best
    elif r.label == DEFAULT and default is not None:
        fastest = default
    else:
        fastest = Offer(Kind.FOR_REQUEST, _request_flags(r, default, n_blocks, threads, flags),
                        LAYER_PARTITION, *at(r.tpot_us, None, r), request=r,
                        host_layers=r.host_layers)
    bound = (f"the prompt model's ±{100 * PROMPT_RATIO_ERROR:.0f} % between settings and decode's "
             "interval")
    rest: list[Offer] = []
    if default is None or d is None:
        lead, verdict, why = fastest, Verdict.UNCOMPARED, ""
    elif fastest is default:
        lead, verdict = default, Verdict.DEFAULT_FASTEST
        why = "the default is the fastest setting priced for this request"
    elif surely_faster(r.bounds(), d.bounds()):
        lead, verdict = fastest, Verdict.FASTER
        why = (f"faster for this request than the default ({_versus(r, d)}) at every bound of "
               f"{bound}")
    else:
        lead, verdict = default, Verdict.KEPT
        why = (f"the default is kept for this request: the fastest setting ({_versus(r, d)}) "
               f"is not faster at every bound of {bound}")
        rest.append(replace(fastest, kind=Kind.REQUEST_RISK, label=Kind.REQUEST_RISK.value,
                        note=_versus(r, d)))
    dec, led = best.request, lead.request
    if best is not lead and best is not fastest and dec is not None and led is not None \
            and dec.depth_tpot_us < led.depth_tpot_us:
        rest.append(replace(best, kind=Kind.FASTEST_DECODE, label=Kind.FASTEST_DECODE.value,
                            note=_versus(dec, led) + ("" if needs is None else "; " + needs)))
    return lead, verdict, why, rest


def _request_flags(r: RequestSetting, default: Offer | None, n_blocks: int, threads: int,
                   flags: Spell) -> LlamaFlags:
    """A searched setting's command, the smallest change from the default: where it places the
    experts as the default does (all on the GPU), the default's command with ``-b``/``-ub``."""
    ub = None if r.n_ubatch == N_UBATCH else r.n_ubatch
    b = None if r.n_batch == N_BATCH else r.n_batch
    if default is not None and not r.n_cpu_moe and not default.host_layers:
        return replace(default.flags, n_ubatch=ub, n_batch=b, no_mmap=r.pinned)
    return flags(replace(LlamaFlags.placed(n_blocks, threads, r.n_cpu_moe), n_ubatch=ub,
                         n_batch=b, no_mmap=r.pinned))
