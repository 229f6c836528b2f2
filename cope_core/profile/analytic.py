"""Analytic what-if profiles: every ``cope.profile/2`` row computed by the roofline from published
peak numbers, for hardware the user does not have. Such a profile is marked ``analytic`` in its
metadata and wherever it is shown; it is never a measurement.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pandas as pd

from .. import roofline as rl
from ..geometry import ModelGeometry
from ..platforms import PlatformSpec
from .data import COLUMNS, Profile, ProfileKey, required_keys

DEFAULT_CONTEXTS = (128, 1024, 4096, 16384)


def default_threads(spec: PlatformSpec) -> list[int]:
    return sorted({t for t in (1, 2, 4, 8, 16, 32, 64) if t <= spec.cpu_cores} | {spec.cpu_cores})


def _row_cost(g: ModelGeometry, s: PlatformSpec, threads: int, key: ProfileKey) -> float:
    kind, name, hits, cpu, staged, count = key[:6]
    k = g.top_k
    if kind == "schedule":
        return rl.layer_us(g, s, threads, hits, cpu, staged)
    if kind == "prefetch":
        # the extra time one prefetched expert adds on the copy lane of a fully resident layer
        if count == 0:
            return 0.0
        return (rl.layer_us(g, s, threads, k, 0, 0, prefetched=count)
                - rl.layer_us(g, s, threads, k, 0, 0))
    if kind == "layer":
        if name == "cpu_layer":
            return rl.layer_us(g, s, threads, 0, k, 0)
        return rl.layer_us(g, s, threads, k, 0, 0)
    return {
        "gpu_expert": lambda: rl.gpu_experts_us(g, s, count),
        "staged_gpu_expert": lambda: rl.gpu_experts_us(g, s, count),
        "cpu_expert": lambda: rl.cpu_experts_us(g, s, count, threads),
        "stage": lambda: rl.copy_experts_us(g, s, count),
        "act_copy": lambda: rl.act_copy_us(g, s),
        "prefetch": lambda: rl.copy_experts_us(g, s, 1),
        "sync": lambda: 0.0,     # the roofline has no dispatch or synchronisation cost
        "merge": lambda: 0.0,
    }[name]()


def analytic_profile(model: ModelGeometry, spec: PlatformSpec,
                     cpu_threads: Sequence[int] | None = None,
                     contexts: Sequence[int] = DEFAULT_CONTEXTS) -> Profile:
    """A complete profile whose every cost comes from the roofline of ``spec``.

    Parameters
    ----------
    model : ModelGeometry
    spec : PlatformSpec
        Published or user-given peak numbers.
    cpu_threads : sequence of int, optional
        Operating points (GPU share is always 100); default powers of two up to the core count.
    contexts : sequence of int
        Contexts at which the shared work of one MoE (and dense) block is given.
    """
    threads_list = list(cpu_threads) if cpu_threads else default_threads(spec)
    rows = []
    for t in threads_list:
        for ctx in contexts:  # shared work per part: it composes into any layer count
            parts = [("moe_block", rl.moe_block_us(model, spec, ctx))]
            if model.dense_layers:
                parts.append(("dense_block", rl.dense_block_us(model, spec, ctx)))
            for name, us in parts:
                rows.append((*ProfileKey("shared", name, context=int(ctx)), t, 100.0,
                             float(us), float(us), float(us), 1))
        us = rl.head_us(model, spec)
        rows.append((*ProfileKey("shared", "head"), t, 100.0, us, us, us, 1))
        for key in required_keys(model.top_k):
            us = _row_cost(model, spec, t, key)
            rows.append((*key, t, 100.0, us, us, us, 1))
    table = pd.DataFrame(rows, columns=list(COLUMNS)).astype(COLUMNS)
    platform = {"gpu": spec.gpu_name, "cpu": spec.cpu_name, "link": spec.link_name,
                "torch": None, "host": "analytic", "spec": spec.to_dict()}
    return Profile(table=table, model=model, platform=platform,
                   created=datetime.now(UTC).isoformat(timespec="seconds"),
                   notes=f"ANALYTIC what-if profile of {spec.name}: roofline costs from "
                         f"{spec.source} peak numbers, not measured",
                   analytic=True)
