"""What ``cope advise`` answers, as records: a predicted speed (:class:`Speed`), a command
offered beside the recommended one (:class:`Alternative`), one runtime's answer
(:class:`RuntimeAnswer`) and the whole answer (:class:`Advice`), as
:func:`cope_core.export.advising.advise` makes them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..estimate.speed import tokens_per_s
from ..geometry import ModelGeometry
from ..llamacpp import Build, DevicesAnswer, Request, RequestSetting
from ..machine import Machine
from .policy import Policy
from .upgrades import Upgrade


def request_fields(r: RequestSetting | None) -> dict[str, Any]:
    """The request's figures ``--json`` gives an answer (each None when not priced)."""
    # decode is the answer's tokens_per_s (at the request's depth): one key, one figure
    keys = ("prompt_tokens_per_s", "ttft_s", "ttft_range_s", "request_s", "ubatch", "batch",
            "no_mmap", "pinned_gib")
    return dict.fromkeys(keys) if r is None else {k: r.summary()[k] for k in keys}


@dataclass(frozen=True)
class Speed:
    """A predicted decode speed: microseconds per token and its 95 % interval (None: none)."""

    tpot_us: float
    tpot_ci_us: tuple[float, float] | None = None

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_s(self.tpot_us)

    @property
    def tokens_per_s_interval(self) -> tuple[float, float] | None:
        ci = self.tpot_ci_us
        return None if ci is None else (tokens_per_s(ci[1]), tokens_per_s(ci[0]))


@dataclass(frozen=True)
class Alternative:
    """A command beside the recommended one: what it is (``label``), the command, its predicted
    speed and why it is not the first line (``note``)."""

    label: str
    command: str
    speed: Speed | None
    note: str = ""
    request: RequestSetting | None = None
    kind: str = ""              # llama.cpp's offers: the answer's Kind, in lower case
    acted_on: bool = True       # printed beside the command without --explain

    def to_dict(self) -> dict[str, Any]:
        sp = self.speed
        return {"label": self.label, "kind": self.kind or None, "command": self.command,
                "note": self.note,
                "tokens_per_s": None if sp is None else sp.tokens_per_s,
                "tokens_per_s_interval": None if sp is None else sp.tokens_per_s_interval,
                **request_fields(self.request)}


