"""Server-side rerun time of the explorer's Landscape page, measured with Streamlit's AppTest.

Workload (issue: the Streamlit explorer): the shipped Qwen3-30B-A3B example (SYNTHETIC trace of
8 prompts x 128 tokens, 48 MoE layers, top-8 of 128; ANALYTIC RTX 4090 profile), all 13
candidates. Three kinds of rerun, each after a warm-up run that compiles the numba kernels:

- one K: the VRAM slider moves to a budget whose K was never predicted (the sweep is cached);
  goal <= 250 ms;
- full sweep: the replay and prediction caches are cleared, so every K = 0 ... 128 is replayed
  and priced again (plus the one-K view); goal <= 1.5 s;
- re-priced sweep: the operating point or estimator changes; the replays are cached (they do not
  depend on either), every K is priced again;
- unchanged: a rerun where nothing changed (everything from st.cache_data);
- Compare: a platform never priced before is added on the Compare page; goal <= 1.5 s;
- Policy Matrix: the slider moves to a budget never seen, so llama.cpp's own MoE cache is
  searched there (every --n-cpu-moe x the largest cache x both rules x 6 CPU shares) beside the
  heatmap; goal <= 1 s.

Also reported: the first run of a fresh process (Overview: imports, the numba kernels loaded
from their disk cache; then Landscape: the first sweep).

Run: ``python benchmarks/bench_app.py [--repeats N] [--json OUT]``
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from cope_core.app.apptest import open_app_test

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "qwen3-30b-a3b"


def timed_run(at: AppTest) -> float:
    t0 = time.perf_counter()
    at.run()
    dt = time.perf_counter() - t0
    if at.exception or at.error:
        raise RuntimeError(f"the page failed: {[e.value for e in at.exception or at.error]}")
    return dt


def summary(samples: list[float]) -> dict:
    q25, med, q75 = np.percentile(samples, [25, 50, 75])
    return {"median_s": float(med), "iqr_s": float(q75 - q25), "max_s": float(max(samples)),
            "n": len(samples), "samples_s": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    at = open_app_test(ROOT / "app.py", default_timeout=300)
    at.query_params["example"] = EXAMPLE
    first_overview = timed_run(at)              # fresh process: imports, numba disk cache
    at.switch_page("pages/landscape.py")
    first_landscape = timed_run(at)             # first sweep of this process
    slider = at.slider(key="_w_vram")
    lo, hi = slider.min, slider.max
    budgets = [round(b * 4) / 4 for b in np.linspace(lo + 5, hi - 5, args.repeats)]

    one_k, seen_k = [], set()
    for b in budgets:
        at.slider(key="_w_vram").set_value(float(b))
        one_k.append(timed_run(at))
        seen_k.add(at.session_state["_w_vram"])

    unchanged = [timed_run(at) for _ in range(args.repeats)]

    from cope_core.app import results
    cold = []
    for _ in range(args.repeats):
        results.clear_replays()
        cold.append(timed_run(at))

    repriced = []
    ops = at.selectbox(key="_w_op").options
    ests = [r for r in at.radio(key="_w_est").options]
    combos = [(o, e) for e in ests for o in ops][1:]     # the first pair is the cached one
    for op, est in combos[:args.repeats]:
        at.selectbox(key="_w_op").set_value(op)
        at.radio(key="_w_est").set_value(est)
        repriced.append(timed_run(at))

    # Compare: a platform never priced before joins the chosen ones (the replay is cached)
    at.switch_page("pages/compare.py")
    timed_run(at)
    from cope_core.app.compare_view import catalog_names
    fresh = [n for n in catalog_names() if "xeon" not in n][:args.repeats]
    added = []
    for name in fresh:
        at.multiselect(key="_w_plat").set_value(["this", name])
        added.append(timed_run(at))

    # Policy Matrix with llama.cpp's own cache: the search runs at every budget never seen
    at.switch_page("pages/matrix.py")
    timed_run(at)
    at.selectbox(key="_w_op").set_value(ops[0])
    at.radio(key="_w_est").set_value("cope")          # the cache rows are priced by COPE's
    timed_run(at)
    matrix_move = []
    for b in budgets:
        at.slider(key="_w_vram").set_value(float(b) + 0.25)
        matrix_move.append(timed_run(at))

    result = {
        "workload": f"{EXAMPLE} example, Landscape page, 13 candidates",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine()},
        "one_k_rerun": summary(one_k), "full_sweep_rerun": summary(cold),
        "repriced_sweep_rerun": summary(repriced), "unchanged_rerun": summary(unchanged),
        "compare_platform_added": summary(added),
        "matrix_llamacpp_rerun": summary(matrix_move),
        "goals_s": {"one_k_rerun": 0.25, "full_sweep_rerun": 1.5,
                    "compare_platform_added": 1.5, "matrix_llamacpp_rerun": 1.0},
        "first_overview_run_s": first_overview, "first_landscape_run_s": first_landscape,
    }
    for name in ("one_k_rerun", "full_sweep_rerun", "repriced_sweep_rerun", "unchanged_rerun",
                 "compare_platform_added", "matrix_llamacpp_rerun"):
        r = result[name]
        goal = result["goals_s"].get(name)
        print(f"{name:<21} median {r['median_s'] * 1e3:8.1f} ms  IQR {r['iqr_s'] * 1e3:6.1f} ms  "
              f"max {r['max_s'] * 1e3:8.1f} ms  (n={r['n']})"
              + (f"  goal <= {goal * 1e3:.0f} ms: {'met' if r['median_s'] <= goal else 'NOT met'}"
                 if goal else ""))
    print(f"first run in a fresh process: Overview {first_overview * 1e3:.0f} ms, then Landscape "
          f"{first_landscape * 1e3:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
