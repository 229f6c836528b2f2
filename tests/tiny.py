"""Tiny, hand-checkable test data: plain builder functions (``from tiny import tiny_profile``)
that tests call with arguments; ``conftest.py`` wraps the same data as fixtures."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cope_core.export import Policy
from cope_core.geometry import ModelGeometry
from cope_core.matrix import CANDIDATE_IDS
from cope_core.platforms import PlatformSpec
from cope_core.profile.data import COLUMNS, Profile, ProfileKey, beside_keys, required_keys
from cope_core.trace.data import Trace

#: The two operating points of :func:`tiny_profile`: (cpu_threads, gpu_share).
TINY_OPERATING_POINTS = ((8, 100.0), (4, 50.0))
TINY_CONTEXTS = (128, 1024)


def tiny_geometry() -> ModelGeometry:
    """3 MoE layers, 6 experts, top-2: small enough to replay by hand."""
    return ModelGeometry(name="tiny", n_layers=3, n_experts=6, top_k=2, hidden=64,
                         expert_intermediate=32, dtype_bytes=2, n_shared_experts=0,
                         dense_layers=0, n_heads=4, n_kv_heads=2, head_dim=16, vocab=100,
                         non_expert_bytes=100_000)


def tiny_trace() -> Trace:
    """Prompts 3 and 7 with 3 and 2 decode tokens; predictions of width up to 2.

    ``routed[t, l]`` and ``predicted[t, l]`` are spelled out so replay tests can follow them.
    """
    routed = np.array([
        # prompt 3
        [[0, 1], [2, 3], [4, 5]],
        [[1, 0], [3, 4], [5, 0]],
        [[0, 2], [2, 3], [4, 1]],
        # prompt 7
        [[5, 4], [0, 1], [2, 3]],
        [[0, 1], [1, 2], [3, 4]],
    ], dtype=np.int16)
    predicted = np.full((5, 3, 2), -1, dtype=np.int16)
    predicted[0, 0] = [2, 3]      # right about layer 1
    predicted[0, 1] = [4, -1]
    predicted[1, 0] = [3, 5]      # half right
    predicted[2, 1] = [1, 4]
    predicted[3, 0] = [0, -1]
    predicted[3, 1] = [2, 3]
    predicted[4, 0] = [1, 2]      # token 4 layer 1 has no prediction
    return Trace(model=tiny_geometry(), prompt_ids=np.array([3, 7], dtype=np.int32),
                 prompt_start=np.array([0, 3, 5], dtype=np.int64),
                 context=np.array([10, 11, 12, 20, 21], dtype=np.int32),
                 routed=routed, predicted=predicted, source="synthetic",
                 description="tiny hand-written trace", predictor={"name": "oracle", "width": 2})


def default_cost(row: Mapping[str, Any]) -> float:
    """Deterministic, exactly representable costs; slower at fewer CPU threads.

    schedule: 10 per miss + hits (+ 0.5 per CPU miss, so cost_selected splits differ);
    prefetch: 2 + 3q; layer: cpu 50, gpu 20; atomic: R n, C 5n, S 4n, G n; single ops small;
    shared: 100 + context / 128 per token (``decode``); per part, ``moe_block`` 30 + context /
    128, ``dense_block`` 20 + context / 256, ``head`` 10.
    """
    kind, name, h, c, u, n, ctx = (row[k] for k in ("kind", "name", "hits", "cpu", "staged",
                                                    "count", "context"))
    if kind == "shared":
        base = {"decode": 100.0 + ctx / 128, "moe_block": 30.0 + ctx / 128,
                "dense_block": 20.0 + ctx / 256, "head": 10.0}[name]
    elif kind == "schedule":
        base = 10.0 * (c + u) + h + 0.5 * c
    elif kind == "prefetch":
        base = 2.0 + 3.0 * n
    elif kind == "layer":
        base = 50.0 if name == "cpu_layer" else 20.0
    else:
        per_n = {"gpu_expert": 1.0, "cpu_expert": 5.0, "stage": 4.0, "staged_gpu_expert": 1.0}
        single = {"act_copy": 0.5, "sync": 0.25, "merge": 0.125, "prefetch": 3.0}
        base = per_n[name] * n if name in per_n else single[name]
    return base * (8.0 / row["cpu_threads"])


CostSpec = Callable[[Mapping[str, Any]], float] | Mapping[tuple, float] | None


def hand_atomic(prefetch: float = 9.0) -> dict[ProfileKey, float]:
    """Hand-worked atomic costs for :func:`tiny_profile` (top-2, counts 0..2): ``gpu_expert``
    R = [.5, 3, 7], ``cpu_expert`` C = [1, 20, 45], ``stage`` S = [0, 11, 25],
    ``staged_gpu_expert`` G = [0, 2, 5]; ``act_copy`` A = 8, ``sync`` F = .5, ``merge``
    M = .25 and the given ``prefetch``."""
    per_n = {"gpu_expert": [0.5, 3.0, 7.0], "cpu_expert": [1.0, 20.0, 45.0],
             "stage": [0.0, 11.0, 25.0], "staged_gpu_expert": [0.0, 2.0, 5.0]}
    out = {ProfileKey("atomic", name, count=n): v for name, vals in per_n.items()
           for n, v in enumerate(vals)}
    out |= {ProfileKey("atomic", name, count=1): v for name, v in
            (("act_copy", 8.0), ("sync", 0.5), ("merge", 0.25), ("prefetch", prefetch))}
    return out


def tiny_profile(costs: CostSpec = None, *, operating_points=TINY_OPERATING_POINTS,
                 contexts=TINY_CONTEXTS, geometry: ModelGeometry | None = None,
                 parts: bool = False, beside: bool = False) -> Profile:
    """A complete profile: every required row plus shared rows at ``contexts``, per op point:
    whole tokens (``decode``, a ``cope.profile/1`` profile) or, with ``parts``, per part
    (``moe_block``, ``dense_block`` when the geometry has dense blocks, ``head``: ``/2``);
    ``beside`` adds the optional prefetch rows beside CPU misses (``beside_keys``).

    Parameters
    ----------
    costs : callable, dict or None
        A callable gets the row (dict of the key columns incl. ``cpu_threads``/``gpu_share``)
        and returns ``median_us``. A dict maps ``(kind, name, hits, cpu, staged, count,
        context)`` (or the 6-tuple without ``context``, meaning -1) to ``median_us``, optionally
        prefixed by ``(cpu_threads, gpu_share)`` to target one operating point; rows it does not
        name get :func:`default_cost`.
    """
    g = geometry or tiny_geometry()
    keys = required_keys(g.top_k) + (beside_keys(g.top_k) if beside else [])
    if parts:
        names = ("moe_block", "dense_block") if g.dense_layers else ("moe_block",)
        keys += [ProfileKey("shared", n, context=c) for c in contexts for n in names]
        keys.append(ProfileKey("shared", "head"))
    else:
        keys += [ProfileKey("shared", "decode", context=c) for c in contexts]
    rows = []
    for threads, share in operating_points:
        for key in keys:
            row = dict(key._asdict(), cpu_threads=threads, gpu_share=share)
            if callable(costs):
                med = float(costs(row))
            else:
                table = costs or {}
                op = (threads, share)
                # the 6-tuple shorthand only names rows whose context is unused (-1)
                short = [op + key[:6], key[:6]] if key.context == -1 else []
                hit = [k for k in [op + tuple(key), key] + short if k in table]
                med = float(table[hit[0]]) if hit else default_cost(row)
            rows.append({**row, "median_us": med, "p25_us": med * 0.875, "p75_us": med * 1.125,
                         "samples": 5})
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df = df.astype({c: t for c, t in COLUMNS.items() if t != "string"})
    platform = {"gpu": "test-gpu", "cpu": "test-cpu", "link": "pcie4 x16", "torch": "none",
                "host": "test-host",
                "spec": {"gpu_flops": 1e14, "gpu_bw": 1e12, "cpu_flops": 1e12, "cpu_bw": 1e11,
                         "link_bw": 2.5e10}}
    return Profile(table=df, model=g, platform=platform, created="2025-01-01T00:00:00+00:00",
                   notes="tiny test profile", analytic=False)


def tiny_measurements(geometry: ModelGeometry | None = None):
    """Every candidate on prompts 3 and 7, two trials, K = 2, at 8 threads / 100 %."""
    from cope_core.measurements import OUTLIER_RULE, Measurements, noise_floor_pct
    rows = []
    for ci, cand in enumerate(CANDIDATE_IDS):
        for prompt in (3, 7):
            for trial in (0, 1):
                rows.append({"candidate": cand, "prompt": prompt, "trial": trial,
                             "tpot_us": 1000.0 + 10 * ci + prompt + 0.5 * trial, "K": 2,
                             "cpu_threads": 8, "gpu_share": 100.0})
    df = pd.DataFrame(rows).astype({"prompt": "int32", "trial": "int32", "tpot_us": "float64",
                                    "K": "int32", "cpu_threads": "int16",
                                    "gpu_share": "float32"})
    samples = [1003.0, 1003.5, 1002.9, 1003.2]          # layer_partition on prompt 3, again
    quality = {"outlier_rule": OUTLIER_RULE, "cells": [
        {"K": 2, "cpu_threads": 8, "gpu_share": 100.0,
         "reference": {"candidate": "layer_partition", "prompt": 3, "samples_us": samples,
                       "noise_pct": noise_floor_pct(samples)},
         "outliers": [], "same_work": []}]}
    return Measurements(table=df, model=geometry or tiny_geometry(),
                        platform={"gpu": "emulated", "cpu": "test-cpu", "accelerator": "emulated"},
                        created="2025-01-01T00:00:00+00:00", notes="tiny measurements",
                        quality=quality, progress={"complete": True, "cells_done": [[2, 8]]})


# --- raw Parquet, for tests that break a written file on purpose -------------------------------
def raw(path: Path) -> tuple[pa.Table, dict]:
    """A written file's table (without metadata) and its parsed ``cope`` metadata."""
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"cope"])
    return table.replace_schema_metadata(None), meta


