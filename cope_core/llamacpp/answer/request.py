"""A request as the objective (docs/design.md#the-request): a prompt of P tokens, then an answer
of G tokens. Its time is the time to the first token (the prompt, :func:`prompt_time`) plus G
tokens decoded at the depth the answer is decoded at (P + G/2 on average). The setting that
decodes fastest need not serve the request fastest: a larger ``-ub`` speeds the prompt and grows
the compute buffer, so fewer experts fit and decode slows. :func:`search_request` prices the
decode-best configuration and llama.cpp's default at the default ``-ub``, and each ``-ub`` of
:meth:`Request.ubatches` with the fewest ``--n-cpu-moe`` blocks that fit beside its buffer.

How sure: the prompt model's ratios between settings were off by :data:`PROMPT_RATIO_ERROR` on
published sweeps (docs/results.md), and decode by its own interval; a setting is
:meth:`RequestRecord.surely_faster` than another when its slowest bound beats the other's fastest.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from importlib import resources
from typing import Any

import numpy as np

from ...errors import CopeInputError
from ...geometry import GIB, ModelGeometry
from ...placement import layer_plan
from ...platforms import PlatformSpec
from ..placement.vram import N_UBATCH
from .builds import Build
from .prompt import PromptRun, prompt_time
from .rule import surely_faster
from .settings import LlamaSettings, n_cpu_moe_memory

#: a chat turn: the request priced when none is named (said in every output)
DEFAULT_PROMPT_TOKENS = 4096
DEFAULT_GEN_TOKENS = 512
#: the ``-ub`` values searched (llama.cpp's default 512 among them), each up to the prompt's size
UBATCHES = (256, 512, 1024, 2048, 4096, 8192)
#: the prompt model's mean ratio error between settings of one machine on published ``-ub`` and
#: ``--n-cpu-moe`` sweeps (docs/results.md, "Prompt processing against published sweeps"; written
#: by scripts/published_pp.py --write): the margin a setting's time to first token is given
PROMPT_ERROR = json.loads((resources.files("cope_core.llamacpp") / "data" / "prompt-error.json")
                          .read_text())
PROMPT_RATIO_ERROR = float(PROMPT_ERROR["ratio_error"])
#: its mean error on tokens/s itself, each published point priced by the fit that left its source
#: out: the spread a time to first token carries
PROMPT_ABS_ERROR = float(PROMPT_ERROR["abs_error"])
#: host memory a ``--no-mmap`` setting keeps free beside its pinned host experts: the system and
#: llama.cpp's other host buffers (an assumption: pinned memory cannot be paged out, so the
#: rest of the machine must fit beside it)
PINNED_RAM_MARGIN = 4 * GIB
#: labels of a record's settings
DECODE_BEST, DEFAULT, SEARCHED = "decode-best", "default", "searched"


@dataclass(frozen=True)
class Request:
    """One request: ``prompt_tokens`` in, ``gen_tokens`` out."""

    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    gen_tokens: int = DEFAULT_GEN_TOKENS

    def __post_init__(self) -> None:
        for name, flag in (("prompt_tokens", "--prompt-tokens"), ("gen_tokens", "--gen-tokens")):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CopeInputError(f"expected a positive whole number of tokens, got {v!r}",
                                     field=flag)

    @property
    def tokens(self) -> int:
        """The KV cache the request fills: prompt and answer."""
        return self.prompt_tokens + self.gen_tokens

    def context_for(self, n_ctx: int) -> int:
        """The context (``-c``) a request needs: ``n_ctx``, grown to hold the prompt and the
        answer (the one place the context grows; advise, predict, export and the app use it)."""
        return max(int(n_ctx), self.tokens)

    @property
    def depth(self) -> float:
        """The mean context an answer token is decoded at (token i attends to P + i + 1)."""
        return self.prompt_tokens + (self.gen_tokens + 1) / 2

    def ubatches(self) -> tuple[int, ...]:
        """The ``-ub`` values worth pricing: a batch larger than the prompt's next power of two
        only grows the buffer."""
        top = max(N_UBATCH, 1 << max(self.prompt_tokens - 1, 1).bit_length())
        return tuple(u for u in UBATCHES if u <= top)

    def describe(self) -> str:
        return f"{self.prompt_tokens:,}-token prompt, {self.gen_tokens:,}-token answer"

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "gen_tokens": self.gen_tokens}


@dataclass(frozen=True)
class RequestSetting:
    """One llama.cpp setting priced for a request (times in seconds, TPOT in microseconds).

    ``label``: :data:`DECODE_BEST`, :data:`DEFAULT` or :data:`SEARCHED`; ``n_cpu_moe`` None for
    the default (fit's placement, ``host_layers`` MoE layers' experts in host memory);
    ``cache_mib`` the decode-best's MoE cache; ``tpot_us`` decode at the trace's context (as the
    record's other rows), ``depth_tpot_us`` at the request's depth; ``tpot_rel`` the decode
    prediction's relative half-interval; ``pinned_gib`` the host memory ``--no-mmap`` pins for the
    host experts (0: mmap, llama.cpp's default, the experts pageable)."""

    label: str
    n_cpu_moe: int | None
    host_layers: float
    cache_mib: int
    n_ubatch: int
    n_batch: int
    prompt_tokens: int
    gen_tokens: int
    ttft_s: float
    tpot_us: float
    depth_tpot_us: float
    tpot_rel: float
    pinned_gib: float = 0.0

    def __post_init__(self) -> None:
        if self.label not in (DECODE_BEST, DEFAULT, SEARCHED):
            raise CopeInputError(f"expected one of {[DECODE_BEST, DEFAULT, SEARCHED]}, got "
                                 f"{self.label!r}", field="label")
        for f in fields(self)[1:]:
            v = getattr(self, f.name)
            if v is None and f.name == "n_cpu_moe":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise CopeInputError(f"expected a finite number >= 0, got {v!r}", field=f.name)

    @property
    def pinned(self) -> bool:
        """Whether the setting loads without mmap (``--no-mmap``), its host experts pinned."""
        return self.pinned_gib > 0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tokens_per_s(self) -> float:
        return 1e6 / self.depth_tpot_us

    @property
    def request_s(self) -> float:
        """Time to the first token plus the answer's other tokens at the request's depth."""
        return self.ttft_s + self.gen_tokens * self.depth_tpot_us / 1e6

    def ttft_range(self) -> tuple[float, float]:
        """The time to the first token ± :data:`PROMPT_ABS_ERROR`, seconds."""
        return self.ttft_s * (1 - PROMPT_ABS_ERROR), self.ttft_s * (1 + PROMPT_ABS_ERROR)

    def bounds(self) -> tuple[float, float]:
        """The request's fastest and slowest plausible time (:data:`PROMPT_RATIO_ERROR` on the
        prompt, the decode interval on the answer)."""
        dec = self.gen_tokens * self.depth_tpot_us / 1e6
        e, d = PROMPT_RATIO_ERROR, self.tpot_rel
        return self.ttft_s * (1 - e) + dec * (1 - d), self.ttft_s * (1 + e) + dec * (1 + d)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def summary(self) -> dict[str, Any]:
        """The figures ``--json`` gives each answer (its decode is the answer's
        ``tokens_per_s``, one key for one figure)."""
        return {"prompt_tokens": self.prompt_tokens, "gen_tokens": self.gen_tokens,
                "prompt_tokens_per_s": self.prompt_tokens_per_s, "ttft_s": self.ttft_s,
                "ttft_range_s": list(self.ttft_range()),
                "request_s": self.request_s,
                "ubatch": self.n_ubatch, "batch": self.n_batch, "no_mmap": self.pinned,
                "pinned_gib": self.pinned_gib}


@dataclass(frozen=True)
class RequestRecord:
    """A request's settings priced: the decode-best configuration and the default (at the default
    ``-ub``), then each ``-ub`` searched, fastest request first within the searched ones."""

    request: Request
    settings: tuple[RequestSetting, ...]

    def of(self, label: str) -> RequestSetting | None:
        return next((s for s in self.settings if s.label == label), None)

    @property
    def best(self) -> RequestSetting:
        """The fastest request of all settings priced."""
        return min(self.settings, key=lambda s: s.request_s)

    @staticmethod
    def surely_faster(a: RequestSetting, b: RequestSetting) -> bool:
        """Whether ``a`` serves the request faster than ``b`` at its slowest bound and ``b``'s
        fastest (the rule, :func:`~cope_core.llamacpp.answer.rule.surely_faster`)."""
        return surely_faster(a.bounds(), b.bounds())

    def to_dict(self) -> dict[str, Any]:
        return {**self.request.to_dict(), "settings": [s.to_dict() for s in self.settings]}

    @classmethod
    def from_dict(cls, d: Any) -> RequestRecord:
        if not isinstance(d, Mapping) or set(d) != {"prompt_tokens", "gen_tokens", "settings"}:
            raise CopeInputError("expected an object with prompt_tokens, gen_tokens and "
                                 f"settings, got {d!r}", field="request")
        rows = d["settings"]
        names = {f.name for f in fields(RequestSetting)}
        # pinned_gib came with issue 71: a record written before it holds mmap settings only
        if not isinstance(rows, list) or not rows or not all(
                isinstance(r, Mapping) and set(r) | {"pinned_gib"} == names for r in rows):
            raise CopeInputError(f"expected a non-empty list of objects with {sorted(names)}",
                                 field="request.settings")
        try:
            return cls(Request(d["prompt_tokens"], d["gen_tokens"]),
                       tuple(RequestSetting(**r) for r in rows))
        except CopeInputError as exc:
            raise CopeInputError(exc.detail, field=f"request.{exc.field}") from None


def fewest_cpu_moe(g: ModelGeometry, vram_gib: float, llama: LlamaSettings) -> int | None:
    """The fewest ``--n-cpu-moe`` blocks whose placement fits ``vram_gib`` under ``llama``'s
    context and batch sizes (None: not even every block's experts in host memory fits)."""
    n_blocks = g.dense_layers + g.n_layers
    for n in range(n_blocks + 1):
        try:
            n_cpu_moe_memory(g, n, vram_gib, llama)
        except CopeInputError:
            continue
        return n
    return None


def pinned_bytes(g: ModelGeometry, host_layers: float) -> float:
    """Host memory ``--no-mmap`` pins for the routed experts of ``host_layers`` MoE layers (the
    GPU backend's host buffer holds them whole: src/llama-model.cpp, make_cpu_buft_list)."""
    return float(host_layers) * g.n_experts * g.expert_bytes


def search_request(g: ModelGeometry, spec: PlatformSpec, request: Request, *, vram_gib: float,
                   llama: LlamaSettings, build: Build,
                   tpot_at: Callable[[float, float], float], context0: float, threads: int,
                   decode_best: tuple[int, int, float, float, float],
                   default: tuple[float, float, float] | None,
                   rates: np.ndarray | None = None) -> RequestRecord:
    """Price ``request`` for llama.cpp's settings at a VRAM budget.

    Parameters
    ----------
    g, spec
        The model and the machine's peaks (the prompt model's inputs).
    request : Request
    vram_gib : float
        The budget the placements must fit, with ``llama``'s context (at least the request's
        tokens) and each ``-ub``'s compute buffer.
    llama : LlamaSettings
        The context and cache types; its ``-ub``/``-b`` are the decode-best's and default's.
    build : Build
        Which op offload the prompt runs with.
    tpot_at : callable
        ``tpot_at(host_layers, context)``: TPOT in microseconds of the plain placement with that
        many MoE layers' experts in host memory, one token at ``context``.
    context0 : float
        The trace's mean context, where the decode-best's and the default's TPOT were priced.
    threads : int
        CPU threads (the prompt's CPU path).
    decode_best : tuple
        ``(n_cpu_moe, cache_mib, host_layers, tpot_us, tpot_rel)`` of the decode-best
        configuration (its TPOT at the trace's context ``context0`` is moved to the request's
        depth by the plain placement's attention difference).
    default : tuple or None
        ``(host_layers, tpot_us, tpot_rel)`` of llama.cpp's default (fit's placement), None
        when it is not priced.
    rates : ndarray, optional
        The router's per-layer selection rates (:func:`selection_rates`).
    """
    depth = request.depth

    def setting(label: str, n_cpu_moe: int | None, host: float, cache_mib: int, ub: int,
                b: int, tpot: float, rel: float, pinned_gib: float = 0.0) -> RequestSetting:
        run = PromptRun(request.prompt_tokens, 0, ub, b, threads=threads,
                        pinned=pinned_gib > 0)
        pt = prompt_time(g, spec, int(round(host)), run, build, rates)
        deep = tpot + tpot_at(host, depth) - tpot_at(host, context0)
        return RequestSetting(label, n_cpu_moe, float(host), cache_mib, ub, b,
                              request.prompt_tokens, request.gen_tokens, pt.seconds, tpot,
                              deep, rel, pinned_gib)

    n, cache, host, tpot, rel = decode_best
    out = [setting(DECODE_BEST, n, host, cache, llama.n_ubatch, llama.n_batch, tpot, rel)]
    if default is not None:
        host, tpot, rel = default
        out.append(setting(DEFAULT, None, host, 0, llama.n_ubatch, llama.n_batch, tpot, rel))
    searched = []
    for ub in request.ubatches():
        s = replace(llama, n_ubatch=ub, n_batch=max(llama.n_batch, ub))
        fewest = fewest_cpu_moe(g, vram_gib, s)
        if fewest is None:
            continue
        host = max(fewest - g.dense_layers, 0)
        searched.append(setting(SEARCHED, fewest, host, 0, ub, s.n_batch,
                                tpot_at(host, context0), rel))
        pinned = pinned_bytes(g, host)
        if host and llama.host_ram_bytes is not None \
                and pinned + PINNED_RAM_MARGIN <= llama.host_ram_bytes:
            searched.append(setting(SEARCHED, fewest, host, 0, ub, s.n_batch,
                                    tpot_at(host, context0), rel, pinned / GIB))
    searched.sort(key=lambda x: x.request_s)
    return RequestRecord(request, tuple(out + searched))



def ttft_by_experts(g: ModelGeometry, spec: PlatformSpec, request: Request,
                    ks: Sequence[int], *, threads: int, build: Build | None = None,
                    rates: np.ndarray | None = None) -> np.ndarray:
    """Seconds to the first token at each ``K`` (experts per layer on the GPU), the prompt run as
    llama.cpp runs it at the default ``-ub`` with the layer partition of K's bytes
    (:func:`cope_core.placement.layer_plan`): every candidate of the Policy Matrix at K holds
    those bytes of experts on the GPU, and op offload copies what a batch routes to from the
    rest whichever experts they are."""
    run = PromptRun(request.prompt_tokens, 0, threads=threads)
    return np.array([prompt_time(g, spec, layer_plan(g, int(k)).n_cpu, run, build, rates).seconds
                     for k in ks])
