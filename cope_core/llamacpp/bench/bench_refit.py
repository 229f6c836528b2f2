"""The prompt model's two machine rates refitted from a user's own llama-bench prompt rows
(``cope evaluate --llama-bench FILE --refit OUT``; docs/design.md#prompt-processing): the GPU's
achieved prompt efficiency (``PlatformSpec.gpu_prompt_efficiency``) and the host's pageable copy
(``PlatformSpec.host_copy_bandwidth``), each fitted only where the rows decide it. The record
(``cope.prompt-refit/1``, docs/formats.md#prompt-refit) is what ``--prompt-refit FILE`` gives
advise, predict and export.

The fit is ``scipy.optimize.least_squares`` on the log ratio of predicted to measured tokens per
second, within bounds; with three rows or more each row is also predicted by a fit without it,
so the record says how well the refit predicts a row it did not see.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CopeInputError
from ...files import write_atomic
from ...geometry import ModelGeometry
from ...platforms import PlatformSpec
from ...version import __version__
from ..answer.builds import Build, latest
from ..answer.prompt import PromptRun, offloads, prompt_efficiency, prompt_time
from ..answer.prompt_rates import copy_bandwidth
from .bench_eval import BenchMatch, prompt_run

SCHEMA = "cope.prompt-refit/1"
#: the refitted rates' bounds: an efficiency of the FP16 peak, a pageable copy in bytes/s
EFFICIENCY_BOUNDS = (0.01, 2.0)
COPY_BOUNDS = (1e8, 1e11)
FIELDS = ("gpu_prompt_efficiency", "host_copy_bandwidth")


@dataclass(frozen=True)
class PromptRefit:
    """The refitted rates (``fields``: spec field -> value), the rows used and their mean
    absolute error (%) before and after, and held out (None below three rows)."""

    fields: dict[str, float]
    before: dict[str, float]
    rows: int
    error_before_pct: float
    error_after_pct: float
    held_out_pct: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"fields": self.fields, "before": self.before, "rows": self.rows,
                "error_before_pct": self.error_before_pct,
                "error_after_pct": self.error_after_pct, "held_out_error_pct": self.held_out_pct}


def with_rates(spec: PlatformSpec, fields: Mapping[str, float]) -> PlatformSpec:
    """``spec`` with the prompt rates of ``fields`` (those it names)."""
    return replace(spec, gpu_prompt_efficiency=fields.get(FIELDS[0], spec.gpu_prompt_efficiency),
                   host_copy_bandwidth=fields.get(FIELDS[1], spec.host_copy_bandwidth))


def _run(m: BenchMatch) -> tuple[PromptRun, Build | None]:
    # the prompt as the match priced it, at the match's thread count
    return prompt_run(m.row, m.threads or 1)


def _copies_pageable(m: BenchMatch) -> bool:
    """Whether the row's time holds a copy of host experts from pageable memory."""
    run, build = _run(m)
    b = build if build is not None else latest()
    return bool(m.n_cpu) and not run.pinned and any(offloads(run, t, b) for t, _ in run.chunks())


def _log_errors(matches: Sequence[BenchMatch], g: ModelGeometry, spec: PlatformSpec,
                names: Sequence[str], x: np.ndarray) -> np.ndarray:
    s = with_rates(spec, dict(zip(names, np.exp(x).tolist())))
    out = []
    for m in matches:
        run, build = _run(m)
        got = prompt_time(g, s, int(m.n_cpu or 0), run, build).tokens_per_s
        out.append(math.log(got / m.row.avg_ts))
    return np.array(out)


def _fit(matches: Sequence[BenchMatch], g: ModelGeometry, spec: PlatformSpec,
         names: Sequence[str], x0: np.ndarray) -> np.ndarray:
    from scipy.optimize import least_squares  # seconds to import: only when refitting
    lo = np.log([EFFICIENCY_BOUNDS[0] if n == FIELDS[0] else COPY_BOUNDS[0] for n in names])
    hi = np.log([EFFICIENCY_BOUNDS[1] if n == FIELDS[0] else COPY_BOUNDS[1] for n in names])
    r = least_squares(lambda x: _log_errors(matches, g, spec, names, x),
                      np.clip(x0, lo + 1e-9, hi - 1e-9), bounds=(lo, hi), diff_step=1e-3)
    return np.asarray(r.x)