def put(path: Path, table: pa.Table, meta: dict | None) -> Path:
    """Write ``table`` with ``meta`` as the ``cope`` metadata (None: no metadata at all)."""
    md = None if meta is None else {b"cope": json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(md), path)
    return path


# --- a geometry and a platform with round numbers, for estimator values worked out by hand ------
#: ``pytest.approx`` to the last few bits: the hand-worked values are exact in binary or nearly.
exact = lambda v: pytest.approx(v, rel=1e-12, abs=1e-12)  # noqa: E731

#: expert_bytes = 3 * 1000 * 500 * 2 = 3e6 B, expert_flops = 2 * 3 * 1000 * 500 = 3e6 FLOP.
ROUND_GEOMETRY = ModelGeometry(name="round", n_layers=2, n_experts=4, top_k=2, hidden=1000,
                               expert_intermediate=500, dtype_bytes=2, n_shared_experts=0,
                               dense_layers=1, n_heads=4, n_kv_heads=2, head_dim=50, vocab=500,
                               non_expert_bytes=11_000_000)
ROUND_SPEC = PlatformSpec(name="round", gpu_name="gpu", gpu_flops=1e12, gpu_bandwidth=1e11,
                          link_name="link", link_bandwidth=1e10, cpu_name="cpu", cpu_cores=4,
                          cpu_flops_per_thread=5e9, cpu_bandwidth=1.5e10,
                          cpu_bandwidth_per_thread=1e10, source="test")
