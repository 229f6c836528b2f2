"""The typed llama.cpp cache record (cope_core.llamacpp.answer.cache_record): its validation and
JSON, and that ``cope predict``, ``cope export`` (build_policy) and the app's call give the same
record, because they call one function with the same settings."""
from __future__ import annotations

import copy
import json
import warnings

import pytest

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.estimate.ranking import fastest_first
from cope_core.export import Policy, build_policy
from cope_core.llamacpp import CacheVersion, LlamaSettings, Request
from cope_core.llamacpp.answer.cache_record import (
    RECORD_CANDIDATES,
    CacheRecord,
    llamacpp_record,
)
from cope_core.profile.data import ProfileKey
from cope_core.profile.raw_samples import raw_key, write_raw_samples

EX = "data/examples/deepseek-v2-lite-4l-"
FILES = {"trace": EX + "trace.parquet", "calibration": EX + "calibration.parquet",
         "profile": EX + "cpu-emulated-profile.parquet"}
K = 16


@pytest.fixture(scope="module")
def small():
    return (parquet_io.read_trace(FILES["trace"]), parquet_io.read_trace(FILES["calibration"]),
            parquet_io.read_profile(FILES["profile"]))


@pytest.fixture(scope="module")
def record(small) -> CacheRecord:
    trace, cal, profile = small
    rec = llamacpp_record(trace, profile, cal, experts_per_layer=K, vram_gib=None,
                          matrix_winner="fixed/parallel", cpu_threads=2, gpu_share=100.0)
    assert rec is not None
    return rec


def test_candidates_come_from_the_eviction_rules():
    assert RECORD_CANDIDATES == ("layer_partition",) + tuple(
        "llamacpp_cache/" + v.value for v in CacheVersion)


def test_the_json_reads_back_to_the_same_record(record):
    d = record.to_dict()
    # the small fixture's best is the class-LRU's: its readings of the inferred rules follow
    assert list(d) == ["expert_budget_gib", "configurations", "cache_start", "best", "versus",
                       "rule_readings", "build"]
    again = CacheRecord.from_dict(json.loads(json.dumps(d)))
    assert again == record and again.to_dict() == d
    assert CacheRecord.from_dict({}) is None          # a record written without a search


def _bad(d: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(d)
    node = out
    for p in path[:-1]:
        node = node[p]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


@pytest.mark.parametrize("path,value,field", [
    (("cache_start",), "forever", "llamacpp_cache.cache_start"),
    (("configurations",), 0, "llamacpp_cache.configurations"),
    (("expert_budget_gib",), float("nan"), "llamacpp_cache.expert_budget_gib"),
    (("best",), [], "llamacpp_cache.best"),
    (("best", 0, "cache_mib"), -1, "llamacpp_cache.best[0].cache_mib"),
    (("best", 0, "cache_mib"), 1.5, "llamacpp_cache.best[0].cache_mib"),
    (("best", 0, "candidate"), "llamacpp_cache/fifo", "llamacpp_cache.best[0].candidate"),
    (("best", 0, "tpot_us"), "fast", "llamacpp_cache.best[0].tpot_us"),
    (("best", 0, "slots"), KeyError, "llamacpp_cache.best[0]"),
    (("versus", 0, "cache_faster"), 1.5, "llamacpp_cache.versus[0].cache_faster"),
    (("versus", 0, "tpot_ci_us"), [3.0, 1.0], "llamacpp_cache.versus[0].tpot_ci_us"),
    (("versus", 0, "name"), "", "llamacpp_cache.versus[0].name"),
    (("versus",), "none", "llamacpp_cache.versus"),
    (("hits",), 1.0, "llamacpp_cache"),
])
def test_a_bad_field_is_a_one_line_error_naming_it(record, path, value, field):
    with pytest.raises(CopeInputError) as e:
        CacheRecord.from_dict(_bad(record.to_dict(), path, value), "policy.json")
    assert e.value.field == field and e.value.source == "policy.json"
    assert "\n" not in str(e.value)


def test_a_policy_file_with_a_bad_record_names_the_field(small, record, tmp_path):
    trace, cal, profile = small
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pol = build_policy(trace, profile, cal, experts_per_layer=K, cpu_threads=2,
                           llamacpp=False)
    d = pol.to_dict()
    d["llamacpp_cache"] = _bad(record.to_dict(), ("best", 0, "n_cpu_moe"), -2)
    with pytest.raises(CopeInputError, match="llamacpp_cache.best\\[0\\].n_cpu_moe"):
        Policy.from_dict(d, "p.json")


def _cli_cache(capsys, *extra: str) -> list[dict]:
    args = ["predict", "--trace", FILES["trace"], "--calibration", FILES["calibration"],
            "--profile", FILES["profile"], "--threads", "2", "--json", *extra]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args) == 0
    return [r for r in json.loads(capsys.readouterr().out) if r.get("runtime") == "llama.cpp"]


