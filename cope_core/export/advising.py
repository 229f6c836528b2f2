"""``cope advise``: one model on one machine, answered runtime by runtime in tokens per second.

One call does what four commands did (``synth`` twice, ``profile --analytic``, ``predict``) and
then renders each runtime's command with the export renderers (:func:`cope_core.export.render`,
the same text ``cope export`` prints)::

    machine = compose_machine(gpu="rtx3090", cpu="ryzen-7-5700x", memory="ddr4-3200x2",
                              link="4x16")
    advice = advise(resolve_model("qwen3-30b-a3b", "Q4_K_M"), machine)

* VRAM: the card's memory less what llama.cpp keeps free when it places a model itself
  (:data:`RESERVE_BYTES`, its ``--fit`` margin); the same budget prices every runtime, and the
  memory model (docs/design.md#model-geometry-and-memory) turns it into ``K`` with the KV cache
  at the context asked for.
* Routing: the given traces, or a SYNTHETIC trace and calibration trace made in memory as the
  shipped examples' (:func:`cope_core.trace.synth_defaults.synthetic_inputs`).
* Costs: an ANALYTIC profile of the composed machine at its threads
  (:func:`cope_core.profile.analytic.analytic_profile`).
* Per runtime: the command its renderer leads with (llama.cpp's: its answer, for the build
  named), the predicted speed of what that command runs, and the runtime's default with the gain
  over it; the Policy Matrix's winner for reference.
* No GPU: no placement to choose; llama.cpp and ik_llama.cpp run everything on the CPU
  (:mod:`cope_core.estimate.cpu_only`), the GPU runtimes are not answered.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from ..errors import CopeInputError
from ..estimate.cpu_only import best_threads, cpu_only_price
from ..geometry import DEFAULT_CONTEXT, GIB, ModelGeometry
from ..llamacpp import (
    FIT_MARGIN,
    Build,
    LlamaAnswer,
    Offer,
    Request,
    build_lines,
    cpu_only_answer,
    latest,
    llama_settings,
)
from ..machine import Machine
from ..matrix import LAYER_PARTITION
from ..profile.analytic import analytic_profile
from ..trace.data import Trace
from ..trace.synth_defaults import (
    CALIBRATION_PROMPTS,
    TOKENS,
    TRACE_PROMPTS,
    synth_defaults,
    synthetic_inputs,
)
from .advice import Advice, Alternative, RuntimeAnswer, Speed
from .build import build_policy
from .formats import EXPORT_FORMATS, get_format, render
from .llamacpp import cache_lines
from .policy import Policy
from .several import across_cards, machine_devices, relative_half_interval
from .upgrades import as_fast_as, upgrades

#: The runtimes ``cope advise`` answers for, in the order it prints them.
RUNTIMES: tuple[str, ...] = tuple(f.name for f in EXPORT_FORMATS if f.advised)
#: VRAM kept free by default: llama.cpp's ``--fit`` margin (``-fitt``, 1 GiB)
RESERVE_BYTES = FIT_MARGIN
RESERVE_SOURCE = ("llama.cpp's --fit margin (-fitt 1 GiB, common/common.h l. 486 of b11434), "
                  "kept free for every runtime")


def default_budget(machine: Machine) -> tuple[float, str]:
    """The VRAM budget in GiB when none is given, and where it comes from."""
    gib = (machine.vram_bytes - RESERVE_BYTES) / GIB
    return gib, (f"{machine.vram_bytes / GIB:.2f} GiB on the card less "
                 f"{RESERVE_BYTES / GIB:g} GiB, {RESERVE_SOURCE}")


def advise(model: ModelGeometry, machine: Machine, *, runtimes: Sequence[str] = RUNTIMES,
           vram_gib: float | None = None, context: int = DEFAULT_CONTEXT,
           trace: Trace | None = None, calibration: Trace | None = None, seed: int = 0,
           with_files: bool = False, model_file: str | os.PathLike | None = None,
           weights_source: str = "as given", build: Build | None = None,
           request: Request | None = None, host_ram_gib: float | None = None,
           search_threads: bool = False) -> Advice:
    """Answer ``cope advise`` (module docstring).

    Parameters
    ----------
    model : ModelGeometry
    machine : Machine
        From :func:`cope_core.machine.compose_machine` (its ``threads`` are the operating point).
    runtimes : sequence of str
        Any of :data:`RUNTIMES`, answered in :data:`RUNTIMES`' order.
    vram_gib : float, optional
        The VRAM budget (default :func:`default_budget`).
    context : int
        Tokens of KV cache the budget holds.
    trace, calibration : Trace, optional
        Routing to price (re-labelled as ``model``); default a synthetic pair made in memory.
    seed : int
        The synthetic routing's seed.
    with_files : bool
        Also make the files the commands read (:attr:`RuntimeAnswer.files`; SGLang-KT's needs
        torch, so it is made only when asked).
    model_file : path, optional
        The GGUF ``model`` was read from: llama.cpp's memory (its search's budget, ``--fit``'s
        placement) is counted from its tensor table instead of one made from the geometry.
    weights_source : str
        How ``model``'s weights were chosen, said with the answer (``cope advise`` without
        ``--quant`` on a catalog name: :func:`cope_core.models.published_preset`).
    build : Build, optional
        The llama.cpp build the answer is for (``--llamacpp``; default the newest known): its
        search runs over the flags and cache that build has, its default is that build's.
    request : Request, optional
        A prompt and answer: llama.cpp's answer is ranked by its time (``-ub`` searched beside
        the placement, :mod:`cope_core.llamacpp.answer.request`), and the context grows to hold it.
    host_ram_gib : float, optional
        The host's memory: with it the request's search also prices ``--no-mmap`` (pinned host
        experts) where they fit.
    search_threads : bool
        The threads were not given (``--threads``): on a machine without a GPU every count is
        priced and fewer threads run where the model finds them faster.
    """
    build = build if build is not None else latest()
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        raise CopeInputError(f"unknown runtime {unknown[0]!r}; expected one of "
                             f"{[*RUNTIMES, 'all']}", field="--runtime")
    order = [r for r in RUNTIMES if r in set(runtimes)]
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise CopeInputError(f"expected a positive whole number of tokens, got {context!r}",
                             field="--ctx")
    if request is not None:
        context = request.context_for(context)
    if trace is None:
        trace, calibration = synthetic_inputs(model, seed=seed)
        routing = (f"SYNTHETIC, made in memory as the shipped examples' ({TRACE_PROMPTS} prompts "
                   f"x {TOKENS} tokens, calibrated on {CALIBRATION_PROMPTS} more; "
                   f"{synth_defaults(model).basis}), seed {seed}")
    else:
        trace = trace.with_model(model)
        calibration = calibration.with_model(model) if calibration is not None else None
        routing = (f"{trace.source.upper()} trace" + (f" {trace.path}" if trace.path else "")
                   + f", {trace.n_prompts} prompts, {trace.n_tokens} tokens"
                   + ("" if calibration is not None else
                      "; no calibration trace: the fill is optimistic"))
    if machine.cpu_only:
        if vram_gib is not None:
            raise CopeInputError("the machine has no GPU: a VRAM budget does not apply",
                                 field="--vram-gib")
        return replace(_cpu_only(model, machine, order, context, trace, routing,
                                 search_threads),
                       weights_source=weights_source, build=build, request=request)
    assert machine.spec is not None
    if vram_gib is None:
        vram_gib, source = default_budget(machine)
    elif vram_gib * GIB > machine.vram_bytes:
        raise CopeInputError(f"{vram_gib:g} GiB is more than the card's "
                             f"{machine.vram_bytes / GIB:.2f} GiB", field="--vram-gib")
    else:
        source = "--vram-gib"
    # a budget below K = 0's need is refused here, in the GiB and context the user gave
    model.experts_per_layer_for_vram(vram_gib * GIB, context=context)
    profile = analytic_profile(model, machine.spec, cpu_threads=[machine.threads])
    # K and llama.cpp's record (its -c, KV cache and compute buffer) at the asked context
    settings = llama_settings(model_file, n_ctx=context, build=build, host_ram_gib=host_ram_gib)
    policy = build_policy(trace, profile, calibration, vram_gib=vram_gib, context=context,
                          cpu_threads=machine.threads, llamacpp="llama.cpp" in order,
                          llama=settings, request=request)
    K = policy.experts_per_layer
    # a build before b6325 runs every weight on the CPU by default: priced as a machine without
    cpu_default = None      # a GPU is (the profile holds no CPU attention to price it with)
    if build.default_kind == "cpu":
        price = cpu_only_price(model, machine.cpu, machine.memory, machine.threads,
                               float(trace.context.mean()))
        cpu_default = Speed(price.tpot_us, price.tpot_ci_us)
    answers = tuple(_answer(policy, r, with_files, context, build, cpu_default) for r in order)
    at = request.depth if request is not None else float(trace.context.mean())
    one = next((a for a in answers if a.runtime == "llama.cpp"), None)
    devices = None if one is None else machine_devices(
        model, machine, vram_gib=None if source != "--vram-gib" else vram_gib, context=at,
        llama=settings, rel=relative_half_interval(one.speed), request=request)
    if devices is not None:
        answers = tuple(across_cards(a, devices) if a is one else a for a in answers)
    la = next((a for a in answers if a.runtime == "llama.cpp" and a.host_layers), None)
    host = None if la is None else la.host_layers
    if la is not None and la.speed is not None and la.cache_mib:
        # a MoE cache keeps some host experts on the GPU: priced as the plain placement that
        # decodes as fast, so the lines start from the command's own decode
        host = as_fast_as(model, machine, la.speed.tpot_us, at)
    helps = () if host is None else upgrades(
        model, machine, host, at, None if devices is None else devices.blocks())
    winner = (policy.candidate, _speed(policy, policy.candidate))
    return Advice(model, machine, float(vram_gib), source, K, context, routing, answers, winner,
                  policy, _default_at_trace(policy, cpu_default), weights_source, build,
                  request, helps, devices)


def _default_at_trace(policy: Policy, cpu_default: Speed | None) -> Speed | None:
    """llama.cpp's default at the trace's context, where the Policy Matrix's winner is priced
    (the two compared at one operating point)."""
    answer = policy.llamacpp_answer
    base = None if answer is None else answer.baseline
    if base is not None and base.default.status == "cpu":
        return cpu_default
    return None if base is None or base.tpot_us is None else Speed(base.tpot_us,
                                                                   base.tpot_ci_us)


def _speed(policy: Policy, candidate: str) -> Speed:
    ci = policy.interval_us(candidate)
    return Speed(policy.cope_us(candidate), None if ci is None else (float(ci[0]), float(ci[1])))


def _answer(policy: Policy, runtime: str, with_files: bool, context: int,
            build: Build | None = None, cpu_default: Speed | None = None) -> RuntimeAnswer:
    """One runtime's command, what it runs and its predicted speed, and its default
    (``build``: the llama.cpp build assumed, as the user named it; ``cpu_default``: its
    default's speed when that build runs every weight on the CPU)."""
    r = render(policy, runtime, with_files=with_files)
    runs = policy.candidate if r.exact else r.deployed
    notes: list[str] = []
    detail = () if r.exact else (r.summary,)      # what the runtime runs instead: --explain's
    side = get_format(runtime).side_file
    if side is not None:
        notes.append(f"the command reads the {side.what} file it names (--output-dir DIR writes "
                     "it there)")
    speed = None if runs is None else _speed(policy, runs)
    rec = policy.llamacpp_cache
    request, explain, host_layers, cache_mib = None, tuple[str, ...](), None, 0
    command = r.lead
    alternatives: list[Alternative] = []
    answer = policy.llamacpp_answer if runtime == "llama.cpp" and policy.chosen_by == "best" \
        else None
    if answer is not None:
        # the llama.cpp text leads with the answer llama.cpp itself can run, made once
        first = answer.recommended
        command, runs, request = first.command(), first.runs, first.request
        host_layers, cache_mib = first.host_layers, first.flags.cache_mib
        speed = _offer_speed(first)
        notes += answer.notes
        alternatives += [_alternative(o) for o in answer.alternatives]
        explain = tuple(line.lstrip("# ").rstrip() for line in
                        cache_lines(answer, rec, policy.model, explain=True)[:-1])
    flag = get_format(runtime).context_flag
    if flag and (command is None or flag not in command.split()):   # a command without it
        notes.insert(0, f"add {flag} {context}: the VRAM budget holds {context} tokens of KV "
                        "cache")
    what, default = runtime_default(policy, runtime, cpu_default)
    if runs is None:
        notes.append(f"{get_format(runtime).label}'s setting is outside the Policy Matrix: not "
                     "predicted")
    said = next(iter(build_lines(rec, build)), None) if runtime == "llama.cpp" else None
    default_request = None if answer is None or answer.default is None \
        else answer.default.request
    return RuntimeAnswer(runtime, command, runs, speed, what, default, tuple(notes), r.files,
                         tuple(alternatives), said, request, default_request, explain,
                         host_layers, detail, cache_mib)


def _offer_speed(o: Offer) -> Speed | None:
    return None if o.tpot_us is None else Speed(o.tpot_us, o.tpot_ci_us)


def _alternative(o: Offer) -> Alternative:
    return Alternative(o.label, o.command(), _offer_speed(o), o.note, o.request,
                       o.kind.name.lower(), o.kind.acted_on)


def runtime_default(policy: Policy, runtime: str, cpu_default: Speed | None = None
                    ) -> tuple[str, Speed | None]:
    """What ``runtime`` does with no placement flag, and its predicted speed (None: unknown, or
    it does not load at this VRAM)."""
    f = get_format(runtime)
    if f.default_kind == "fit":
        return llamacpp_default(policy, cpu_default)
    if f.default_kind == "gpu":
        if policy.experts_per_layer < policy.model.n_experts:
            return f.default + ": does not fit this VRAM", None
        return f.default, _speed(policy, LAYER_PARTITION)
    return f.default + ", unknown", None


def llamacpp_default(policy: Policy, cpu_default: Speed | None = None
                     ) -> tuple[str, Speed | None]:
    """llama.cpp with no placement flag, and its speed as the answer prices it
    (:attr:`Policy.llamacpp_answer`'s default, at the answer's operating point): the placement
    ``--fit`` (on by default) chooses at the same budget; a build before ``--fit``: its own
    default; before b6325 every weight on the CPU, ``cpu_default``'s speed."""
    f = get_format("llama.cpp")
    answer: LlamaAnswer | None = policy.llamacpp_answer
    base = None if answer is None else answer.baseline
    if answer is None or base is None:
        return f.default + ": not compared (llama.cpp's search did not run)", None
    head = f.default if answer.build.default_kind == "fit" else "no placement flags"
    what = f"{head}: {base.default.describe()}"
    if base.default.status == "cpu" and cpu_default is not None:
        return f"{what}, priced with every weight on the CPU (cpu_only_price)", cpu_default
    if answer.default is None:
        return f"{what}; not priced: {base.default.why_not_priced}", None
    return what, _offer_speed(answer.default)


def _cpu_only(model: ModelGeometry, machine: Machine, order: list[str], context: int,
              trace: Trace, routing: str, search_threads: bool = False) -> Advice:
    """No GPU: llama.cpp and ik_llama.cpp run every weight on the CPU; the rest need a GPU.
    ``search_threads``: the threads were not given, so the fastest count by the model
    (:func:`~cope_core.estimate.cpu_only.best_threads`) is offered beside the cores when it is
    fewer and faster. Offered, not run: the model's barrier grows more steeply with threads
    than the published sweeps do (docs/results.md#published-cpu-ab-sets)."""
    at = float(trace.context.mean())
    price = cpu_only_price(model, machine.cpu, machine.memory, machine.threads, at)
    speed = Speed(price.tpot_us, price.tpot_ci_us)
    one = cpu_only_answer(machine.threads, price.tpot_us, price.tpot_ci_us, latest())
    fewer: tuple[Alternative, ...] = ()
    if search_threads:
        choice = best_threads(model, machine.cpu, machine.memory, machine.threads, at)
        if choice.fewer:
            few = cpu_only_price(model, machine.cpu, machine.memory, choice.threads, at)
            cmd = cpu_only_answer(choice.threads, few.tpot_us, few.tpot_ci_us, latest())
            fewer = (Alternative(
                "fewer threads", cmd.recommended.command(), Speed(few.tpot_us, few.tpot_ci_us),
                f"the model finds -t {choice.threads} faster than the {choice.default_threads} "
                "cores: past the threads that saturate memory every ggml barrier costs more; "
                "its barrier grows more steeply than published sweeps measure, so try both",
                kind="fewer_threads"),)
    answers = []
    for r in order:
        if get_format(r).cpu_only:
            answers.append(RuntimeAnswer(
                r, one.recommended.command(), one.recommended.runs, speed,
                "the same: with no GPU every weight is on the CPU", speed,
                ("no GPU: nothing to place; priced with every weight and operation on the CPU "
                 "(cope_core/estimate/cpu_only.py)",), alternatives=fewer))
        else:
            answers.append(RuntimeAnswer(r, None, None, None, "needs a GPU", None,
                                         (f"{get_format(r).label} needs a GPU",)))
    return Advice(model, machine, None, "no GPU", None, context, routing, tuple(answers), None,
                  None, speed, helps=upgrades(model, machine, model.n_layers, at))
