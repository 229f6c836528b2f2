"""Model catalog and memory model (docs/design.md#model-geometry-and-memory), the Policy Matrix
(#the-policy-matrix, #replay-semantics) and the accuracy metrics
(#measurement-and-evaluation)."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.metrics import accuracy, mape, spearman
from cope_core.geometry import CATALOG, DEFAULT_WORKSPACE_BYTES, GIB, MIB, ModelGeometry, get_model
from cope_core.matrix import (
    CANDIDATE_IDS,
    CANDIDATES,
    EXECUTIONS,
    LAYER_PARTITION,
    RESIDENCIES,
    Execution,
    Residency,
    candidate_id,
    get_candidate,
    matrix_table,
)

# --- catalog ------------------------------------------------------------------------------------
# docs/design.md#model-geometry-and-memory: L (MoE), dense prefix, E, top_k, shared, hidden,
# expert_I, MiB per expert
TABLE = {
    "deepseek-v2-lite": (26, 1, 64, 6, 2, 2048, 1408, 16.5),
    "qwen3-30b-a3b": (48, 0, 128, 8, 0, 2048, 768, 9.0),
    "qwen3.5-35b-a3b": (40, 0, 256, 8, 1, 2048, 512, 6.0),
    "mixtral-8x7b": (32, 0, 8, 2, 0, 4096, 14336, 336.0),
    "olmoe-1b-7b": (16, 0, 64, 8, 0, 2048, 1024, 12.0),
    "qwen1.5-moe-a2.7b": (24, 0, 60, 4, 1, 2048, 1408, 16.5),
    "gpt-oss-20b": (24, 0, 32, 4, 0, 2880, 2880, 47.4609375),
    # published configs (docs/design.md#model-geometry-and-memory)
    "qwen3-235b-a22b": (94, 0, 128, 8, 0, 4096, 1536, 36.0),
    "glm-4.5-air": (45, 1, 128, 8, 1, 4096, 1408, 33.0),
    "gpt-oss-120b": (36, 0, 128, 4, 0, 2880, 2880, 47.4609375),
    "deepseek-v3": (58, 3, 256, 8, 1, 7168, 2048, 84.0),
}


def test_catalog_has_the_eleven_models():
    assert set(CATALOG) == set(TABLE)


@pytest.mark.parametrize("name", list(TABLE))
def test_catalog_geometry(name):
    L, dense, E, k, shared, hidden, inter, mib = TABLE[name]
    g = get_model(name)
    assert (g.n_layers, g.dense_layers, g.n_experts, g.top_k, g.n_shared_experts, g.hidden,
            g.expert_intermediate, g.dtype_bytes) == (L, dense, E, k, shared, hidden, inter, 2)
    assert g.expert_bytes == 3 * hidden * inter * 2
    assert g.expert_bytes / MIB == mib
    assert g.expert_flops == 2 * 3 * hidden * inter
    assert g.all_expert_bytes == L * E * g.expert_bytes
    assert g.non_expert_bytes > 0 and g.vocab > 0 and g.n_kv_heads <= g.n_heads


def test_gpt_oss_rounds_to_47_5_mib():
    assert round(get_model("gpt-oss-20b").expert_bytes / MIB, 1) == 47.5


def test_get_model_case_and_aliases():
    assert get_model("Mixtral-8x7B") is CATALOG["mixtral-8x7b"]
    assert get_model("deepseek-coder-v2-lite") is CATALOG["deepseek-v2-lite"]
    with pytest.raises(CopeInputError, match="gpt-5"):
        get_model("gpt-5")


def test_kv_cache_bytes():
    g = get_model("mixtral-8x7b")
    # 2 (K and V) * 32 blocks * 8 kv heads * 128 * 2 bytes * 4096 tokens = 512 MiB
    assert g.kv_cache_bytes(4096) == 512 * MIB
    d = get_model("deepseek-v2-lite")
    # MLA caches one row of kv_lora_rank 512 + rope 64 per token, K only; the dense prefix too
    assert d.kv_cache_bytes(1) == 27 * (512 + 64) * 2
    q = get_model("qwen3.5-35b-a3b")
    # K and V (2 heads of 256) only in the 10 full-attention blocks (3, 7, ..., 39); each of the
    # 30 Gated DeltaNet blocks holds its F32 state at any context: conv 3 x (2*16*128 + 32*128)
    # and the delta rule's 32 x 128 x 128
    state = 30 * 4 * (3 * 8192 + 32 * 128 * 128)
    assert q.kv_cache_bytes(0) == state
    assert q.kv_cache_bytes(4096) == 10 * 2 * 512 * 2 * 4096 + state
    assert [i for i, r in enumerate(q.attention_blocks) if r.k_values] == list(range(3, 40, 4))


# --- memory model -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TABLE))
def test_vram_round_trip(name):
    g = get_model(name)
    for k in range(g.n_experts + 1):
        need = g.vram_for_experts_per_layer(k)
        assert g.experts_per_layer_for_vram(need) == k
        if k > 0:
            assert g.experts_per_layer_for_vram(need - 1) == k - 1
        if k < g.n_experts:
            step = g.n_layers * g.expert_bytes
            assert g.experts_per_layer_for_vram(need + step - 1) == k


def test_vram_formula_by_hand():
    g = get_model("mixtral-8x7b")
    need = g.vram_for_experts_per_layer(3, context=1024, workspace_bytes=0)
    assert need == g.non_expert_bytes + g.kv_cache_bytes(1024) + 3 * 32 * 336 * MIB
    assert g.vram_for_experts_per_layer(0) == (g.non_expert_bytes + g.kv_cache_bytes(4096)
                                               + DEFAULT_WORKSPACE_BYTES)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_vram_clamps(name):
    g = get_model(name)
    need = g.vram_for_experts_per_layer(0)
    assert g.experts_per_layer_for_vram(need) == 0
    shown = math.ceil(need / GIB * 100) / 100    # rounded up: never shown as fitting
    for below in (0, -10 * GIB, need - 1):      # below K = 0's need: an error naming the need
        with pytest.raises(CopeInputError, match=f"below the {shown:.2f} GiB that K = 0"):
            g.experts_per_layer_for_vram(below)
    assert g.experts_per_layer_for_vram(10_000 * GIB) == g.n_experts
    assert g.experts_per_layer_for_vram(g.vram_for_experts_per_layer(g.n_experts) * 2) \
        == g.n_experts


@pytest.mark.parametrize("k", [-1, 9, 100])
def test_vram_for_k_out_of_range(k):
    with pytest.raises(CopeInputError, match="experts_per_layer"):
        get_model("mixtral-8x7b").vram_for_experts_per_layer(k)


@pytest.mark.parametrize("vram", [float("nan"), float("inf")])
def test_vram_non_finite(vram):
    g = get_model("mixtral-8x7b")
    try:
        k = g.experts_per_layer_for_vram(vram)
    except CopeInputError:
        return
    assert k == g.n_experts and not math.isnan(vram)


def test_cli_vram_both_ways(capsys):
    g = get_model("qwen3-30b-a3b")
    assert main(["vram", "--model", g.name, "--experts-per-layer", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["experts_per_layer"] == 40
    assert out["vram_gib"] == pytest.approx(g.vram_for_experts_per_layer(40) / GIB)
    assert main(["vram", "--model", g.name, "--gib", str(out["vram_gib"]), "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert back["experts_per_layer"] in (39, 40)  # GiB printed as a float; never more than 40
    assert main(["vram", "--model", g.name, "--gib", "24", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["experts_per_layer"] == \
        g.experts_per_layer_for_vram(24 * GIB)
    assert main(["vram", "--model", g.name, "--experts-per-layer", "129"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cope: error:") and len(err.splitlines()) == 1


# --- ModelGeometry validation -------------------------------------------------------------------
def _geom_dict():
    return get_model("olmoe-1b-7b").to_dict()


def test_from_dict_round_trip():
    assert ModelGeometry.from_dict(_geom_dict()) == get_model("olmoe-1b-7b")


def test_from_dict_missing_key():
    d = _geom_dict()
    del d["top_k"]
    with pytest.raises(CopeInputError) as info:
        ModelGeometry.from_dict(d, source="x.parquet")
    assert "top_k" in str(info.value) and "x.parquet" in str(info.value)
    assert info.value.field == "model"


def test_from_dict_extra_key():
    with pytest.raises(CopeInputError, match="n_routers"):
        ModelGeometry.from_dict(_geom_dict() | {"n_routers": 1})


def test_from_dict_not_an_object():
    with pytest.raises(CopeInputError, match="model"):
        ModelGeometry.from_dict([1, 2, 3])


@pytest.mark.parametrize("key,value", [("n_layers", 0), ("n_experts", -1), ("top_k", 65),
                                       ("hidden", 2048.0), ("dtype_bytes", True),
                                       ("n_heads", "16"), ("n_experts", 40000)])
def test_from_dict_bad_values(key, value):
    with pytest.raises(CopeInputError) as info:
        ModelGeometry.from_dict(_geom_dict() | {key: value}, source="f.parquet")
    assert info.value.field.startswith("model.")
    assert "f.parquet" in str(info.value)


def test_same_shape_and_with_layers():
    g = get_model("mixtral-8x7b")
    cut = g.with_layers(4)
    assert cut.n_layers == 4 and cut.expert_bytes == g.expert_bytes
    assert not cut.same_shape(g)
    renamed = ModelGeometry(**(g.to_dict() | {"name": "other"}))
    assert renamed.same_shape(g)


# --- Policy Matrix ------------------------------------------------------------------------------
ORDER = ["layer_partition",
         "fixed/parallel", "fixed/wait_then_gpu", "fixed/ready_first", "fixed/cost_selected",
         "mutable_per_layer/parallel", "mutable_per_layer/wait_then_gpu",
         "mutable_per_layer/ready_first", "mutable_per_layer/cost_selected",
         "mutable_cross_layer/parallel", "mutable_cross_layer/wait_then_gpu",
         "mutable_cross_layer/ready_first", "mutable_cross_layer/cost_selected"]
PRIOR = {
    "fixed/parallel": {"KTransformers"},
    "fixed/wait_then_gpu": {"MoE-Lightning (batch-n)"},
    "fixed/ready_first": set(),
    "fixed/cost_selected": {"Fiddler"},
    "mutable_per_layer/parallel": set(),
    "mutable_per_layer/wait_then_gpu": {"Mixtral-Offloading", "DuoServe-MoE"},
    "mutable_per_layer/ready_first": {"ProMoE"},
    "mutable_per_layer/cost_selected": {"HybriMoE", "DALI"},
    "mutable_cross_layer/parallel": set(),
    "mutable_cross_layer/wait_then_gpu": {"MoE-Infinity"},
    "mutable_cross_layer/ready_first": set(),
    "mutable_cross_layer/cost_selected": {"FreeToken"},
}


def test_candidate_ids_in_tie_order():
    assert list(CANDIDATE_IDS) == ORDER
    assert [r.value for r in RESIDENCIES] == ["fixed", "mutable_per_layer",
                                              "mutable_cross_layer"]
    assert [e.value for e in EXECUTIONS] == ["parallel", "wait_then_gpu", "ready_first",
                                             "cost_selected"]
    assert len(set(CANDIDATE_IDS)) == 13


def test_prior_systems_and_new():
    by_id = {c.id: c for c in CANDIDATES}
    for cid, systems in PRIOR.items():
        c = by_id[cid]
        assert set(c.prior_systems) == systems, cid
        assert c.new == (not systems)
        assert c.id == candidate_id(c.residency, c.execution)
        assert c.in_paper == (c.residency is not Residency.MUTABLE_CROSS_LAYER)
    lp = by_id[LAYER_PARTITION]
    assert lp.is_layer_partition and lp.residency is None and lp.execution is None
    assert not lp.new and lp.in_paper
    assert any("llama.cpp" in s for s in lp.prior_systems)
    assert {c.id for c in CANDIDATES if c.new} == {
        "fixed/ready_first", "mutable_per_layer/parallel", "mutable_cross_layer/parallel",
        "mutable_cross_layer/ready_first"}
    assert sum(c.in_paper for c in CANDIDATES) == 9


def test_residency_mutable_flag():
    assert not Residency.FIXED.mutable
    assert Residency.MUTABLE_PER_LAYER.mutable and Residency.MUTABLE_CROSS_LAYER.mutable


def test_get_candidate():
    c = get_candidate("mutable_per_layer/ready_first")
    assert c.residency is Residency.MUTABLE_PER_LAYER and c.execution is Execution.READY_FIRST
    for bad in ("fixed/teleport", "", "fixed", "FIXED/PARALLEL", "layer-partition"):
        with pytest.raises(CopeInputError, match="candidate"):
            get_candidate(bad)


def test_matrix_table_is_json():
    t = json.loads(json.dumps(matrix_table()))
    assert [c["id"] for c in t["candidates"]] == ORDER
    assert len(t["residencies"]) == 3 and len(t["executions"]) == 4
    assert len(t["out_of_scope"]) >= 4


# --- metrics ------------------------------------------------------------------------------------
def test_mape_by_hand():
    # |90 - 100| / 100 = .1, |150 - 100| / 100 = .5, |10 - 8| / 8 = .25 -> mean 85/3 %
    assert mape([90, 150, 10], [100, 100, 8]) == pytest.approx(85 / 3, rel=1e-15)
    assert mape([5.0], [5.0]) == 0.0


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 4, 9]) == pytest.approx(1.0)   # monotone, not linear
    # ties get average ranks: [1, 2.5, 2.5, 4] vs [1, 2, 3, 4] -> 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(math.sqrt(0.9), rel=1e-12)
    # [1, 3, 2] vs [1, 2, 3]: d = [0, 1, -1] -> 1 - 6 * 2 / (3 * 8) = 0.5
    assert spearman([1, 3, 2], [1, 2, 3]) == pytest.approx(0.5)


def test_spearman_constant_is_nan():
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1, 2, 3], [7, 7, 7]))


def _pairs():
    rows = [
        # prompt 0: predicted tie at 10 between fixed/parallel and layer_partition; the rule
        # gives it to layer_partition (earlier in candidate order, although it sorts later by
        # name and comes later in this frame), but the measured winner is fixed/parallel
        (0, "fixed/parallel", 10.0, 5.0),
        (0, "layer_partition", 10.0, 6.0),
        (0, "fixed/wait_then_gpu", 20.0, 20.0),
        (0, "fixed/ready_first", 30.0, 10.0),
        # prompt 1: prediction = measurement
        (1, "fixed/parallel", 1.0, 1.0),
        (1, "layer_partition", 2.0, 2.0),
        (1, "fixed/wait_then_gpu", 3.0, 3.0),
        (1, "fixed/ready_first", 4.0, 4.0),
    ]
    return pd.DataFrame(rows, columns=["prompt", "candidate", "predicted_us", "measured_us"])


def test_accuracy_by_hand():
    acc = accuracy(_pairs(), "cope")
    # prompt 0: predicted order lp, fp, fw, fr; measured fp, lp, fr, fw
    #   top-1 miss; top-3 {lp, fp, fw} & {fp, lp, fr} = 2
    #   rho: ranks [1.5, 1.5, 3, 4] vs [1, 2, 4, 3] -> 3.5 / sqrt(4.5 * 5)
    # prompt 1: everything right, rho 1
    rho0 = 3.5 / math.sqrt(22.5)
    assert acc.top1 == (1, 2)
    assert acc.top3 == (5, 6)
    assert acc.spearman == pytest.approx((rho0 + 1.0) / 2, rel=1e-12)
    # MAPE: prompt 0 errors 5/5, 4/6, 0, 20/10; prompt 1 none -> (1 + 2/3 + 2) / 8
    assert acc.mape_pct == pytest.approx((1 + 2 / 3 + 2) / 8 * 100, rel=1e-12)
    assert acc.pairs == 8 and acc.estimator == "cope"
    d = acc.to_dict()
    assert d["top1"] == [1, 2] and d["top3"] == [5, 6]


def test_accuracy_tie_resolved_by_candidate_order_not_row_order():
    p = _pairs()
    shuffled = p.iloc[[1, 0, 3, 2, 5, 4, 7, 6]].reset_index(drop=True)
    a, b = accuracy(p), accuracy(shuffled)
    assert (a.top1, a.top3, a.mape_pct) == (b.top1, b.top3, pytest.approx(b.mape_pct))
    assert a.spearman == pytest.approx(b.spearman)
    # the measured side ties too: measured tie between fp and lp goes to lp -> top-1 hit
    p.loc[(p.prompt == 0) & (p.candidate == "layer_partition"), "measured_us"] = 5.0
    assert accuracy(p).top1 == (2, 2)


def test_accuracy_groups_by_k_and_threads():
    p = pd.concat([_pairs().assign(K=1, cpu_threads=8), _pairs().assign(K=2, cpu_threads=8)])
    acc = accuracy(p)
    assert acc.top1 == (2, 4) and acc.top3 == (10, 12) and acc.pairs == 16


def test_accuracy_fewer_than_three_candidates():
    p = pd.DataFrame([(0, "fixed/parallel", 1.0, 2.0), (0, "fixed/ready_first", 2.0, 1.0)],
                     columns=["prompt", "candidate", "predicted_us", "measured_us"])
    acc = accuracy(p)
    assert acc.top1 == (0, 1) and acc.top3 == (2, 2)
    assert acc.spearman == pytest.approx(-1.0)


def test_accuracy_single_candidate_spearman_nan():
    p = pd.DataFrame([(0, "fixed/parallel", 1.0, 2.0)],
                     columns=["prompt", "candidate", "predicted_us", "measured_us"])
    acc = accuracy(p)
    assert math.isnan(acc.spearman) and acc.top1 == (1, 1)


def test_accuracy_empty():
    with pytest.raises(CopeInputError):
        accuracy(pd.DataFrame(columns=["prompt", "candidate", "predicted_us", "measured_us"]))
