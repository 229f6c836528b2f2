"""llama.cpp's default as the baseline of every llama.cpp answer: the placement ``--fit`` (on by
default) chooses, priced like every other configuration, and what the recommended configuration
gains over it (docs/design.md#llamacpp-fit).

A user who types ``llama-server -m model.gguf`` gets fit's placement
(:func:`~cope_core.llamacpp.fit.fit`). Our flags switch it off: ``-fit off`` does, and
so does any of ``--n-cpu-moe``, ``-ot`` or an explicit ``-ngl`` on its own (fit aborts its
placement when the user set one, common/fit.cpp l. 461-486 of b11434). So the answer says
whether pasting them is worth it: the gain and the share of paired draws the recommended
configuration is faster in; below :data:`KEEP_LEVEL` the answer is "keep the default".
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CopeInputError
from ..estimate.uncertainty import DEFAULT_DRAWS, LEVEL
from ..geometry import DEFAULT_CONTEXT, GIB, ModelGeometry
from ..matrix import LAYER_PARTITION
from ..profile.data import Profile
from ..trace.data import Trace
from .bench_eval import NCMOE_PATTERN
from .cache_record import CacheRecord, LlamaSettings, llamacpp_record
from .fit import FIT_MARGIN, FIT_NAME, FitDefault
from .vram import (
    DeviceMemory,
    LlamaModel,
    Placement,
    device_memory,
    read_llama_model,
    row_bytes,
)

#: the recommended configuration is worth its flags when it is faster in at least this share
#: of the paired draws (the intervals' level); below it: keep the default
KEEP_LEVEL = LEVEL
#: which of our flags switch fit off (common/arg.cpp; common/fit.cpp l. 461-486 of b11434)
SWITCHES_OFF = ("-fit off switches --fit off; so would --n-cpu-moe, -ot or an explicit -ngl on "
                "its own (fit then keeps the user's placement)")
US = 1e6


@dataclass(frozen=True)
class FitBaseline:
    """llama.cpp's default against the recommended configuration, under the same draws.

    Attributes
    ----------
    default : FitDefault
        Fit's placement (``args``, ``describe()``, ``host_layers``).
    tpot_us, tpot_ci_us
        Its predicted TPOT and 95 % interval (None: not priced, or no draws).
    recommended : str
        The best configuration llama.cpp can run, as its flags.
    recommended_tpot_us, recommended_ci_us
        Its TPOT and interval.
    faster_share : float or None
        The share of paired draws the recommended configuration is faster in.
    """

    default: FitDefault
    tpot_us: float | None
    tpot_ci_us: tuple[float, float] | None
    recommended: str
    recommended_tpot_us: float
    recommended_ci_us: tuple[float, float] | None
    faster_share: float | None

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tpot_us is None else US / self.tpot_us

    @property
    def recommended_tokens_per_s(self) -> float:
        return US / self.recommended_tpot_us

    @property
    def gain_pct(self) -> float | None:
        """Tokens per second of the recommended configuration over the default's, in %."""
        return None if self.tpot_us is None else 100.0 * (self.tpot_us / self.recommended_tpot_us
                                                          - 1.0)

    @property
    def keep_default(self) -> bool:
        """Whether the gain is within the interval: the recommended configuration is faster in
        fewer than :data:`KEEP_LEVEL` of the paired draws (or not faster at all)."""
        if self.tpot_us is None:
            return False
        if self.faster_share is None:
            return self.recommended_tpot_us >= self.tpot_us
        return self.faster_share < KEEP_LEVEL

    def lines(self) -> list[str]:
        """The answer's lead: the default, the best runnable configuration, the verdict."""
        d = self.default
        head = f"llama.cpp's default (--fit, no placement flag) places {d.describe()}"
        rec = (f"the best runnable configuration ({self.recommended}) at "
               f"{_speed(self.recommended_tpot_us, self.recommended_ci_us)}")
        if self.tpot_us is None:
            return [f"{head}: not priced ({d.why_not_priced}); {rec}", SWITCHES_OFF]
        gain = self.gain_pct or 0.0
        share = "" if self.faster_share is None else \
            f" (faster in {_share(self.faster_share)} % of draws)"
        verdict = (f"keep the default (llama-server -m MODEL.gguf -c {d.n_ctx}, no placement "
                   "flag): the gain is within the interval" if self.keep_default
                   else "our flags are worth pasting")
        return [f"{head}: {_speed(self.tpot_us, self.tpot_ci_us)}; {rec}, {gain:+.1f} %"
                f"{share}: {verdict}", f"fit's placement: {short_args(d.args)}; {SWITCHES_OFF}"]

    def to_dict(self) -> dict[str, Any]:
        return {"default": self.default.to_dict(), "tpot_us": self.tpot_us,
                "tpot_ci_us": None if self.tpot_ci_us is None else list(self.tpot_ci_us),
                "tokens_per_s": self.tokens_per_s, "recommended": self.recommended,
                "recommended_tpot_us": self.recommended_tpot_us,
                "recommended_ci_us": None if self.recommended_ci_us is None
                else list(self.recommended_ci_us),
                "recommended_tokens_per_s": self.recommended_tokens_per_s,
                "gain_pct": self.gain_pct, "faster_share": self.faster_share,
                "keep_default": self.keep_default}