def refit_prompt(matches: Sequence[BenchMatch], g: ModelGeometry,
                 spec: PlatformSpec) -> PromptRefit:
    """Refit on the matched prompt rows of ``matches``: the prompt efficiency always, the
    pageable copy where a row copies host experts from pageable memory and there are more rows
    than one."""
    pp = [m for m in matches if m.matched and m.row.kind == "pp"]
    if not pp:
        raise CopeInputError("no prompt row (pp) matched a configuration COPE prices: nothing "
                             "to refit", field="--refit")
    names = [FIELDS[0]]
    if len(pp) > 1 and any(_copies_pageable(m) for m in pp):
        names.append(FIELDS[1])
    before = {FIELDS[0]: prompt_efficiency(spec),
              FIELDS[1]: copy_bandwidth(spec, pinned=False)}
    x0 = np.log([before[n] for n in names])
    x = _fit(pp, g, spec, names, x0)
    err_before = float(np.mean(np.abs(np.expm1(_log_errors(pp, g, spec, names, x0))))) * 100
    err_after = float(np.mean(np.abs(np.expm1(_log_errors(pp, g, spec, names, x))))) * 100
    held = None
    if len(pp) >= 3:
        errs = []
        for i in range(len(pp)):
            rest = pp[:i] + pp[i + 1:]
            xi = _fit(rest, g, spec, names, x)
            errs.append(abs(math.expm1(float(_log_errors([pp[i]], g, spec, names, xi)[0]))))
        held = 100 * float(np.mean(errs))
    return PromptRefit(dict(zip(names, np.exp(x).tolist())), {n: before[n] for n in names},
                       len(pp), err_before, err_after, held)


def write_prompt_refit(path: str, r: PromptRefit, spec: PlatformSpec, source: str) -> None:
    """The record, written atomically; an existing file is not overwritten."""
    if Path(path).exists():
        raise CopeInputError("exists: a refit is not written over a file (name a new one)",
                             source=path, field="--refit")
    record = {"schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"),
              "tool": {"name": "cope", "version": __version__}, "llama_bench": source,
              "gpu": spec.gpu_name, "link": spec.link_name, **r.to_dict()}
    write_atomic(path, json.dumps(record, indent=1, allow_nan=False) + "\n")


def read_prompt_refit(path: str, spec: PlatformSpec) -> PlatformSpec:
    """``spec`` with a ``cope.prompt-refit/1`` record's rates; the record must be of its GPU."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except OSError as exc:
        raise CopeInputError(f"cannot read: {exc.strerror}", source=path,
                             field="--prompt-refit") from None
    except ValueError:
        raise CopeInputError("expected a JSON object (cope evaluate --llama-bench ... --refit "
                             "writes one)", source=path, field="--prompt-refit") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CopeInputError(f"expected {SCHEMA!r}", source=path, field="schema")
    if data.get("gpu") != spec.gpu_name:
        raise CopeInputError(f"the refit was measured on {data.get('gpu')!r}, the machine's "
                             f"GPU is {spec.gpu_name!r}", source=path, field="gpu")
    fields = data.get("fields")
    if not isinstance(fields, dict) or not fields or set(fields) - set(FIELDS) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v > 0 for v in fields.values()):
        raise CopeInputError(f"expected positive numbers for some of {list(FIELDS)}",
                             source=path, field="fields")
    return with_rates(spec, {k: float(v) for k, v in fields.items()})


def refit_lines(r: PromptRefit, path: str) -> list[str]:
    """What the refit moved, its error before and after (held out), and how to use it."""
    def val(name: str, v: float) -> str:
        return f"{v / 1e9:.2f} GB/s" if name == FIELDS[1] else f"{v:.3f}"
    moved = ", ".join(f"{n} {val(n, r.before[n])} -> {val(n, v)}" for n, v in r.fields.items())
    held = "" if r.held_out_pct is None else f", {r.held_out_pct:.1f} % held out"
    out = [f"prompt refit on {r.rows} pp rows: {moved}; mean absolute error "
           f"{r.error_before_pct:.1f} % -> {r.error_after_pct:.1f} %{held}"]
    pinned = [n for n, v in r.fields.items() if any(
        abs(math.log(v / b)) < 0.01 for b in (EFFICIENCY_BOUNDS if n == FIELDS[0]
                                               else COPY_BOUNDS))]
    if pinned:
        out.append(f"  warning: {', '.join(pinned)} stopped at its bound: these rows are not "
                   "explained by the two rates (another machine, another cost); check --gpu")
    return out + [f"  written to {path}: give it to advise, predict or export as "
                  f"--prompt-refit {path}"]
