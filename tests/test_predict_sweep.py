"""The pricing of a sweep, every K at once (cope_core.estimate.tpot, uncertainty's sweep
functions), equals the per-K path it replaced, bit for bit: point TPOTs, intervals, win shares,
equivalences and each K's confidence (issue 38: the app's operating-point change re-prices every
K, which ran once per K and candidate).

The reference below is that per-K path written out plainly: one K and one candidate at a time,
each draw's resample of prompts gathered on its own, pairs compared one by one."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from tiny import tiny_profile, tiny_trace

from cope_core import parquet_io
from cope_core.estimate.costs import EXECUTIONS, layer_costs, profile_spec
from cope_core.estimate.model_error import log_spread, model_error, widen
from cope_core.estimate.predict import price, replay_counts
from cope_core.estimate.ranking import most_likely_fastest
from cope_core.estimate.tpot import candidate_tpot
from cope_core.estimate.uncertainty import LEVEL, _confidence, drawn_costs
from cope_core.matrix import CANDIDATES, get_candidate, residencies_of
from cope_core.placement import layer_plan

EXAMPLES = "data/examples"


def _parts_one_k(trace, counts, costs, cand, ki, K):
    """One candidate's expert and prefetch parts at the ki-th K, as priced one K at a time."""
    g = trace.model
    L, P = g.n_layers, trace.n_prompts
    tokens = trace.tokens_per_prompt.astype(np.float64)
    if cand.is_layer_partition:
        n_gpu = layer_plan(g, K).n_gpu
        per_token = (L - n_gpu) * np.asarray(costs.cpu_layer) + n_gpu * np.asarray(costs.gpu_layer)
        experts = np.broadcast_to(per_token[..., None], np.shape(per_token) + (P,)).copy()
        return experts, np.zeros_like(experts)
    rc = counts[cand.residency]
    e = EXECUTIONS.index(cand.execution)
    hsum = rc.hist[ki].sum(axis=1)
    experts = (costs.moe[..., e, :] @ hsum.T) / tokens
    if cand.residency.mutable and K < g.n_experts:
        r = cand.residency.value
        pref = ((L - 1) * np.asarray(costs.pf_step[r])[..., None]
                + (costs.pf_insert[r][..., e, :] @ rc.ins[ki].sum(axis=1).T) / tokens)
    else:
        pref = np.zeros_like(experts)
    return experts, pref


def _reference(trace, profile, counts, ks, op, estimator, cands, draws, seed):
    """Per K: point TPOTs, intervals, win shares, equivalences and the confidence."""
    o = profile.resolve(*op, model=trace.model)
    spec = profile_spec(profile) if estimator == "hrm" else None
    costs = layer_costs(estimator, o, trace.model, spec)
    shared = costs.shared_per_prompt(trace.context, trace.prompt_start)
    rng = np.random.default_rng(seed)
    drawn = drawn_costs(profile, costs, o.cpu_threads, o.gpu_share, draws, rng,
                        model=trace.model)
    shared_d = None if drawn is None else drawn.shared_per_prompt(trace.context,
                                                                  trace.prompt_start)
    state = rng.bit_generator.state
    rows, per_k = [], {}
    for ki, K in enumerate(ks):
        point, full = [], []
        for c in cands:
            ex, pf = _parts_one_k(trace, counts, costs, c, ki, K)
            point.append(shared + ex + pf)
            if drawn is not None:
                ex, pf = _parts_one_k(trace, counts, drawn, c, ki, K)
                full.append(shared_d + ex + pf)
        full = full if drawn is not None else point
        rng.bit_generator.state = state
        P = trace.n_prompts
        idx = rng.integers(0, P, (draws, P))
        means = np.empty((draws, len(cands)))
        for i, t in enumerate(full):
            for b in range(draws):
                means[b, i] = (t[idx[b]] if t.ndim == 1 else t[b, idx[b]]).mean()
        eq: list[str | None] = [None] * len(cands)
        for i in range(len(cands)):
            for j in range(i):
                if eq[j] is None and np.array_equal(point[i], point[j]) \
                        and np.array_equal(full[i], full[j]):
                    eq[i] = cands[j].id
                    break
        pt = np.array([p.mean() for p in point])
        h_lo, h_hi = log_spread(means, LEVEL)
        lo, hi = widen(pt, h_lo, h_hi, LEVEL, model_error().sigma(estimator))
        lo_d, hi_d = widen(pt, h_lo, h_hi, LEVEL, 0.0)
        rivals = [i for i, e in enumerate(eq) if e is None]
        prob = np.full(len(cands), np.nan)
        prob[rivals] = np.bincount(np.argmin(means[:, rivals], axis=1),
                                   minlength=len(rivals)) / draws
        verdict = most_likely_fastest(means[:, rivals], [cands[i].id for i in rivals],
                                      pt[rivals].tolist())
        per_k[K] = _confidence(point, None if drawn is None else full, cands, rivals, prob,
                               idx, P, verdict).to_dict()
        for i, c in enumerate(cands):
            rows.append({"experts_per_layer": K, "candidate": c.id, "tpot_us": pt[i],
                         "prompt_tpot_us": point[i], "tpot_lo_us": lo[i], "tpot_hi_us": hi[i],
                         "draws_lo_us": lo_d[i], "draws_hi_us": hi_d[i],
                         "win_probability": prob[i], "equivalent_to": eq[i]})
    want = pd.DataFrame(rows)
    want["equivalent_to"] = pd.Series([r["equivalent_to"] for r in rows], dtype=object)
    return want, per_k