def short_args(args: str, keep: int = 2) -> str:
    """Fit's arguments with the ``-ot`` list cut to its first ``keep`` patterns."""
    head, sep, pats = args.partition(' -ot "')
    items = pats.rstrip('"').split(",") if sep else []
    if len(items) <= keep:
        return args
    return f'{head} -ot "{",".join(items[:keep])},…" ({len(items)} patterns)'


def _share(x: float) -> str:
    """A share in percent, whole; one decimal, rounded down, where rounding would show the
    level (95) for a share below it."""
    pct = 100.0 * x
    if x < KEEP_LEVEL and round(pct) >= 100 * KEEP_LEVEL:
        return f"{math.floor(pct * 10 + 1e-9) / 10:.1f}"
    return f"{pct:.0f}"


def _speed(tpot_us: float, ci: tuple[float, float] | None) -> str:
    s = f"{US / tpot_us:.1f} tok/s"
    return s if ci is None else s + f" [{US / ci[1]:.1f}, {US / ci[0]:.1f}]"


def recommended_flags(rec: CacheRecord) -> str:
    """The best configuration's llama.cpp flags, in short (placement and cache)."""
    b = rec.best[0]
    out = f"--n-cpu-moe {b.n_cpu_moe}" if b.n_cpu_moe else "every expert on the GPU"
    if b.cache_mib:
        out += f" --moe-cache-mib {b.cache_mib}"
    if b.cpu_share:
        out += f" --moe-cache-cpu-share {b.cpu_share:g}"
    return out + ("" if b.candidate == LAYER_PARTITION else f", {b.candidate}")


def baseline_of(rec: CacheRecord | None) -> FitBaseline | None:
    """The baseline a ``llamacpp_cache`` record holds (None: no record, or written without a
    VRAM budget or before fit was compared)."""
    if rec is None or rec.default_fit is None:
        return None
    v = next((v for v in rec.versus if v.name == FIT_NAME), None)
    best = rec.versus[0]
    return FitBaseline(rec.default_fit, None if v is None else v.tpot_us,
                       None if v is None else v.tpot_ci_us, recommended_flags(rec),
                       best.tpot_us, best.tpot_ci_us, None if v is None else v.cache_faster)