def _as_cli(rec: CacheRecord) -> list[tuple]:
    d = rec.to_dict()
    return [(b["candidate"], b["n_cpu_moe"], b["cache_mib"], b["tpot_us"]) for b in d["best"]
            if b["candidate"] != "layer_partition"]


@pytest.mark.parametrize("budget", [("-K", str(K)), ("--vram-gib", "3.5")])
def test_cli_export_and_app_agree_to_the_digit(small, capsys, budget):
    trace, cal, profile = small
    flag, value = budget
    vram = float(value) if flag == "--vram-gib" else None
    k = trace.model.experts_per_layer_for_vram(vram * 2**30) if vram is not None else K
    kw = {"vram_gib": vram} if vram is not None else {"experts_per_layer": K}
    # the request cope predict prices by default (a 4,096 + 512 chat turn): -c holds it
    req = Request()
    llama = LlamaSettings(n_ctx=req.tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pol = build_policy(trace, profile, cal, cpu_threads=2, gpu_share=100.0, llama=llama,
                           request=req, **kw)
    # the app's call (cope_core/app/policies.py llamacpp_at), with the Policy Matrix's winner
    app = llamacpp_record(trace, profile, cal, experts_per_layer=k, vram_gib=vram,
                          matrix_winner=fastest_first(pol.predictions_us["cope"])[0],
                          cpu_threads=2, gpu_share=100.0, llama=llama, request=req)
    assert pol.llamacpp_cache == app
    cli = _cli_cache(capsys, flag, value)
    assert [(r["candidate"], r["n_cpu_moe"], r["cache_mib"], r["tpot_us"]) for r in cli] == \
        _as_cli(app)
    assert cli[0]["tpot_ci_us"] == list(app.versus[0].tpot_ci_us)
    assert cli[0]["versus"] == app.to_dict()["versus"][1:]


def test_predict_prices_the_cache_with_the_raw_samples(small, capsys, tmp_path):
    trace, cal, profile = small
    rows, _ = profile.operating_point_rows(2, 100.0)
    raw = {raw_key(tuple(r[f] for f in ProfileKey._fields), 2, 100.0):
           [r["median_us"] * f for f in (0.2, 1.0, 4.0)] for _, r in rows.iterrows()}
    path = tmp_path / "raw.json"
    write_raw_samples(path, raw)
    cli = _cli_cache(capsys, "-K", str(K), "--raw-samples", str(path))
    rec = llamacpp_record(trace, profile, cal, experts_per_layer=K, vram_gib=None,
                          matrix_winner=cli[0]["versus"][-1]["name"].rsplit(" ", 1)[1],
                          cpu_threads=2, gpu_share=100.0, raw_samples=raw)
    plain = _cli_cache(capsys, "-K", str(K))
    assert cli[0]["tpot_ci_us"] == list(rec.versus[0].tpot_ci_us)
    assert cli[0]["tpot_ci_us"] != plain[0]["tpot_ci_us"]     # the samples widen it