def _check(trace, profile, calibration, ks, op, estimator, cands, draws, seed):
    counts = replay_counts(trace, calibration, ks, residencies_of(c.id for c in cands))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = price(trace, profile, counts, ks, cpu_threads=op[0], gpu_share=op[1],
                    estimator=estimator, candidates=[c.id for c in cands], draws=draws,
                    seed=seed)
    want, per_k = _reference(trace, profile, counts, ks, op, estimator, cands, draws, seed)
    for col in ("experts_per_layer", "candidate", "equivalent_to"):
        assert got[col].tolist() == want[col].tolist(), col
    for col in ("tpot_us", "tpot_lo_us", "tpot_hi_us", "draws_lo_us", "draws_hi_us",
                "win_probability"):
        np.testing.assert_array_equal(got[col].to_numpy(), want[col].to_numpy(), err_msg=col)
    for a, b in zip(got["prompt_tpot_us"], want["prompt_tpot_us"]):
        np.testing.assert_array_equal(a, b)
    assert got.attrs["uncertainty"]["per_k"] == per_k
    return got


def test_a_tiny_sweep_equals_the_per_k_path():
    tr, prof = tiny_trace(), tiny_profile()
    ks = list(range(tr.model.n_experts + 1))
    got = _check(tr, prof, tr, ks, (prof.operating_points()[0]), "cope", list(CANDIDATES),
                 200, 5)
    assert got["equivalent_to"].notna().any()       # K = 0 and K = E have equivalent policies


@pytest.mark.parametrize("example, profile, estimator", [
    ("mixtral-8x7b", "rtx4090-analytic", "cope"),             # analytic draws
    ("deepseek-v2-lite-4l", "cpu-emulated-profile", "atomic"),  # measured rows' spread
    ("olmoe-1b-7b", "rtx4090-analytic", "hrm"),               # the roofline: no draws
])
def test_a_shipped_sweep_equals_the_per_k_path(example, profile, estimator):
    tr = parquet_io.read_trace(f"{EXAMPLES}/{example}-trace.parquet")
    cal = parquet_io.read_trace(f"{EXAMPLES}/{example}-calibration.parquet")
    prof = parquet_io.read_profile(f"{EXAMPLES}/{example}-{profile}.parquet")
    E = tr.model.n_experts
    ks = sorted({0, 1, E // 2, E - 1, E} | set(range(0, E + 1, max(E // 20, 1))))
    _check(tr, prof, cal, ks, prof.operating_points()[-1], estimator, list(CANDIDATES), 300, 1)


def test_one_k_alone_equals_its_row_in_the_vectorised_parts():
    tr, prof = tiny_trace(), tiny_profile()
    ks = list(range(tr.model.n_experts + 1))
    counts = replay_counts(tr, tr, ks, residencies_of(c.id for c in CANDIDATES))
    costs = layer_costs("cope", prof.resolve(None, None), tr.model, None)
    for cand in (get_candidate("layer_partition"), get_candidate("mutable_cross_layer/parallel"),
                 get_candidate("fixed/cost_selected")):
        for ki, K in enumerate(ks):
            part = candidate_tpot(tr, counts, costs, cand, ki, K)
            ex, pf = _parts_one_k(tr, counts, costs, cand, ki, K)
            np.testing.assert_array_equal(part.experts, ex)
            np.testing.assert_array_equal(part.prefetch, pf)
