"""What every runtime renderer returns, and the lines they share (header, gap to the nearest)."""
from __future__ import annotations

from dataclasses import dataclass

from ..estimate.speed import speed, tokens_per_s_interval
from ..matrix import LAYER_PARTITION, Execution, Residency, get_candidate
from .policy import Policy


@dataclass(frozen=True)
class Rendered:
    """One policy in one runtime's form.

    Attributes
    ----------
    format : str
        The format's name, one of ``cope_core.export.FORMATS``.
    text : str
        What goes to stdout or the output file: JSON, YAML, or shell flags with ``#`` comments.
    files : tuple of (str, bytes)
        Further files the text refers to, by path (a format with a ``side_file``: the SGLang-KT
        expert-location tensor, exllamav3's expert statistics).
    exact : bool
        True when the runtime runs exactly the chosen candidate.
    deployed : str or None
        When not exact: the candidate the runtime runs instead (None when that is outside the
        Policy Matrix, as vLLM's offloading is).
    summary : str
        When not exact: one line saying what the runtime cannot express and what it runs.
    command : str or None
        The command the text leads with, as its renderer wrote it (None: the text's first
        line that is not a comment, :attr:`lead`).
    """

    format: str
    text: str
    files: tuple[tuple[str, bytes], ...] = ()
    exact: bool = True
    deployed: str | None = None
    summary: str = ""
    command: str | None = None

    @property
    def lead(self) -> str:
        """The command a user pastes first: the renderer's, else the first line that is not a
        comment (a JSON or YAML text: its first line)."""
        if self.command is not None:
            return self.command
        return next((ln for ln in self.text.splitlines() if ln and not ln.startswith("#")), "")


def ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:.3f} ms"


def header(policy: Policy, runtime: str) -> list[str]:
    """Comment lines naming the policy and where its numbers come from."""
    g = policy.model
    K, E = policy.experts_per_layer, g.n_experts
    budget = policy.vram.get("budget_gib")
    vram = (f"VRAM budget {budget:g} GiB" if budget is not None else "K given directly") + \
        f", needs {policy.vram['needed_gib']:.2f} GiB by the memory model"
    kind = "ANALYTIC profile (what-if, not measured)" if policy.analytic_profile \
        else "measured profile"
    gpu = policy.platform.get("gpu", "?")
    lines = [
        f"{runtime} placement from COPE Explorer (cope.policy/1"
        + (f", version {policy.provenance['version']})" if "version" in policy.provenance else ")"),
        f"model {g.name}: {g.n_layers} MoE layers, {g.dense_layers} dense prefix block(s), "
        f"top-{g.top_k} of {E} experts",
        f"candidate {policy.candidate} (chosen: {policy.chosen_by}), K = {K} of {E} experts per "
        f"MoE layer; {vram}",
        f"predicted TPOT (cope) {speed(policy.cope_us())} on {gpu}, cpu_threads="
        f"{policy.cpu_threads}, gpu_share={policy.gpu_share:g}; {kind}",
    ]
    ci, win = policy.interval_us(), policy.win_probability()
    if ci is not None:
        eq = policy.equivalent_to.get(policy.candidate)
        wins = (f"the same policy here as {eq}" if eq else
                "fastest in" + ("" if win is None else f" {100 * win:.0f} %") + " of "
                f"{policy.confidence['draws']} paired draws")
        model = str(policy.confidence.get("profile_spread", "")).startswith("model uncertainty")
        what = ("the trace's prompts; no spread in the profile"
                if "profile" not in policy.confidence.get("sources", []) else
                "the trace's prompts and the analytic model's constants" if model else
                "the trace's prompts and the profile's spread")
        lines.append(f"95 % interval [{ms(ci[0])}, {ms(ci[1])}]/token = "
                     f"{tokens_per_s_interval(ci[0], ci[1])} with the model's measured "
                     f"error (docs/design.md#uncertainty); {wins} (bootstrap of {what})")
    if policy.fill.get("source") == "trace":
        lines.append("resident experts filled from the evaluated trace (no calibration trace): "
                     "the prediction is optimistic")
    return ["# " + line for line in lines]


def whole_layer_equivalent(policy: Policy) -> bool:
    """True when the chosen candidate places experts exactly as a layer partition does.

    Besides ``layer_partition`` itself that is fixed residency at ``K = E`` (every expert
    resident, no misses, whatever the execution) and ``fixed/parallel`` at ``K = 0`` (every
    expert computed on the CPU).
    """
    c = get_candidate(policy.candidate)
    if c.is_layer_partition:
        return True
    K, E = policy.experts_per_layer, policy.model.n_experts
    return c.residency is Residency.FIXED and (
        K == E or (K == 0 and c.execution is Execution.PARALLEL))


def gap_line(policy: Policy, nearest: str) -> str:
    """``chosen X, nearest Y: +d (+p%)`` by the COPE estimator, as a comment line."""
    mine, near = policy.cope_us(), policy.cope_us(nearest)
    if nearest == policy.candidate:
        return f"# predicted TPOT (cope): {nearest} {speed(mine)}"
    pct = (near - mine) / mine * 100 if mine > 0 else 0.0
    return (f"# predicted TPOT (cope): chosen {policy.candidate} {speed(mine)}; "
            f"{nearest} {speed(near)}; gap {(near - mine) / 1e3:+.3f} ms ({pct:+.1f}%)")


def layer_partition_summary(policy: Policy, runtime_cannot: str) -> str:
    """One line for a runtime that places whole MoE layers only: why it cannot express the
    chosen candidate, the layer partition it falls back to, and that partition's cost.

    ``runtime_cannot`` is the first clause, with ``{candidate}`` where the candidate id goes,
    e.g. ``"llama.cpp cannot express {candidate}: it places whole MoE layers only"``."""
    plan, L = policy.layer_plan, policy.model.n_layers
    return (f"{runtime_cannot.format(candidate=policy.candidate)}; the nearest expressible "
            f"policy is {LAYER_PARTITION} at the same VRAM ({plan.n_gpu} of {L} MoE layers on "
            f"the GPU); " + gap_summary(policy, LAYER_PARTITION))


def gap_summary(policy: Policy, nearest: str) -> str:
    mine, near = policy.cope_us(), policy.cope_us(nearest)
    if nearest == policy.candidate:
        return f"{nearest} itself is predicted at {ms(mine)}/token"
    pct = (near - mine) / mine * 100 if mine > 0 else 0.0
    return f"{nearest} is predicted at {ms(near)}/token, {pct:+.1f}% against {ms(mine)}"


def host_ram_line(policy: Policy, experts: int, why: str) -> str:
    """How much host RAM the routed experts a runtime keeps there take, as priced (the policy's
    stored bytes per expert); ``why`` says which experts the runtime keeps there."""
    g = policy.model
    gib = experts * g.expert_bytes / 2**30
    return (f"# host RAM for routed experts: {gib:.2f} GiB ({experts} experts at "
            f"{g.expert_bytes / 2**20:.2f} MiB, {g.format_name}): {why}")
