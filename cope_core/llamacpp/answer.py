"""llama.cpp's answer at one VRAM budget, made once: the recommended command, the commands
offered beside it, the default's speed, the gain and how sure it is (:func:`llamacpp_answer`).
``cope advise``, ``cope predict``, ``cope export`` and the app render this record; none of
them decides the recommendation again (docs/design.md#llamacpp-fit)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..geometry import ModelGeometry
from ..matrix import LAYER_PARTITION
from .baseline import FitBaseline, baseline_of
from .builds import Build
from .cache_record import BestConfig, CacheRecord
from .command import LlamaFlags
from .fit import FIT_NAME
from .request import (
    DECODE_BEST,
    DEFAULT,
    PROMPT_RATIO_ERROR,
    RequestRecord,
    RequestSetting,
)
from .vram import N_BATCH, N_UBATCH

#: how the faster configuration is offered beside a recommended default
RISK = "if you accept the risk"
#: how the best explicit placement is offered beside a default predicted faster than it
SLOWER = "the best explicit placement, predicted slower than the default"
#: how the plain placement is offered beside a MoE-cache configuration
PLAIN = "plain placement (no MoE cache; runs on every build with --n-cpu-moe)"
#: how the offer of a newer build begins ("with llama.cpp b12191 or newer")
NEWER = "with llama.cpp "
#: how llama.cpp's default is named when it is offered
DEFAULT_LABEL = "llama.cpp's default"
#: how the request's fastest setting is offered when not sure enough to lead
REQUEST_RISK = "faster for this request, if you accept the risk"
#: how the decode-first answer is offered beside a request's setting that leads
FASTEST_DECODE = "fastest decode"


@dataclass(frozen=True)
class Offer:
    """One llama.cpp command with what it runs (a candidate, or
    :data:`~cope_core.llamacpp.fit.FIT_NAME`), its predicted TPOT and interval (microseconds;
    None: not predicted), and, beside the recommended one, why it is not first (``note``)."""

    label: str
    flags: LlamaFlags
    runs: str
    tpot_us: float | None
    tpot_ci_us: tuple[float, float] | None = None
    note: str = ""
    request: RequestSetting | None = None

    def command(self, model: str = "MODEL.gguf") -> str:
        return self.flags.command(model)


@dataclass(frozen=True)
class LlamaAnswer:
    """What llama.cpp should run here.

    Attributes
    ----------
    recommended : Offer
        The command to paste first: the best configuration, or the default's (no placement
        flag) when the best one's gain is not sure enough (:attr:`keeps_default`).
    best : Offer
        The best configuration llama.cpp can run at this budget (the record's first).
    alternatives : tuple of Offer
        Offered beside it: the faster configuration when the default is kept; the plain
        ``--n-cpu-moe`` placement beside a MoE-cache configuration.
    baseline : FitBaseline or None
        The default against the best (None: no VRAM budget, or fit not compared).
    needs : str or None
        The build the best configuration needs, when it uses the MoE cache.
    notes : tuple of str
        The answer's notes, in words: what the recommendation needs, then how sure it is
        (the last; for the request's time when a request is priced).
    best_config : BestConfig
        The record's row of the best configuration.
    build : Build
        The llama.cpp build the answer is for (its flags, cache and default).
    newer : Offer or None
        What a newer build would run, faster (None: nothing, or the newest assumed).
    request : RequestRecord or None
        The request priced at each ``-ub`` (None: not asked). When its fastest setting is
        another than the decode answer's and surely faster, it leads (:attr:`for_request`).
    """

    recommended: Offer
    best: Offer
    alternatives: tuple[Offer, ...]
    baseline: FitBaseline | None
    needs: str | None
    notes: tuple[str, ...]
    best_config: BestConfig
    build: Build
    newer: Offer | None = None
    request: RequestRecord | None = None

    @property
    def keeps_default(self) -> bool:
        return self.recommended.runs == FIT_NAME

    @property
    def for_request(self) -> bool:
        """Whether the recommended command is the request's fastest setting, not decode's."""
        return self.recommended.label == FOR_REQUEST


def llamacpp_answer(rec: CacheRecord, g: ModelGeometry, cpu_threads: int,
                    build: Build | None = None) -> LlamaAnswer:
    """The answer a ``llamacpp_cache`` record holds for a model (its blocks) run with
    ``cpu_threads`` threads, on ``build`` (as the user named it; default the record's)."""
    build = build if build is not None else rec.assumed
    n_blocks = g.dense_layers + g.n_layers
    b, v = rec.best[0], rec.versus[0]
    best = Offer("the best configuration llama.cpp can run",
                 build.spell(b.flags(n_blocks, cpu_threads)), b.candidate, v.tpot_us,
                 v.tpot_ci_us)
    base = baseline_of(rec)
    needs = f"needs llama.cpp {b.build} or newer (its MoE expert cache)" if b.cache_mib else None
    verdict = None if base is None else base.verdict()
    alternatives = []
    recommended = best
    if base is not None and base.recommends_default:
        assert base.tpot_us is not None
        note = base.gain() + ("" if needs is None else "; " + needs)
        alternatives.append(replace(best, label=RISK if base.best_is_faster else SLOWER,
                                    note=note))
        recommended = Offer(DEFAULT_LABEL, LlamaFlags.default(base.default.n_ctx),
                            FIT_NAME, base.tpot_us, base.tpot_ci_us)
        needs_note = None                       # said of the alternative that needs it
    else:
        needs_note = needs
    plain = next((x for x in rec.best if not x.cache_mib), None)
    if b.cache_mib and plain is not None:
        alternatives.append(Offer(PLAIN, build.spell(plain.flags(n_blocks, cpu_threads)),
                                  plain.candidate, plain.tpot_us))
    newer = None
    if (n := rec.newer) is not None:
        newer = Offer(f"{NEWER}{n.build} or newer",
                      LlamaFlags.placed(n_blocks, cpu_threads, n.n_cpu_moe or None,
                                        cache_mib=n.cache_mib, cpu_share=n.cpu_share),
                      n.candidate, n.tpot_us, note=f"{n.gain_pct:+.1f} % over the best "
                                                   f"{build.label} runs")
        alternatives.append(newer)
    notes = tuple(x for x in (needs_note, verdict) if x)
    if rec.request is not None:
        default = None if base is None or base.tpot_us is None else Offer(
            DEFAULT_LABEL, LlamaFlags.default(base.default.n_ctx), FIT_NAME, base.tpot_us,
            base.tpot_ci_us)
        extra = [o for o in alternatives if o.label not in (RISK, SLOWER)]
        recommended, alternatives, notes = _for_request(rec.request, best, default, extra,
                                                        needs, n_blocks, cpu_threads, notes,
                                                        build)
    return LlamaAnswer(recommended, best, tuple(alternatives), base, needs, notes, b, build,
                       newer, rec.request)


#: the label of a request's fastest setting when it leads
FOR_REQUEST = "the fastest setting for this request"


def _for_request(req: RequestRecord, best: Offer, default: Offer | None, others: list[Offer],
                 needs: str | None, n_blocks: int, threads: int, said_before: tuple[str, ...],
                 build: Build) -> tuple[Offer, list[Offer], tuple[str, ...]]:
    """The recommendation rule applied to the request's time: its fastest setting leads when it
    is the default or surely faster than it (:meth:`RequestRecord.surely_faster`), else the
    default leads and the fastest is offered at its risk; the decode-best configuration is
    offered beside whichever leads. ``said_before``: the decode answer's notes, kept when the
    request changes nothing; ``build`` spells the request's command."""
    d = None if default is None else req.of(DEFAULT)
    r = min((s for s in req.settings if d is not None or s.label != DEFAULT),
            key=lambda s: s.request_s)
    if d is not None and r.request_s >= d.request_s:
        r = d                                   # a tie: the default needs no flags

    def versus(a: RequestSetting, b: RequestSetting) -> str:
        return (f"request {a.request_s:.1f} s against {b.request_s:.1f} s, decode "
                f"{a.decode_tokens_per_s:.1f} against {b.decode_tokens_per_s:.1f} tokens/s")
    dec = replace(best, request=req.of(DECODE_BEST))
    base = None if default is None else replace(default, request=d)
    if r.label == DECODE_BEST:
        fastest = dec
    elif r.label == DEFAULT and base is not None:
        fastest = base
    else:
        flags = build.spell(replace(LlamaFlags.placed(n_blocks, threads, r.n_cpu_moe),
                                    n_ubatch=None if r.n_ubatch == N_UBATCH else r.n_ubatch,
                                    n_batch=None if r.n_batch == N_BATCH else r.n_batch))
        fastest = Offer(FOR_REQUEST, flags, LAYER_PARTITION, r.tpot_us, None, "", r)
    bound = (f"the prompt model's ±{100 * PROMPT_RATIO_ERROR:.0f} % between settings and decode's "
             "interval")
    if base is None or d is None or fastest is base or req.surely_faster(r, d):
        lead, rest = fastest, []
        said = "" if base is None or d is None or fastest is base else \
            f"faster for this request than the default ({versus(r, d)}) at every bound of {bound}"
    else:
        lead = base
        said = (f"the default is kept for this request: the fastest setting ({versus(r, d)}) "
                f"is not faster at every bound of {bound}")
        rest = [replace(fastest, label=REQUEST_RISK, note=versus(r, d))]
    assert dec.request is not None and lead.request is not None
    if dec is not lead and dec is not fastest \
            and dec.request.depth_tpot_us < lead.request.depth_tpot_us:
        rest.append(replace(dec, label=FASTEST_DECODE,
                            note=versus(dec.request, lead.request)
                            + ("" if needs is None else "; " + needs)))
    # the verdict last, as the decode answer's notes have it (what a lead sentence quotes)
    notes = tuple(x for x in (needs if lead is dec else None, said) if x)
    return lead, rest + others, notes or said_before
