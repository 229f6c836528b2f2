"""llama.cpp's answer at one VRAM budget, made once: the recommended command, the commands
offered beside it, the default's speed, the gain and how sure it is (:func:`llamacpp_answer`).
``cope advise``, ``cope predict``, ``cope export`` and the app render this record; none of
them decides the recommendation again (docs/design.md#llamacpp-fit)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..geometry import ModelGeometry
from .baseline import FitBaseline, baseline_of
from .builds import Build
from .cache_record import BestConfig, CacheRecord
from .command import LlamaFlags
from .fit import FIT_NAME

#: how the faster configuration is offered beside a recommended default
RISK = "if you accept the risk"
#: how the best explicit placement is offered beside a default predicted faster than it
SLOWER = "the best explicit placement, predicted slower than the default"
#: how the plain placement is offered beside a MoE-cache configuration
PLAIN = "plain placement (no MoE cache; runs on every build with --n-cpu-moe)"


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
        The answer's notes, in words: what the recommendation needs and how sure it is.
    best_config : BestConfig
        The record's row of the best configuration.
    build : Build
        The llama.cpp build the answer is for (its flags, cache and default).
    newer : Offer or None
        What a newer build would run, faster (None: nothing, or the newest assumed).
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

    @property
    def keeps_default(self) -> bool:
        return self.recommended.runs == FIT_NAME


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
        recommended = Offer("llama.cpp's default", LlamaFlags.default(base.default.n_ctx),
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
        newer = Offer(f"with llama.cpp {n.build} or newer",
                      LlamaFlags.placed(n_blocks, cpu_threads, n.n_cpu_moe or None,
                                        cache_mib=n.cache_mib, cpu_share=n.cpu_share),
                      n.candidate, n.tpot_us, note=f"{n.gain_pct:+.1f} % over the best "
                                                   f"{build.label} runs")
        alternatives.append(newer)
    notes = tuple(x for x in (needs_note, verdict) if x)
    return LlamaAnswer(recommended, best, tuple(alternatives), base, needs, notes, b, build,
                       newer)