@dataclass(frozen=True)
class RuntimeAnswer:
    """One runtime's answer: the command to paste, what it runs, its speed, and its default.

    ``command`` is the recommended command, the first line a user copies (None when the runtime
    cannot run here; ``notes`` says why); ``speed`` None when what it runs is not predicted;
    ``default`` None when the default's speed is unknown or it does not load (``default_what``
    says which); ``alternatives`` the commands offered beside it (llama.cpp: the faster
    configuration when its gain is not sure enough, the plain ``--n-cpu-moe`` placement beside a
    MoE-cache configuration)."""

    runtime: str
    command: str | None
    runs: str | None
    speed: Speed | None
    default_what: str
    default: Speed | None
    notes: tuple[str, ...] = ()
    files: tuple[tuple[str, bytes], ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    build: str | None = None    # llama.cpp: which build the answer is for, in words
    request: RequestSetting | None = None   # the request priced for the command (llama.cpp)
    default_request: RequestSetting | None = None   # and for the default
    explain: tuple[str, ...] = ()   # the lines --explain adds (llama.cpp: its record in words)
    host_layers: float | None = None    # llama.cpp: MoE layers' experts the command leaves on
                                        # the host (None: another runtime)
    detail: tuple[str, ...] = ()    # notes --explain adds: the nearest policy the runtime runs
    cache_mib: int = 0              # llama.cpp: the MoE cache the command keeps (0: none)

    @property
    def gain_over_default(self) -> float | None:
        """How many times faster than the default (None when either is not predicted)."""
        if self.speed is None or self.default is None:
            return None
        return self.default.tpot_us / self.speed.tpot_us

    def to_dict(self) -> dict[str, Any]:
        sp, df = self.speed, self.default
        return {"runtime": self.runtime, "command": self.command,
                "recommended": self.command,
                "alternatives": [x.to_dict() for x in self.alternatives], "runs": self.runs,
                "tokens_per_s": None if sp is None else sp.tokens_per_s,
                "tokens_per_s_interval": None if sp is None else sp.tokens_per_s_interval,
                "ms_per_token": None if sp is None else sp.tpot_us / 1e3,
                "default": self.default_what,
                "default_tokens_per_s": None if df is None else df.tokens_per_s,
                "gain_over_default": self.gain_over_default, "notes": [*self.detail, *self.notes],
                "files": [p for p, _ in self.files], "build": self.build,
                **request_fields(self.request),
                "default_request_s": None if self.default_request is None
                else self.default_request.request_s, "explain": list(self.explain)}


@dataclass(frozen=True)
class Advice:
    """Everything ``cope advise`` prints: the inputs as resolved and one answer per runtime."""

    model: ModelGeometry
    machine: Machine
    vram_gib: float | None          # the budget (None: CPU-only)
    vram_source: str
    experts_per_layer: int | None
    context: int
    routing: str
    answers: tuple[RuntimeAnswer, ...]
    winner: tuple[str, Speed] | None   # the Policy Matrix's, None without a GPU
    policy: Policy | None
    baseline: Speed | None = None      # llama.cpp's default, None when not predicted
    weights_source: str = "as given"   # how the weights were chosen (a catalog name's default)
    build: Build | None = None         # the llama.cpp build assumed
    request: Request | None = None     # the prompt and answer llama.cpp's answer is ranked by
    helps: tuple[Upgrade, ...] = ()    # llama.cpp's command with one part changed, fastest first
    devices: DevicesAnswer | None = None   # several cards: llama.cpp's answer across them

    @property
    def threads(self) -> int:
        return self.machine.threads

    @property
    def costs(self) -> str:
        """Where the prices come from, in one line."""
        if self.machine.cpu_only:
            return ("ANALYTIC, every weight and operation on the CPU (cope_core/estimate/"
                    "cpu_only.py; what-if from published numbers, not measured)")
        return "ANALYTIC profile of these parts (what-if from published numbers, not measured)"

    def inputs(self) -> dict[str, Any]:
        """The inputs as resolved, for JSON."""
        return {"model": self.model.name, "weights": self.model.format_name,
                "weights_source": self.weights_source,
                "machine": self.machine.to_dict(), "vram_gib": self.vram_gib,
                "vram_source": self.vram_source, "experts_per_layer": self.experts_per_layer,
                "n_experts": self.model.n_experts, "threads": self.threads,
                "context": self.context, "routing": self.routing,
                "costs": self.costs,
                "llamacpp_build": None if self.build is None else self.build.to_dict(),
                "request": None if self.request is None else self.request.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``cope advise --json`` prints: each runtime's answer with the inputs as
        resolved (``K``, threads, context, VRAM), the inputs in full, and the Policy Matrix's
        winner."""
        each = {"experts_per_layer": self.experts_per_layer, "threads": self.threads,
                "context": self.context, "vram_gib": self.vram_gib}
        win = None
        if self.winner is not None:
            name, sp = self.winner
            base = self.baseline
            win = {"candidate": name, "tokens_per_s": sp.tokens_per_s,
                   "tokens_per_s_interval": sp.tokens_per_s_interval,
                   "gain_over_llamacpp_default": None if base is None
                   else base.tpot_us / sp.tpot_us}
        return {"inputs": self.inputs(),
                "runtimes": [{**a.to_dict(), **each} for a in self.answers],
                "policy_matrix_winner": win,
                "what_would_help": [{"change": u.label, "tokens_per_s": u.tokens_per_s,
                                     "gain_pct": u.gain_pct, "checked": u.checked}
                                    for u in self.helps],
                "devices": None if self.devices is None else self.devices.to_dict()}
