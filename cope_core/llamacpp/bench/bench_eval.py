"""A prediction scored against llama-bench's results (docs/formats.md#llama-bench-results).

Each decode row (``tg``) is matched to the configuration it ran: the model file (by its size,
``llama_model_size``), where every tensor of the file went and the thread count. The placement
is llama.cpp's own: the row's ``-ot`` patterns first, then llama-bench's ``--n-cpu-moe``
patterns (``blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` for blocks ``i < n_cpu_moe``,
dense prefix counted, ``tools/llama-bench/llama-bench.cpp`` l. 1257-1291 and
``common/common.h`` l. 1224-1230 of b11434), the first pattern whose ``regex_search`` matches a
tensor's name choosing its buffer, else ``-ngl``. A row COPE prices is one whose every tensor but
the token embedding is on the GPU except the routed experts of whole MoE blocks, on the CPU:
llama.cpp's plain ``--n-cpu-moe`` placement at ``n`` MoE layers on the CPU, priced by
:func:`~cope_core.llamacpp.cache.cache_search.placement_tpot` (whichever blocks they are: the
profile prices every MoE layer alike). Every other row is listed with why, never guessed.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...geometry import ModelGeometry
from ...platforms import PlatformSpec
from ...profile.data import Profile
from ..answer.builds import Build
from ..answer.devices_answer import Cards
from ..answer.prompt import PromptRun, prompt_time
from ..cache.cache_search import placement_tpot
from ..placement.command import EXPERT_TENSORS, n_cpu_moe_patterns
from ..placement.device_search import blocks_tpot
from ..placement.vram import LlamaModel
from .bench_devices import row_blocks, uses_several
from .bench_file import BenchRow

#: a routed-expert tensor's name, its block captured
_EXPERTS = re.compile(rf"^blk\.(\d+){EXPERT_TENSORS}\.")


def host_buffer(name: str) -> bool:
    """Whether an ``-ot`` buffer name is host memory: the CPU's (``CPU``, ``CPU_REPACK``, ...)
    or a backend's pinned host buffer (``CUDA_Host``, ``Vulkan_Host``)."""
    return name.upper().startswith("CPU") or name.endswith("_Host")


