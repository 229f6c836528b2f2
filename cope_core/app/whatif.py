"""What-if VRAM budgets: budget <-> K, the candidates on show, winners and break-even budgets.

A sweep frame is the output of :func:`cope_core.estimate.predict.predict` over several ``K``;
everything here is a pure function of such frames and the model geometry.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..estimate.ranking import Verdict, frame_runner_up
from ..estimate.speed import speed, tokens_per_s  # noqa: F401  (the app's pages read them here)
from ..geometry import DEFAULT_CONTEXT, GIB, ModelGeometry
from ..llamacpp import Request, RequestSetting, prompt_unpriced
from ..matrix import CANDIDATES, LAYER_PARTITION
from ..platforms import GPUS, PlatformSpec

#: The slider's resolution in GiB.
BUDGET_STEP = 0.25


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """``df``'s columns without its ``attrs``: pandas deep-copies ``attrs`` into every frame
    derived from it (a column, a filter, each group), and a sweep's per-K confidences made that
    most of what drawing its figure cost."""
    return pd.DataFrame(df, copy=False)


def budget_gib(g: ModelGeometry, k: int) -> float:
    """Smallest VRAM budget (GiB) that buys ``K = k`` experts per layer."""
    return g.vram_for_experts_per_layer(int(k)) / GIB


def k_for_budget(g: ModelGeometry, gib: float) -> int:
    """Experts per layer a VRAM budget in GiB buys (clamped to ``[0, E]``)."""
    return g.experts_per_layer_for_vram(float(gib) * GIB)


def budget_range(g: ModelGeometry, gpu_gib: float | None = None) -> tuple[float, float]:
    """Slider bounds in GiB, on its steps: from the first that K = 0 fits (a smaller budget is an
    error) to a step past the budget that holds every expert, or to the chosen GPU's memory
    ``gpu_gib`` when that is more (the slider spans your card)."""
    top = math.ceil((budget_gib(g, g.n_experts) + 1.0) / BUDGET_STEP) * BUDGET_STEP
    lo = math.ceil(budget_gib(g, 0) / BUDGET_STEP) * BUDGET_STEP
    if gpu_gib is not None:
        top = max(top, math.floor(gpu_gib / BUDGET_STEP) * BUDGET_STEP)
    return lo, max(top, lo)


def gpu_gib(platform: dict | None) -> float | None:
    """The GPU memory of a machine chosen in the sidebar (None for an example's profile)."""
    v = (platform or {}).get("vram_gib")
    return float(v) if isinstance(v, (int, float)) else None


def snap(gib: float) -> float:
    """A budget rounded to the slider's step."""
    return round(round(float(gib) / BUDGET_STEP) * BUDGET_STEP, 6)


def kv_shift_gib(g: ModelGeometry, context: int | None) -> float:
    """GiB the KV cache at ``context`` tokens takes beyond the :data:`DEFAULT_CONTEXT` tokens
    every budget of the app (and of ``build_policy``, ``compare``, the llama.cpp cache search)
    counts: a card of U GiB at that context buys the K of a budget of U less this (how ``cope
    advise --ctx`` moves its budget too)."""
    if not isinstance(context, int) or context == DEFAULT_CONTEXT:
        return 0.0
    return (g.kv_cache_bytes(context) - g.kv_cache_bytes(DEFAULT_CONTEXT)) / GIB


def context_of(platform: dict | None) -> int:
    """The context length of a machine chosen in the sidebar (:data:`DEFAULT_CONTEXT` else)."""
    ctx = (platform or {}).get("context")
    return ctx if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0 \
        else DEFAULT_CONTEXT


def vram_at_context(g: ModelGeometry, gib: float, platform: dict | None) -> tuple[float, int]:
    """A page's budget (K counted with :data:`DEFAULT_CONTEXT` tokens of KV cache) as the VRAM
    it stands for at the machine's context, and that context: what the library's budget
    functions take (``build_policy(vram_gib=..., context=...)``), so K is the page's and
    llama.cpp's record runs with ``-c`` = the sidebar's context."""
    ctx = context_of(platform)
    return float(gib) + kv_shift_gib(g, ctx), ctx


def context_note(g: ModelGeometry, platform: dict | None) -> str | None:
    """What a machine chosen with another context length means for the budget, or None."""
    plat = platform or {}
    mine, ctx = gpu_gib(plat), plat.get("context")
    shift = kv_shift_gib(g, ctx)
    if mine is None or shift == 0.0:
        return None
    return (f"At {ctx} tokens of context the KV cache takes {abs(shift):.2f} GiB "
            f"{'more' if shift > 0 else 'less'} than the {DEFAULT_CONTEXT} tokens every budget "
            f"here counts: your card's {mine:g} GiB buys what a budget of "
            f"{mine - shift:.2f} GiB does, the default budget.")


def default_budget(g: ModelGeometry, platform: dict | None) -> float:
    """The profiled GPU's memory if the catalog knows it, capped where half the experts of
    each layer fit (so the default view still has misses to trade off); else that cap. A
    machine chosen in the sidebar: all of its GPU's memory (the question is your card)."""
    mine = gpu_gib(platform)
    if mine is not None:        # less the KV cache a longer context adds (context_note)
        lo, hi = budget_range(g, mine)
        value = mine - kv_shift_gib(g, (platform or {}).get("context"))
        return min(max(snap(math.floor(value / BUDGET_STEP) * BUDGET_STEP), lo), hi)
    cap = budget_gib(g, g.n_experts // 2)
    gpu = GPUS.get(str((platform or {}).get("gpu", "")).lower())
    value = min(gpu.vram_bytes / GIB, cap) if gpu else cap
    # never below the slider's first step: a budget under K = 0's need is an error
    return max(snap(math.floor(value / BUDGET_STEP) * BUDGET_STEP), budget_range(g)[0])


def candidate_ids(residencies: Iterable[str], executions: Iterable[str],
                  layer_partition: bool) -> list[str]:
    """Candidate ids of the chosen residency and execution rows, in canonical order."""
    res, exe = set(residencies), set(executions)
    out = []
    for c in CANDIDATES:
        if c.is_layer_partition:
            if layer_partition:
                out.append(c.id)
        elif c.residency is not None and c.execution is not None \
                and c.residency.value in res and c.execution.value in exe:
            out.append(c.id)
    return out


def k_chunks(n_experts: int, size: int = 17) -> list[tuple[int, ...]]:
    """``0..E`` split into consecutive chunks, so a sweep can report progress per chunk."""
    ks = list(range(n_experts + 1))
    return [tuple(ks[i:i + size]) for i in range(0, len(ks), size)]


@dataclass(frozen=True)
class Winner:
    """The best candidate at one K, its margin over the runner-up and how sure the pick is
    (interval and win probability from :func:`cope_core.estimate.predict.predict`; None when
    the prediction was made without draws)."""

    candidate: str
    tpot_us: float
    runner_up: str | None
    runner_up_us: float | None
    tpot_lo_us: float | None = None
    tpot_hi_us: float | None = None
    win_probability: float | None = None
    contender: str | None = None
    contender_probability: float | None = None
    verdict: Verdict | None = None

    @property
    def named(self) -> str:
        """The winner as the CLI names it: ``A``, or ``tied: A or B`` when the paired draws do
        not separate them (:func:`cope_core.estimate.ranking.most_likely_fastest`)."""
        return self.candidate if self.verdict is None else self.verdict.name

    @property
    def margin_pct(self) -> float | None:
        if self.runner_up_us is None:
            return None
        return (self.runner_up_us - self.tpot_us) / self.tpot_us * 100.0

    @property
    def sure(self) -> bool:
        """Whether the pick is confident: not a tie of the paired draws (without them, a win
        probability of at least :data:`SURE`)."""
        if self.verdict is not None:
            return not self.verdict.tied
        return self.win_probability is None or self.win_probability >= SURE

    def interval_text(self) -> str:
        if self.tpot_lo_us is None or self.tpot_hi_us is None:
            return ""
        return f"[{self.tpot_lo_us / 1e3:.3f}, {self.tpot_hi_us / 1e3:.3f}]"

    def sentence(self) -> str:
        text = (f"{self.named}: {self.candidate} at {speed(self.tpot_us)}"
                if self.verdict is not None and self.verdict.tied
                else f"{self.candidate} wins at {speed(self.tpot_us)}")
        if self.tpot_lo_us is not None:
            text += f" (95 % interval {self.interval_text()} with the model's measured error)"
        if self.runner_up is not None and self.runner_up_us == self.tpot_us:
            text += f", tied with {self.runner_up} (exact ties go to the earlier candidate id)"
        elif self.runner_up is not None and self.runner_up_us is not None:
            text += (f", {self.margin_pct:.1f}% ahead of {self.runner_up} "
                     f"({self.runner_up_us / 1e3:.3f} ms/token)")
        if self.verdict is not None:
            text += f"; {self.verdict.reason}"
        elif self.win_probability is not None:
            text += f"; it is fastest in {100 * self.win_probability:.0f} % of draws"
            if self.contender is not None and self.contender_probability:
                text += (f", {self.contender} in {100 * self.contender_probability:.0f} %")
            if not self.sure:
                text += " — not a confident pick"
        return text


#: Win probability from which a pick counts as confident (below it the app marks it uncertain).
SURE = 0.8


def winner_of(df: pd.DataFrame) -> Winner:
    """Winner and runner-up of a one-K prediction frame, with the winner's interval, win
    probability, strongest rival and the paired draws' verdict when the frame has draws: the
    winner is the verdict's most likely fastest (the CLI's ``winner:`` line), else rank 1."""
    w = df.sort_values("rank").iloc[0]
    conf = (df.attrs.get("uncertainty", {}).get("per_k", {})
            .get(int(w.experts_per_layer)) if "experts_per_layer" in df else None)
    verdict = (Verdict.from_dict(conf["verdict"]) if conf is not None and "verdict" in conf
               else None)
    if verdict is not None:
        w = df[df["candidate"] == verdict.leader].iloc[0]
    ru = frame_runner_up(df, w.candidate)

    def num(v):
        return None if v is None or not np.isfinite(v) else float(v)
    return Winner(w.candidate, float(w.tpot_us), None if ru is None else ru.candidate,
                  None if ru is None else float(ru.tpot_us),
                  tpot_lo_us=num(w.get("tpot_lo_us")), tpot_hi_us=num(w.get("tpot_hi_us")),
                  win_probability=(None if conf is None else verdict.leader_share
                                   if verdict is not None else num(conf["win_probability"])),
                  contender=None if conf is None else conf.get("contender"),
                  contender_probability=None if conf is None
                  else num(conf.get("contender_probability")), verdict=verdict)


def uncertain_ranges(sweep: pd.DataFrame, g: ModelGeometry,
                     threshold: float = SURE) -> list[tuple[float, float, int, int]]:
    """Budget ranges ``(gib_from, gib_to, k_from, k_to)`` of consecutive K whose winner wins
    fewer than ``threshold`` of the draws — or, when the draws name one, whose
    :class:`~cope_core.estimate.ranking.Verdict` is a tie (what the winner's sentence says there)
    — none when the sweep has no draws."""
    conf = sweep.attrs.get("uncertainty", {}).get("per_k", {})
    ks = sorted(int(k) for k in plain(sweep)["experts_per_layer"].unique())

    def unsure(c: dict) -> bool:
        return (bool(c["verdict"]["tied"]) if "verdict" in c
                else c["win_probability"] < threshold)
    weak = [k for k in ks if k in conf and unsure(conf[k])]
    out: list[list[int]] = []
    for k in weak:
        if out and out[-1][1] == k - 1:
            out[-1][1] = k
        else:
            out.append([k, k])
    top = max(ks) if ks else 0
    # K in [a, b] is bought from budget_gib(a) until K = b + 1 is; the top K is open-ended, so
    # its strip is one slider step wide
    return [(budget_gib(g, a), budget_gib(g, b + 1) if b < top else budget_gib(g, b) + BUDGET_STEP,
             a, b) for a, b in out]


@dataclass(frozen=True)
class Region:
    """A run of consecutive K values with the same winner.

    ``gib_from`` is the budget at which ``k_from`` becomes affordable; ``gib_to`` is where the
    next region starts (None for the last region).
    """

    candidate: str
    k_from: int
    k_to: int
    gib_from: float
    gib_to: float | None


def winner_regions(sweep: pd.DataFrame, g: ModelGeometry) -> list[Region]:
    """Consecutive-K regions of the sweep's winners, in increasing K."""
    sweep = plain(sweep)
    wins = (sweep[sweep["winner"]].sort_values("experts_per_layer")
            [["experts_per_layer", "candidate"]].to_numpy())
    regions: list[list] = []
    for k, cand in wins:
        if regions and regions[-1][0] == cand and regions[-1][2] == k - 1:
            regions[-1][2] = int(k)
        else:
            regions.append([cand, int(k), int(k)])
    out = []
    for i, (cand, a, b) in enumerate(regions):
        nxt = budget_gib(g, regions[i + 1][1]) if i + 1 < len(regions) else None
        out.append(Region(cand, a, b, budget_gib(g, a), nxt))
    return out


def break_even_sentences(regions: Sequence[Region]) -> list[str]:
    """The regions in words, e.g. ``"fixed/parallel wins from 14.50 GiB (K >= 40)"``."""
    if not regions:
        return []
    if len(regions) == 1:
        r = regions[0]
        return [f"{r.candidate} wins at every budget (K = {r.k_from} … {r.k_to})"]
    out = []
    for i, r in enumerate(regions):
        span = f"K = {r.k_from}" if r.k_from == r.k_to else f"K = {r.k_from} … {r.k_to}"
        if i == 0:
            out.append(f"{r.candidate} wins below {r.gib_to:.2f} GiB ({span})")
        elif i == len(regions) - 1:
            out.append(f"{r.candidate} wins from {r.gib_from:.2f} GiB ({span}"
                       + (", every expert resident)" if r.k_from == r.k_to else ")"))
        else:
            out.append(f"{r.candidate} wins from {r.gib_from:.2f} GiB to {r.gib_to:.2f} GiB "
                       f"({span})")
    return out


def break_even_budgets(regions: Sequence[Region]) -> pd.DataFrame:
    """One row per change of winner: budget, K, the candidate before and after."""
    rows = [{"budget_gib": b.gib_from, "experts_per_layer": b.k_from, "from": a.candidate,
             "to": b.candidate} for a, b in zip(regions, regions[1:])]
    return pd.DataFrame(rows, columns=["budget_gib", "experts_per_layer", "from", "to"])


def sweep_budgets(sweep: pd.DataFrame, g: ModelGeometry) -> np.ndarray:
    """VRAM budget (GiB) of each row's K."""
    ks = plain(sweep)["experts_per_layer"].to_numpy()
    per_k = {int(k): budget_gib(g, int(k)) for k in np.unique(ks)}
    return np.array([per_k[int(k)] for k in ks])


def hit_rates(sweep: pd.DataFrame) -> pd.DataFrame:
    """Hit rate per K for each residency (one execution suffices: hits do not depend on it)
    and for the layer-partition baseline (the share of layers on the GPU)."""
    first = plain(sweep).drop_duplicates(["experts_per_layer", "residency"])
    out = first[["experts_per_layer", "residency", "hit_rate"]].copy()
    out.loc[out["residency"] == LAYER_PARTITION, "residency"] = "layer_partition (GPU layers)"
    return out.reset_index(drop=True)


def unpriced_of(model: ModelGeometry, platform: dict | None) -> str | None:
    """Why the prompt of ``model`` on a profile's machine is not priced (its backend runs it
    in a way the prompt model does not price), or None (also without a machine's peaks: a
    measured profile's spec may name only its parts)."""
    spec = (platform or {}).get("spec")
    try:
        return None if not isinstance(spec, dict) else prompt_unpriced(
            model, PlatformSpec.from_dict(spec))
    except CopeInputError:
        return None


def request_metrics(first: RequestSetting | None, request: Request | None, estimator: str,
                    unpriced: str | None = None) -> list[tuple[str, str, str]]:
    """The Overview's time to first token and request time of llama.cpp's command, each as
    ``(label, value, help)``: ``first`` its request's figures (None: not priced, and the help
    says why: no prompt, another estimator, a backend the prompt model does not price
    (``unpriced``), or a measured profile without a machine's peaks)."""
    labels = ("First token (s), llama.cpp", "Request (s), llama.cpp")
    if first is None:
        why = "Not priced: " + (
            "the request's prompt is 0 (decode alone)" if request is None else
            "choose the cope estimator" if estimator != "cope" else
            unpriced if unpriced is not None else
            "a measured profile holds decode costs only; the prompt is priced from a machine's "
            "peaks (choose your machine in the sidebar)")
        return [(label, "—", why) for label in labels]
    said = "Priced for llama.cpp's answer (the Export page's command) from the machine's peaks"
    return [(labels[0], f"{first.ttft_s:.1f}",
             f"{said}: {first.prompt_tokens:,}-token prompt at {first.prompt_tokens_per_s:,.0f} "
             f"tokens/s, -ub {first.n_ubatch}"),
            (labels[1], f"{first.request_s:.1f}",
             f"{said}: the first token, then {first.gen_tokens:,} tokens at "
             f"{first.decode_tokens_per_s:.1f} tokens/s")]

