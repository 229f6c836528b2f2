"""llama.cpp's own MoE cache: our search over its whole space against moe-cache-tune.py's method,
and the speed of that search.

**Against the tuner.** ``scripts/moe-cache-tune.py`` (ggml-org/llama.cpp @ b12191, c4fb5796)
"runs the server at 2 cache sizes x 3 CPU shares, fits the time per token, and replays the
recorded routing through a copy of the cache logic to predict other sizes and shares" for the
user's command (its example: ``-cmoe``, every MoE layer on the host). Readable there: the shares
it measures (``CALIB_SHARES = [0.0, 0.5, 0.95]``) and chooses among (``SHARES = [0.0, 0.5, 0.8,
0.9, 0.95, 0.98]``) and ``--max-mib``. Not readable (the stored text stops in its prompt string):
which two sizes it measures, its fit, the sizes it predicts. The simplest reading, used here: it
measures the largest cache that fits and half of it; fits time per token = a + b * uploads +
c * CPU misses (least squares over the six runs; hits are the rest of the lookups, so a hits term
adds nothing); predicts 16 sizes up to the largest x the six shares by replaying; picks the
lowest. Its six "server runs" are priced by our model (the truth here), so the comparison asks
only what our search gains by searching ``--n-cpu-moe`` too and by pricing every point instead of
fitting six.

**Speed.** The full search at one budget (every ``--n-cpu-moe`` that fits x the largest cache x
both rules x the tuner's shares) against ``predict`` at one K (the Policy Matrix), both on the
shipped Qwen3-30B-A3B Q4_K_M example, medians of repeats in the same run; and a VRAM-slider move
(the search at a new budget).

Run: ``python benchmarks/bench_moe_cache.py [--repeats N] [--json OUT]``
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from cope_core import parquet_io
from cope_core.estimate.predict import predict, winner
from cope_core.geometry import GIB
from cope_core.llamacpp import TUNER_SHARES, CacheVersion, cache_mib_for_bytes, search_cache

EX = "data/examples/"
CALIB_SHARES = (0.0, 0.5, 0.95)
EXAMPLES = {"qwen3-30b-a3b Q4_K_M (rtx4090 analytic)": "gguf-qwen3-30b-a3b-q4_k_m",
            "qwen3-30b-a3b BF16 (rtx4090 analytic)": "qwen3-30b-a3b",
            "qwen3.5-35b-a3b BF16 (rtx5090 analytic)": "qwen3.5-35b-a3b"}
PROFILES = {"gguf-qwen3-30b-a3b-q4_k_m": "rtx4090-analytic", "qwen3-30b-a3b": "rtx4090-analytic",
            "qwen3.5-35b-a3b": "rtx5090-analytic"}


def load(stem: str):
    trace = parquet_io.read_trace(f"{EX}{stem}-trace.parquet")
    cal = parquet_io.read_trace(f"{EX}{stem}-calibration.parquet")
    profile = parquet_io.read_profile(f"{EX}{stem}-{PROFILES[stem]}.parquet")
    return trace, cal, profile


def tuner_pick(trace, profile, budget: float) -> dict:
    """moe-cache-tune.py's method (module docstring) for ``-cmoe`` at ``budget``."""
    g = trace.model
    L = g.n_layers
    top = cache_mib_for_bytes(g, L, budget)
    cls = [CacheVersion.CLASS_LRU]
    runs = search_cache(trace, profile, budget, versions=cls, shares=CALIB_SHARES, n_cpu=[L],
                  cache_mib=[top, top // 2]).frame
    runs = runs[runs.cache_mib > 0]
    X = np.column_stack([np.ones(len(runs)), runs.uploads, runs.cpu_misses])
    coef, *_ = np.linalg.lstsq(X, runs.tpot_us.to_numpy(), rcond=None)
    sizes = sorted({max(int(top * i / 16), 1) for i in range(1, 17)})
    space = search_cache(trace, profile, budget, versions=cls, shares=TUNER_SHARES, n_cpu=[L],
                   cache_mib=sizes).frame
    space = space[space.cache_mib > 0].copy()
    space["fitted_us"] = coef[0] + coef[1] * space.uploads + coef[2] * space.cpu_misses
    pick = space.loc[space.fitted_us.idxmin()]
    return {"cache_mib": int(pick.cache_mib), "cpu_share": float(pick.cpu_share),
            "fitted_us": float(pick.fitted_us), "tpot_us": float(pick.tpot_us),
            "runs": len(runs), "fit": [float(c) for c in coef]}


def compare_with_tuner(budgets_gib=(8, 12, 16, 24)) -> list[dict]:
    rows = []
    for name, stem in EXAMPLES.items():
        trace, cal, profile = load(stem)
        g = trace.model
        for gib in budgets_gib:
            budget = g.expert_budget_bytes(gib * GIB)
            if budget < 0:
                continue
            ours = search_cache(trace, profile, budget).best().iloc[0]
            tuner = tuner_pick(trace, profile, budget)
            K = g.experts_per_layer_for_vram(gib * GIB)
            w = winner(predict(trace, profile, K, calibration=cal, draws=0), K)
            rows.append({
                "example": name, "vram_gib": gib, "K": K,
                "ours": {"candidate": ours.candidate, "n_cpu_moe": int(ours.n_cpu_moe),
                         "cache_mib": int(ours.cache_mib), "cpu_share": float(ours.cpu_share),
                         "tpot_us": float(ours.tpot_us)},
                "tuner": tuner,
                "tuner_regret_pct": 100 * (tuner["tpot_us"] / float(ours.tpot_us) - 1),
                "matrix_winner": {"candidate": str(w.candidate), "tpot_us": float(w.tpot_us)},
                "server_runs": {"ours": 0, "tuner": tuner["runs"]}})
    return rows


def timeit(fn, repeats: int) -> dict:
    fn()
    s = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        s.append(time.perf_counter() - t0)
    q25, med, q75 = np.percentile(s, [25, 50, 75])
    return {"median_s": float(med), "iqr_s": float(q75 - q25)}


def speed(repeats: int) -> dict:
    trace, cal, profile = load("gguf-qwen3-30b-a3b-q4_k_m")
    g = trace.model
    b16 = g.expert_budget_bytes(16 * GIB)
    b15 = g.expert_budget_bytes(15.5 * GIB)
    K = g.experts_per_layer_for_vram(16 * GIB)
    full = timeit(lambda: search_cache(trace, profile, b16), repeats)
    move = timeit(lambda: search_cache(trace, profile, b15), repeats)
    base = timeit(lambda: predict(trace, profile, K, calibration=cal), repeats)
    return {"configurations": len(search_cache(trace, profile, b16).frame),
            "search_16gib": full, "search_15_5gib": move, "predict_one_k": base,
            "ratio_search_over_predict": full["median_s"] / base["median_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    out = {"machine": platform.platform(), "speed": speed(args.repeats),
           "tuner": compare_with_tuner()}
    sp = out["speed"]
    print(f"search of {sp['configurations']} configurations at 16 GiB: "
          f"{sp['search_16gib']['median_s']:.3f} s (IQR {sp['search_16gib']['iqr_s']:.3f}); "
          f"a slider move to 15.5 GiB {sp['search_15_5gib']['median_s']:.3f} s; predict at one "
          f"K {sp['predict_one_k']['median_s']:.3f} s; ratio {sp['ratio_search_over_predict']:.2f}")
    print(f"{'example':<42}{'GiB':>4}  {'ours':<62}{'tuner (-cmoe)':<30}{'regret':>7}  "
          "Policy Matrix winner")
    for r in out["tuner"]:
        o, t, w = r["ours"], r["tuner"], r["matrix_winner"]
        mine = (f"{o['candidate']} -ncmoe {o['n_cpu_moe']} {o['cache_mib']} MiB "
                f"F={o['cpu_share']:g} {o['tpot_us'] / 1e3:.2f} ms")
        theirs = f"{t['cache_mib']} MiB F={t['cpu_share']:g} {t['tpot_us'] / 1e3:.2f} ms"
        print(f"{r['example']:<42}{r['vram_gib']:>4}  {mine:<62}{theirs:<30}"
              f"{r['tuner_regret_pct']:>6.1f}%  {w['candidate']} {w['tpot_us'] / 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