@dataclass(frozen=True)
class BenchMatch:
    """One row and what COPE made of it: the MoE layers it ran on the CPU and the prediction,
    or why it was not matched (``reason``), and the thread count it was priced at."""

    row: BenchRow
    reason: str = ""
    n_cpu: int | None = None
    cpu_blocks: tuple[int, ...] = ()
    context: float | None = None
    predicted_ts: float | None = None
    threads: int | None = None

    @property
    def matched(self) -> bool:
        return not self.reason

    @property
    def error_pct(self) -> float | None:
        """(predicted - measured) / measured, in percent."""
        if self.predicted_ts is None or not self.row.avg_ts:
            return None
        return 100.0 * (self.predicted_ts / self.row.avg_ts - 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {**self.row.to_dict(), "matched": self.matched, "reason": self.reason or None,
                "n_cpu_moe_layers": self.n_cpu, "cpu_blocks": list(self.cpu_blocks),
                "context": self.context, "predicted_ts": self.predicted_ts,
                "measured_ts": self.row.avg_ts, "error_pct": self.error_pct}


@dataclass(frozen=True)
class KindScores:
    """The scores of one kind of row (prompt rows), over its matched rows."""

    matched: int
    spearman: float | None
    pick: int | None
    best: int | None
    regret_pct: float | None
    mean_abs_error_pct: float | None


@dataclass(frozen=True)
class BenchEvaluation:
    """The rows scored: per matched row the error, over the matched decode rows the rank
    correlation (Spearman; None below two rows or with a constant side) and the regret of COPE's
    pick (the fastest predicted matched row): how much slower it measured than the fastest
    measured, in %; the prompt rows' own scores apart (``prompt``)."""

    matches: tuple[BenchMatch, ...]
    spearman: float | None
    pick: int | None              # index into matches
    best: int | None
    regret_pct: float | None
    mean_abs_error_pct: float | None
    prompt: KindScores | None = None

    @property
    def matched(self) -> list[BenchMatch]:
        return [m for m in self.matches if m.matched]

    def to_dict(self) -> dict[str, Any]:
        def line(i: int | None) -> int | None:
            return None if i is None else self.matches[i].row.line
        return {"rows": [m.to_dict() for m in self.matches],
                "matched": len(self.matched), "unmatched": len(self.matches) - len(self.matched),
                "mean_abs_error_pct": self.mean_abs_error_pct, "spearman": self.spearman,
                "pick_line": line(self.pick), "best_line": line(self.best),
                "regret_pct": self.regret_pct,
                **({} if self.prompt is None else {"prompt": {
                    "matched": self.prompt.matched,
                    "mean_abs_error_pct": self.prompt.mean_abs_error_pct,
                    "spearman": self.prompt.spearman, "pick_line": line(self.prompt.pick),
                    "best_line": line(self.prompt.best),
                    "regret_pct": self.prompt.regret_pct}})}


def model_tensor_bytes(m: LlamaModel) -> int:
    """What llama-bench reports as ``model_size``: the bytes of the tensors llama.cpp loads."""
    return sum(n for _, n in m.tensors)


def placement_of(row: BenchRow, m: LlamaModel) -> tuple[tuple[int, ...], str]:
    """The blocks whose routed experts ran on the CPU, or ``((), why)`` when the row's placement
    is not whole MoE blocks' experts on the CPU and everything else on the GPU."""
    ngl = row.n_gpu_layers
    if ngl is not None and 0 <= ngl < m.n_layer + 1:
        return (), (f"-ngl {ngl} keeps blocks on the CPU (every block and the output need "
                    f"-ngl >= {m.n_layer + 1}): COPE prices only the routed experts on the CPU")
    overrides = [(re.compile(p), host_buffer(b)) for p, b in row.overrides]
    overrides += [(re.compile(p), True) for p in n_cpu_moe_patterns(row.n_cpu_moe)]
    host: dict[int, set[bool]] = {}
    for name, _ in m.tensors:
        on_host = next((h for rx, h in overrides if rx.search(name)), False)
        e = _EXPERTS.match(name)
        if e:
            host.setdefault(int(e.group(1)), set()).add(on_host)
        elif on_host and name != "token_embd.weight":   # the input layer is on host anyway
            return (), (f"the overrides put {name} in host memory: COPE prices whole MoE "
                        "blocks' routed experts on the CPU and nothing else")
    split = [b for b, s in sorted(host.items()) if len(s) > 1]
    if split:
        return (), (f"block {split[0]}'s routed experts are split between host memory and the "
                    "GPU: COPE prices whole blocks")
    return tuple(b for b, s in sorted(host.items()) if True in s), ""


def prompt_run(r: BenchRow, threads: int) -> tuple[PromptRun, Build | None]:
    """The prompt a ``pp`` row ran (its ``-p``, ``-d``, ``-ub``, ``-b``, op offload and load mode)
    at ``threads``, and its build (None: not said, the newest known is priced)."""
    run = PromptRun(r.n_prompt, r.n_depth, r.n_ubatch, r.n_batch, op_offload=not r.no_op_offload,
                    threads=threads, pinned=r.pinned)
    return run, (Build(r.build_number, "the row's") if r.build_number else None)


def match_bench_rows(rows: Sequence[BenchRow], m: LlamaModel, geometry: ModelGeometry,
                     profile: Profile, *, cpu_threads: int | None = None,
                     gpu_share: float | None = None,
                     spec: PlatformSpec | None = None,
                     cards: Cards | None = None) -> tuple[BenchMatch, ...]:
    """Each row matched to its configuration and predicted, or listed with why not: a decode
    row (``tg``) by the profile, a prompt row (``pp``, at its ``-ub``, ``-b``, op offload and
    depth) by the prompt model on the machine's peaks
    (:func:`~cope_core.llamacpp.answer.prompt.prompt_time`).

    Parameters
    ----------
    rows : sequence of BenchRow
    m : LlamaModel
        The model file predicted (:func:`~cope_core.llamacpp.placement.vram.read_llama_model`).
    geometry : ModelGeometry
        Its geometry, as the profile prices it.
    profile : Profile
        The machine; a row is predicted at its own thread count, which the profile must have.
    cpu_threads : int, optional
        The thread count of rows that do not say (a markdown table leaves the default out).
    gpu_share : float, optional
        The profile's GPU share (default its largest).
    spec : PlatformSpec, optional
        The machine's peaks, which price prompt rows (None: they are listed, not priced).
    cards : Cards, optional
        The machine's cards (``--gpu a,b``): a decode row that ran on several is priced block
        by block (:mod:`.bench_devices`); without them such a row is listed with why.
    """
    size = model_tensor_bytes(m)
    threads_there = sorted({t for t, _ in profile.operating_points()})
    out = []
    for r in rows:
        why = ""
        if r.kind == "pg":
            why = (f"{r.test} times prompt and decode together: COPE predicts each apart (pp "
                   "and tg rows)")
        elif r.kind == "pp" and spec is None:
            why = (f"{r.test} is prompt processing: priced from the machine's peaks, so it "
                   "needs --gpu (a measured profile holds decode costs only)")
        elif abs(r.model_size - size) > r.model_size_tol:
            why = (f"measured on another model file: model_size {r.model_size:.0f} bytes, "
                   f"{m.path} loads {size}")
        elif r.no_kv_offload:
            why = "-nkvo keeps the KV cache in host memory: COPE prices it on the GPU"
        elif r.backends == "CPU" or (r.model_filename and not r.gpu_info):
            why = "no GPU in this run (CPU backend only): COPE prices offload placements"
        if why:
            out.append(BenchMatch(r, why))
            continue
        threads = r.n_threads if r.n_threads is not None else cpu_threads
        if r.kind == "tg" and uses_several(r, cards):
            out.append(_several(r, m, geometry, cards, threads))
            continue
        blocks, why = placement_of(r, m)
        if not why and threads is None:
            why = ("the table has no threads column (llama-bench leaves its default out): say "
                   "--threads")
        elif not why and r.kind == "tg" and threads not in threads_there:
            why = f"the profile has no operating point at {threads} threads ({threads_there})"
        if why:
            out.append(BenchMatch(r, why))
            continue
        n_cpu = len(blocks)
        if r.kind == "pp":
            assert spec is not None and threads is not None
            run, build = prompt_run(r, threads)
            pt = prompt_time(geometry, spec, n_cpu, run, build)
            out.append(BenchMatch(r, "", n_cpu, blocks, r.n_depth + r.n_prompt / 2,
                                  pt.tokens_per_s, threads))
            continue
        # decode token i of tg<n> @ d<d> attends to d + i + 1 tokens: the mean over the test
        context = r.n_depth + (r.n_gen + 1) / 2
        us = float(placement_tpot(profile, geometry, [n_cpu], context, cpu_threads=threads,
                                  gpu_share=gpu_share)[0])
        out.append(BenchMatch(r, "", n_cpu, blocks, context, 1e6 / us))
    return tuple(out)


def _several(r: BenchRow, m: LlamaModel, g: ModelGeometry, cards: Cards | None,
             threads: int | None) -> BenchMatch:
    """A decode row that ran on several devices, priced block by block on ``cards``."""
    if cards is None or len(cards.names) < 2:
        return BenchMatch(r, f"ran on several devices ({r.devices}, -ts "
                             f"{'/'.join(f'{x:g}' for x in r.tensor_split)}): give the "
                             "machine's cards, --gpu a,b")
    if threads is None:
        return BenchMatch(r, "the table has no threads column (llama-bench leaves its default "
                             "out): say --threads")
    attention, experts, _, why = row_blocks(r, m, cards)
    if why:
        return BenchMatch(r, why)
    context = r.n_depth + (r.n_gen + 1) / 2
    us = blocks_tpot(cards.costs(g, threads, context), attention, experts, cards.handoff(g))
    host = tuple(b for b, e in enumerate(experts) if e == -1)
    return BenchMatch(r, "", len(host), host, context, 1e6 / us, threads)


def _scores(matches: Sequence[BenchMatch], idx: list[int]
            ) -> tuple[float | None, int | None, int | None, float | None, float | None]:
    """Spearman, the pick and best (indices), regret and mean absolute error over ``idx``."""
    if not idx:
        return None, None, None, None, None
    pred = np.array([matches[i].predicted_ts for i in idx], np.float64)
    meas = np.array([matches[i].row.avg_ts for i in idx], np.float64)
    rho = None
    if len(idx) >= 2 and np.ptp(pred) > 0 and np.ptp(meas) > 0:
        # scipy.stats takes seconds to import: only here, not on every command's path
        from scipy.stats import spearmanr
        rho = float(spearmanr(pred, meas).statistic)
    pick, best = idx[int(np.argmax(pred))], idx[int(np.argmax(meas))]
    regret = 100.0 * (matches[best].row.avg_ts / matches[pick].row.avg_ts - 1.0)
    mae = float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)
    return rho, pick, best, float(regret), mae


def score_bench_rows(matches: Sequence[BenchMatch]) -> BenchEvaluation:
    """Errors, Spearman rank correlation and regret over the matched decode rows, and the same
    over the matched prompt rows apart (``prompt``; None when none matched)."""
    of = {k: [i for i, x in enumerate(matches) if x.matched and x.row.kind == k]
          for k in ("tg", "pp")}
    prompt = None
    if of["pp"]:
        rho, pick, best, regret, mae = _scores(matches, of["pp"])
        prompt = KindScores(len(of["pp"]), rho, pick, best, regret, mae)
    return BenchEvaluation(tuple(matches), *_scores(matches, of["tg"]), prompt=prompt)
