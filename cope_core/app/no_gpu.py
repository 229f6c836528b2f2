"""The app on a machine without a GPU ("no GPU" as the sidebar's GPU), as pure logic.

There is no placement to choose: every weight sits in host memory and every operation runs on
the CPU's threads (``llama-server -ngl 0``). The answer is the one ``cope advise --gpu none``
prints, from the same call (:func:`cope_core.export.advising.advise`, whose CPU-only path prices
with :func:`cope_core.estimate.cpu_only.cpu_only_price`); each page says what of it does not
apply without a GPU (:data:`PAGES`).
"""
from __future__ import annotations

from typing import Any

from ..export import Advice, advise
from ..trace.data import Trace
from .machine_choice import MachineChoice

#: What "no GPU" means on each page (by its title), and whether the page stops there (True:
#: everything it shows needs a GPU) or goes on (its content does not).
PAGES: dict[str, tuple[str, bool]] = {
    "COPE Explorer": (
        "There is no VRAM budget and no placement to choose: the Policy Matrix's winner, its "
        "runner-up and the layer-partition baseline all put something on a GPU, so none is "
        "shown.", True),
    "Policy Matrix": (
        "The Policy Matrix does not apply: its rows say which experts reside on the GPU "
        "(fixed, cached, layer partition) and its columns how a miss is split between CPU and "
        "GPU; without a GPU every expert is read from host memory on every token. llama.cpp's "
        "MoE cache rows (a GPU cache of host experts) do not apply either.", True),
    "Landscape: what-if VRAM budgets": (
        "There is no VRAM budget to sweep: the speed below is the same at every budget.", True),
    "Predicted vs measured": (
        "The shipped measurements were taken with a GPU: they are set aside.", True),
    "Traces": (
        "The routing below is the model's, whatever the machine: it is shown as usual. "
        "Without a GPU no expert is resident, so no hit is counted.", False),
    "Profiles": (
        "The profile's GPU costs (kernels, transfers, schedules) do not apply: the speed "
        "below prices every operation at the CPU's achieved FLOP/s and host bandwidth.", True),
    "Compare platforms": (
        "Platforms are compared by their GPUs: choose a GPU in the sidebar to compare. Your "
        "CPU-only machine answers below.", True),
    "Export a policy": (
        "Only the runtimes that run without a GPU are answered (every weight on the CPU, "
        "no placement flag); the others need one.", True),
}
#: What "no GPU" means on a page :data:`PAGES` does not name.
OTHER = ("Without a GPU there is nothing to place: every weight and operation is on the CPU.",
         True)


def page_note(title: str) -> tuple[str, bool]:
    """``(what no GPU means on the page titled title, whether the page stops there)``."""
    text, stops = PAGES.get(title, OTHER)
    return f"**No GPU.** {text}", stops


def cpu_only_advice(trace: Trace, calibration: Trace | None, choice: MachineChoice) -> Advice:
    """``cope advise``'s answer for the chosen CPU-only machine and this trace's routing."""
    m = choice.compose()
    assert m.cpu_only
    return advise(trace.model, m, trace=trace, calibration=calibration, context=choice.context)


def headline(a: Advice) -> str:
    """One line: the speed with its interval, the machine, the threads and the context."""
    sp = a.baseline
    assert sp is not None                      # the CPU-only path always prices
    ci = sp.tokens_per_s_interval
    span = "" if ci is None else f" (95 % interval {ci[0]:.1f}–{ci[1]:.1f})"
    m = a.machine
    return (f"On the CPU alone ({m.cpu.label}, {m.memory.name}, {a.threads} threads): "
            f"**{sp.tokens_per_s:.1f} tokens/s**{span}, {sp.tpot_us / 1e3:.1f} ms/token, "
            "every weight read from host memory on each token.")


def answer_rows(a: Advice) -> list[dict[str, Any]]:
    """One row per runtime: the command (none: it needs a GPU), tokens/s and why."""
    rows = []
    for r in a.answers:
        sp = r.speed
        rows.append({"runtime": r.runtime, "command": r.command or "—",
                     "tokens/s": None if sp is None else round(sp.tokens_per_s, 1),
                     "ms/token": None if sp is None else round(sp.tpot_us / 1e3, 2),
                     "note": "; ".join(r.notes)})
    return rows