#: :data:`ROUND_SPEC` with overheads: launch 5, sync 10, transfer latency 2, CPU dispatch 20,
#: half the peak on the GPU, the CPU and the link for weights, 4 kernels per expert group, 10 per
#: block (tests/test_analytic_overheads.py works its costs out by hand)
ROUND_OVERHEADS = dataclasses.replace(
    ROUND_SPEC, gpu_launch_us=5.0, gpu_sync_us=10.0, link_latency_us=2.0, cpu_dispatch_us=20.0,
    link_efficiency=0.5, gpu_efficiency=0.5, cpu_efficiency=0.5, gpu_kernels_per_expert_group=4,
    gpu_kernels_per_block=10)


def row_us(t: pd.DataFrame, threads, kind, name, count=-1, context=-1, hits=-1,
              cpu=-1) -> float:
    """``median_us`` of the one row of profile table ``t`` with these key columns."""
    sel = t[(t["cpu_threads"] == threads) & (t["kind"] == kind) & (t["name"] == name)
            & (t["count"] == count) & (t["context"] == context) & (t["hits"] == hits)
            & (t["cpu"] == cpu)]
    assert len(sel) == 1
    return float(sel["median_us"].iloc[0])


# --- a policy record, for the export formats ---------------------------------------------------
def make_policy(g: ModelGeometry, K: int, candidate: str = "fixed/parallel",
                seed: int = 0) -> Policy:
    """A policy record for a catalog-sized model without replaying a trace: distinct TPOTs per
    candidate (candidate index + 1 ms), a shuffled fill."""
    rng = np.random.default_rng(seed)
    resident = tuple(tuple(int(e) for e in rng.permutation(g.n_experts)[:K])
                     for _ in range(g.n_layers))
    table = {c: 1000.0 * (i + 1) for i, c in enumerate(CANDIDATE_IDS)}
    return Policy(model=g, candidate=candidate, experts_per_layer=K, resident_experts=resident,
                  predictions_us={"cope": table, "atomic": dict(table), "hrm": None},
                  platform={"gpu": "test", "spec": {"link_bandwidth": 25e9}}, cpu_threads=8,
                  gpu_share=100.0, vram={"budget_gib": None, "needed_gib": 1.0, "context": 4096,
                                         "workspace_gib": 0.5},
                  estimator_notes={"hrm": "skipped"})
