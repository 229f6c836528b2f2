"""llama.cpp's default as the baseline of every llama.cpp answer: the placement ``--fit`` (on by
default) chooses, priced like every other configuration, and what the best configuration gains
over it, as facts (docs/design.md#llamacpp-fit). Whether that gain is worth pasting our flags is
the rule's (:mod:`.rule`), applied once by :mod:`.answer`.

A user who types ``llama-server -m model.gguf`` gets fit's placement
(:func:`~cope_core.llamacpp.placement.fit.fit`). Our flags switch it off: ``-fit off`` does, and
so does any of ``--n-cpu-moe``, ``-ot`` or an explicit ``-ngl`` on its own (fit aborts its
placement when the user set one, common/fit.cpp l. 461-486 of b11434).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...matrix import LAYER_PARTITION
from ..placement.command import LlamaFlags
from ..placement.fit import FIT_NAME, FitArgs, FitDefault
from .cache_record import CacheRecord
from .rule import share_text

#: which of our flags switch fit off (common/arg.cpp; common/fit.cpp l. 461-486 of b11434)
SWITCHES_OFF = ("-fit off switches --fit off; so would --n-cpu-moe, -ot or an explicit -ngl on "
                "its own (fit then keeps the user's placement)")
US = 1e6


@dataclass(frozen=True)
class FitBaseline:
    """llama.cpp's default against the best configuration, under the same draws: facts, no
    verdict (the rule is :mod:`.rule`'s, applied by :mod:`.answer`).

    Attributes
    ----------
    default : FitDefault
        Fit's placement (``args``, ``describe()``, ``host_layers``).
    tpot_us, tpot_ci_us
        Its predicted TPOT and 95 % interval (None: not priced, or no draws).
    recommended : str
        The best configuration llama.cpp can run, as its flags in short.
    recommended_tpot_us, recommended_ci_us
        Its TPOT and interval.
    faster_share : float or None
        The share of paired draws the best configuration is faster in.
    fit : bool
        Whether the default is ``--fit``'s (the build has it, b7407+), else every layer on the
        GPU or none (:func:`~cope_core.llamacpp.answer.builds.default_before_fit`).
    """

    default: FitDefault
    tpot_us: float | None
    tpot_ci_us: tuple[float, float] | None
    recommended: str
    recommended_tpot_us: float
    recommended_ci_us: tuple[float, float] | None
    faster_share: float | None
    fit: bool = True

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tpot_us is None else US / self.tpot_us

    @property
    def recommended_tokens_per_s(self) -> float:
        return US / self.recommended_tpot_us

    @property
    def gain_pct(self) -> float | None:
        """Tokens per second of the best configuration over the default's, in %."""
        return None if self.tpot_us is None else 100.0 * (self.tpot_us / self.recommended_tpot_us
                                                          - 1.0)

    @property
    def same_placement(self) -> bool:
        """fit places the model as the best configuration does (the same prediction)."""
        return self.tpot_us is not None and self.tpot_us == self.recommended_tpot_us

    @property
    def best_is_faster(self) -> bool:
        return self.tpot_us is not None and self.tpot_us > self.recommended_tpot_us

    def faster(self) -> str:
        """``faster in S % of draws`` (empty without draws)."""
        return "" if self.faster_share is None else \
            f"faster in {share_text(self.faster_share)} % of draws"

    def gain(self) -> str:
        """``+G.g %, faster in S % of draws``: the gain as offered beside the default."""
        g = f"{self.gain_pct:+.1f} %" if self.gain_pct is not None else "faster"
        return g + ("" if self.faster_share is None else ", " + self.faster())

    def lines(self) -> list[str]:
        """The facts under ``--explain``: the default's placement and speed, the best runnable
        configuration's, the gain and the share of draws (decode at the trace's context)."""
        d = self.default
        how = "--fit, no placement flag" if self.fit else "no placement flag"
        head = f"llama.cpp's default ({how}) places {d.describe()}"
        rec = (f"the best runnable configuration ({self.recommended}) at "
               f"{_speed(self.recommended_tpot_us, self.recommended_ci_us)}")
        if self.tpot_us is None:
            return [f"{head}: not priced ({d.why_not_priced}); {rec}"] + \
                ([SWITCHES_OFF] if self.fit else [])
        gain = self.gain_pct or 0.0
        share = "" if self.faster_share is None else f" ({self.faster()})"
        placed = (f"fit's placement: {short_args(d.args)}; {SWITCHES_OFF}" if self.fit else
                  f"the default's placement: {d.args}")
        return [f"{head}: {_speed(self.tpot_us, self.tpot_ci_us)}; {rec}, {gain:+.1f} %"
                f"{share} (decode at the trace's context)", placed]

    def to_dict(self) -> dict[str, Any]:
        return {"default": self.default.to_dict(), "tpot_us": self.tpot_us,
                "tpot_ci_us": None if self.tpot_ci_us is None else list(self.tpot_ci_us),
                "tokens_per_s": self.tokens_per_s, "recommended": self.recommended,
                "recommended_tpot_us": self.recommended_tpot_us,
                "recommended_ci_us": None if self.recommended_ci_us is None
                else list(self.recommended_ci_us),
                "recommended_tokens_per_s": self.recommended_tokens_per_s,
                "gain_pct": self.gain_pct, "faster_share": self.faster_share}


def short_args(args: str, keep: int = 2) -> str:
    """Fit's arguments with the ``-ot`` list cut to its first ``keep`` patterns, written from
    their flags (:meth:`~cope_core.llamacpp.placement.fit.FitArgs.short`; a plain string is read as
    llama-fit-params' line first)."""
    return FitArgs.read(args).short(keep)


def _speed(tpot_us: float, ci: tuple[float, float] | None) -> str:
    s = f"{US / tpot_us:.1f} tok/s"
    return s if ci is None else s + f" [{US / ci[1]:.1f}, {US / ci[0]:.1f}]"


def recommended_flags(rec: CacheRecord) -> str:
    """The best configuration's llama.cpp flags, in short (placement and cache)."""
    b = rec.best[0]
    short = LlamaFlags(n_cpu_moe=b.n_cpu_moe, cache_mib=b.cache_mib, cpu_share=b.cpu_share)
    return short.short() + ("" if b.candidate == LAYER_PARTITION else f", {b.candidate}")


def baseline_of(rec: CacheRecord | None) -> FitBaseline | None:
    """The baseline a ``llamacpp_cache`` record holds (None: no record, or written without a
    VRAM budget or before fit was compared)."""
    if rec is None or rec.default_fit is None:
        return None
    v = next((v for v in rec.versus if v.name == FIT_NAME), None)
    best = rec.versus[0]
    return FitBaseline(rec.default_fit, None if v is None else v.tpot_us,
                       None if v is None else v.tpot_ci_us, recommended_flags(rec),
                       best.tpot_us, best.tpot_ci_us, None if v is None else v.cache_faster,
                       rec.assumed.default_kind == "fit")
