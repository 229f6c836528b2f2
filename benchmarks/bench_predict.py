"""Speed of ``predict`` against a plain numpy baseline measured in the same run.

Workload (issue: core engine): a Qwen3-30B-A3B-sized synthetic trace of 10,000 decode tokens
(10 prompts x 1,000), 48 MoE layers, top-8 of 128, with next-layer predictions; an analytic
RTX 4090 profile. Baseline: one vectorised numpy pass that counts fixed-residency hits at one K.
Reported: median and IQR of each timing and the ratios predict / baseline, the bootstrap's
overhead at one K (the default 1000 draws against ``--draws 0``), and each replay kernel
on its own (one residency at one K, and over the sweep K = 0..E), which is the gate for kernel
changes: compare two runs' ``kernels`` sections.

Run: ``python benchmarks/bench_predict.py [--repeats N] [--json OUT] [--kernels-only]``
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import numpy as np

from cope_core import predict
from cope_core.geometry import get_model
from cope_core.platforms import platform_spec
from cope_core.profile.analytic import analytic_profile
from cope_core.replay.engine import replay
from cope_core.trace.data import fill_order
from cope_core.trace.synth import synthesize


def timeit(fn, repeats: int, warmup: int = 1) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    q25, med, q75 = np.percentile(samples, [25, 50, 75])
    return {"median_s": float(med), "iqr_s": float(q75 - q25), "samples_s": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sweep-repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--kernels-only", action="store_true",
                    help="time only the replay kernels (the gate for kernel changes)")
    args = ap.parse_args()

    g = get_model("qwen3-30b-a3b")
    trace = synthesize(g, prompts=10, tokens=1000, seed=1)
    calib = synthesize(g, prompts=10, tokens=1000, seed=2)
    profile = analytic_profile(g, platform_spec("rtx4090"))
    warnings.simplefilter("ignore")

    order = fill_order(calib)
    rank = np.empty_like(order)
    rank[np.arange(g.n_layers)[:, None], order] = np.arange(g.n_experts, dtype=order.dtype)
    layer_idx = np.arange(g.n_layers)[None, :, None]

    def numpy_pass():
        return int((rank < args.k)[layer_idx, trace.routed].sum())

    base = timeit(numpy_pass, args.repeats)
    all_k = list(range(g.n_experts + 1))
    kernels = {}
    for res in ("fixed", "mutable_per_layer", "mutable_cross_layer"):
        kernels[f"{res}_one_k"] = timeit(lambda res=res: replay(trace, order, res, [args.k]),
                                         args.repeats)
        kernels[f"{res}_sweep"] = timeit(lambda res=res: replay(trace, order, res, all_k),
                                         args.sweep_repeats)
    print(f"replay kernels ({trace.n_tokens} tokens x {g.n_layers} layers, K={args.k} and "
          f"0..{g.n_experts}):")
    for name, r in kernels.items():
        print(f"  {name:<34} median {r['median_s'] * 1e3:9.2f} ms  IQR {r['iqr_s'] * 1e3:7.2f} ms")
    if args.kernels_only:
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"kernels": kernels}, fh, indent=2)
        return
    one = timeit(lambda: predict(trace, profile, args.k, calibration=calib), args.repeats)
    # the bootstrap's price: the default run (1000 draws) against --draws 0, in this same run
    bare = timeit(lambda: predict(trace, profile, args.k, calibration=calib, draws=0),
                  args.repeats)
    sweep = timeit(lambda: predict(trace, profile, all_k, calibration=calib), args.sweep_repeats)
    result = {
        "workload": {"model": g.name, "tokens": trace.n_tokens, "layers": g.n_layers,
                     "top_k": g.top_k, "experts": g.n_experts, "k": args.k},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine()},
        "numpy_fixed_hits_one_k": base, "predict_13_one_k": one,
        "predict_13_one_k_draws_0": bare,
        "bootstrap_overhead_one_k": one["median_s"] / bare["median_s"] - 1,
        "predict_13_sweep_0_to_E": sweep,
        "ratio_one_k": one["median_s"] / base["median_s"],
        "ratio_sweep": sweep["median_s"] / base["median_s"],
        "kernels": kernels,
    }
    print(f"workload: {g.name}, {trace.n_tokens} tokens x {g.n_layers} layers, top-{g.top_k} "
          f"of {g.n_experts}, K={args.k}; {os.cpu_count()} CPUs")
    for name, r in (("numpy fixed-hit pass (baseline)", base),
                    ("predict, 13 candidates, one K", one),
                    ("  same, --draws 0 (no bootstrap)", bare),
                    (f"predict, 13 candidates, K=0..{g.n_experts}", sweep)):
        print(f"  {name:<42} median {r['median_s'] * 1e3:9.1f} ms  IQR {r['iqr_s'] * 1e3:7.1f} ms")
    print(f"  ratio one K : {result['ratio_one_k']:.2f}x baseline (goal <= 1.0x)")
    print(f"  ratio sweep : {result['ratio_sweep']:.1f}x baseline (goal <= 40x)")
    print(f"  bootstrap (1000 draws) at one K: +{100 * result['bootstrap_overhead_one_k']:.1f} % "
          "over --draws 0 (goal <= 10 %)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
