"""The record of ``cope verify --llama-bench`` (``cope.verify-llamabench/1``,
docs/formats.md#verify-record-with-llama-bench): the successor of ``cope.verify/1`` for
llama.cpp's own configurations. What was predicted and measured per contender, what was skipped
and why, the verified configuration with its measured tokens per second and the prediction's
error, the refit of the machine's constants with its held-out error, and the llama.cpp command
of the verified configuration (``cope export --from-verify`` prints it)."""
from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...errors import CopeInputError
from ...estimate.refit import CPU_LAYER_FIXED, GPU_BASE, HOST_EXPERTS, FitPoint, Knob, refit
from ...files import plain, write_atomic
from ...machine import Machine
from ...version import __version__
from ..placement.command import LlamaFlags
from .bench_run import BenchBuild
from .bench_verify import BenchContender, BenchSettings, Plan, RaceState, measured_us

SCHEMA = "cope.verify-llamabench/1"
def server_command(model: str, args: tuple[str, ...] | list[str]) -> str:
    """The llama-server line of a contender's llama-bench arguments (``-fitt M`` is
    llama-server's default ``--fit on`` with ``-fitt M``)."""
    return LlamaFlags.from_bench_argv(args).command(model)


def knobs_for(cpu_only: bool) -> list[Knob]:
    """What the machine decides, in the order they are fitted as points allow."""
    return [HOST_EXPERTS] if cpu_only else [HOST_EXPERTS, GPU_BASE, CPU_LAYER_FIXED]


def refit_race(p: Plan, st: RaceState, cpu_only: bool) -> dict[str, Any] | None:
    """Refit on the measured contenders but the verified one, held out (one point more
    measured than fitted); then re-price every configuration of the plan. None below two
    measured contenders."""
    meas = measured_us(st)
    by_name = {c.name: c for c in p.contenders}
    names = [n for n in by_name if n in meas]
    if len(names) < 2:
        return None
    held = st.alive[0]
    fit_names = [n for n in names if n != held]
    knobs = knobs_for(cpu_only)[:len(fit_names)]

    def point(n: str) -> FitPoint:
        return FitPoint(n, by_name[n].threads, meas[n], by_name[n])
    r = refit(p.spec, knobs, [point(n) for n in fit_names],
              lambda s, q: p.price(s, q.what), held_out=[point(held)])
    out = r.to_dict()
    out["repredicted"] = [
        {"name": c.name, "predicted_before_ts": 1e6 / c.predicted_us,
         "predicted_after_ts": 1e6 / p.price(r.spec_at(c.threads), c)} for c in p.curve]
    return out


def bench_race_record(p: Plan, st: RaceState, build: BenchBuild, machine: Machine,
                 settings: BenchSettings, model: str) -> dict[str, Any]:
    """The whole record as a JSON-ready dict."""
    meas = measured_us(st)
    dropped = {d["name"]: d for d in st.dropped}

    def entry(c: BenchContender) -> dict[str, Any]:
        m = meas.get(c.name)
        return {"name": c.name, "args": list(c.args), "threads": c.threads,
                "n_cpu_moe": c.n_cpu_moe, "predicted_ts": 1e6 / c.predicted_us,
                "measured_ts": None if m is None else 1e6 / m,
                "error_pct": None if m is None else 100.0 * (m / c.predicted_us - 1.0),
                "dropped_after_round": (dropped[c.name]["round"] + 1
                                        if c.name in dropped else None)}
    win = next(c for c in p.contenders if c.name == st.alive[0])
    pick = p.contenders[0]
    return plain({  # NaN and infinities as null, as cope.verify/1 writes them
        "schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "tool": {"name": "cope", "version": __version__},
        "model": st.model, "machine": machine.to_dict(), "llama_bench": build.to_dict(),
        "settings": st.settings, "contenders": [entry(c) for c in p.contenders],
        "skipped": [{"name": n, "why": w} for n, w in p.skipped],
        "rounds": st.rounds, "stop": st.stop, "remaining": st.alive,
        "predicted_pick": pick.name, "agrees": pick.name in st.alive,
        "verified": {**entry(win), "command": server_command(model, win.args)},
        "refit": refit_race(p, st, machine.spec is None), "runs": st.runs})


def write_bench_record(record: dict[str, Any], path: str, *, overwrite: bool) -> None:
    write_atomic(path, json.dumps(record, indent=1, allow_nan=False) + "\n",
                 overwrite=overwrite)


def read_bench_record(data: Any, source: str) -> dict[str, Any]:
    """Check a parsed ``cope.verify-llamabench/1`` object enough to render it."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CopeInputError(f"expected {SCHEMA!r}", source=source, field="schema")
    v = data.get("verified")
    if not isinstance(v, dict) or not isinstance(v.get("command"), str):
        raise CopeInputError("expected an object with the verified configuration's command",
                             source=source, field="verified")
    return data


def is_bench_record(path: str) -> bool:
    """Whether the JSON file at ``path`` says it is a ``cope.verify-llamabench/1`` record."""
    try:
        return json.loads(Path(path).read_text()).get("schema") == SCHEMA
    except (OSError, ValueError, AttributeError):
        return False