def llama_settings(model: str | os.PathLike | LlamaModel | None, *,
                   n_ctx: int = DEFAULT_CONTEXT, margin_bytes: int = FIT_MARGIN,
                   type_k: str = "f16", type_v: str = "f16") -> LlamaSettings:
    """:class:`LlamaSettings` from a GGUF file's path (its header is read), a table, or None
    (made from the priced geometry); the context must be a positive whole number."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise CopeInputError(f"expected a positive whole number of tokens, got {n_ctx!r}",
                             field="--ctx")
    for flag, t in (("--cache-type-k", type_k), ("--cache-type-v", type_v)):
        try:
            row_bytes(t, 256)
        except CopeInputError as exc:
            raise CopeInputError(exc.detail, field=flag) from None
    table = read_llama_model(model) if isinstance(model, (str, os.PathLike)) else model
    return LlamaSettings(table, n_ctx, type_k, type_v, int(margin_bytes))


def default_fit_baseline(model: str | os.PathLike | LlamaModel | ModelGeometry | None,
                         vram_gib: float, trace: Trace, profile: Profile,
                         calibration: Trace | None = None, *, n_ctx: int = DEFAULT_CONTEXT,
                         margin_bytes: int = FIT_MARGIN, type_k: str = "f16",
                         type_v: str = "f16", cpu_threads: int | None = None,
                         gpu_share: float | None = None, persist: bool = True,
                         draws: int = DEFAULT_DRAWS, seed: int = 0,
                         raw_samples: Mapping[str, Sequence[float]] | None = None
                         ) -> FitBaseline | None:
    """llama.cpp's default (``--fit``) for a model at a VRAM budget, priced, against the best
    configuration llama.cpp can run there.

    Signature kept stable (``cope advise`` calls it).

    Parameters
    ----------
    model : path, LlamaModel, ModelGeometry or None
        The model file: a GGUF (its header's tensor table), a table, or a catalog geometry
        (e.g. ``resolve_model("qwen3-30b-a3b", "Q4_K_M")``, its table made by
        :func:`~cope_core.llamacpp.vram.llama_model_of`); a geometry re-labels the
        trace as it. None: the trace's own geometry.
    vram_gib : float
        The budget in GiB both get: the recommended configuration's flags use up to it by
        llama.cpp's own count; fit sees it plus ``margin_bytes`` free, so keeps the same target.
    trace, profile, calibration
        Routing and costs, as for :func:`~cope_core.estimate.predict.predict`.
    n_ctx, type_k, type_v : int, str
        ``-c``, ``-ctk``, ``-ctv`` (the KV cache on the GPU).
    margin_bytes : int
        ``-fitt`` (1 GiB, llama.cpp's default).
    cpu_threads, gpu_share
        The operating point (the profile's defaults).
    persist, draws, seed, raw_samples
        As for :func:`~cope_core.llamacpp.cache_record.llamacpp_record`.

    Returns
    -------
    FitBaseline or None
        None when nothing but the routed experts fits the budget (no configuration to run).
    """
    if isinstance(model, ModelGeometry):
        trace = trace.with_model(model)
        calibration = calibration.with_model(model) if calibration is not None else None
        model = None
    settings = llama_settings(model, n_ctx=n_ctx, margin_bytes=margin_bytes, type_k=type_k,
                              type_v=type_v)
    g = trace.model
    op = profile.resolve(cpu_threads, gpu_share, model=g)
    # K only names the Policy Matrix's plain placement among the contenders
    K = g.experts_per_layer_for_vram(float(vram_gib) * GIB) \
        if g.expert_budget_bytes(float(vram_gib) * GIB) >= 0 else 0
    rec = llamacpp_record(trace, profile, calibration, experts_per_layer=K,
                          vram_gib=float(vram_gib), matrix_winner=LAYER_PARTITION,
                          cpu_threads=op.cpu_threads, gpu_share=op.gpu_share, persist=persist,
                          draws=draws, seed=seed, raw_samples=raw_samples, llama=settings)
    return baseline_of(rec)


def n_cpu_moe_memory(g: ModelGeometry, n_cpu_moe: int, vram_gib: float,
                     llama: LlamaSettings | None = None) -> DeviceMemory:
    """llama.cpp's count of the GPU's memory under ``-ngl 99 --n-cpu-moe N`` (the routed experts
    of blocks ``0 .. N-1`` in host memory, common/common.h l. 1224-1230), refused with how much
    it is over when it exceeds the budget.

    Parameters
    ----------
    g : ModelGeometry
        The model (its tensor table from ``llama.model`` when given, else made from it).
    n_cpu_moe : int
        ``--n-cpu-moe``: blocks counted from block 0, a dense prefix included.
    vram_gib : float
        The budget (the device memory the flags may use).
    llama : LlamaSettings, optional
        ``-c``, ``-ctk``/``-ctv`` and the table.
    """
    s = llama or LlamaSettings()
    m = s.table(g)
    if isinstance(n_cpu_moe, bool) or not isinstance(n_cpu_moe, int) \
            or not 0 <= n_cpu_moe <= m.n_layer:
        raise CopeInputError(f"expected a whole number of blocks in [0, {m.n_layer}], got "
                             f"{n_cpu_moe!r}", field="--n-cpu-moe")
    p = Placement(-1, tuple(NCMOE_PATTERN.format(i) for i in range(n_cpu_moe)))
    mem = device_memory(m, p, s.n_ctx, s.type_k, s.type_v)
    over = mem.total - float(vram_gib) * GIB
    if over > 0:
        raise CopeInputError(
            f"--n-cpu-moe {n_cpu_moe} does not fit {vram_gib:g} GiB: llama.cpp counts "
            f"{mem.total / GIB:.2f} GiB on the GPU (weights {mem.model / GIB:.2f}, KV cache "
            f"{mem.context / GIB:.2f} at -c {s.n_ctx} {s.type_k}/{s.type_v}, compute buffer "
            f"{mem.compute / GIB:.2f}): over by {over / GIB:.2f} GiB", field="--n-cpu-moe")
    return mem
