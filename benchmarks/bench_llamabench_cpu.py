"""The analytic CPU model against llama.cpp's own kernels: a GGUF with Qwen3-30B-A3B's expert
shapes (hidden 2048, expert FFN 768, 128 experts, top 8; attention 32 query and 4 KV heads of
128), cut to a few blocks and a small vocabulary, random weights quantised by llama-quantize to
Q8_0 and Q4_K_M, decoded by llama-bench (``-ngl 0 -p 0 -n N``) at 1 and 2 threads; the CPU-only
model for ``--cpu this --memory this`` (:mod:`cope_core.estimate.cpu_only`) predicts each point.
Reported: the error per point before any refit, then after refitting the host's expert
throughput per thread count (:data:`cope_core.estimate.refit.HOST_EXPERTS` at 1 and at 2
threads: two knobs) on half the points, on the other half (both halvings: Q8_0 at 1 thread with
Q4_K_M at 2, and the other diagonal; each held-out point has the other type at its thread
count fitted). Issue 41's targets: <= 15 % mean absolute error before, <= 5 % on the held-out
points after.

    python benchmarks/bench_llamabench_cpu.py WORK [--blocks 4] [--reps 3] [--rounds 2]
        [--n-gen 128] [--llama-bench PATH] [--out benchmarks/results/llamabench_cpu.json]
    python benchmarks/bench_llamabench_cpu.py WORK --rescore SAVED.json --out NEW.json

``--rescore`` predicts a saved run's llama-bench samples again with the model as it is now,
without running llama-bench: the machine is the saved one (its probes' spec), and where the
saved run has no probe of the dot-product kernel (runs before it existed) the kernel is probed
now, on whatever load the machine has (recorded), or taken from ``--kernel ONE,ALL,CACHED``
(GB/s of 8-bit weights: one thread from memory, all threads, one thread from cache; a probe
taken earlier, said so in the report).

WORK holds the model files (about 2.6 GB Q8_0 and 1.5 GB Q4_K_M at 4 blocks; the 4.8 GB F16
source is deleted once both exist), reused when there. The machine is shared: each run's load
average (1 minute) before it starts is recorded, runs are interleaved over ``--rounds`` so a
burst of load hits every point alike, and a point is the median of its repetitions.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from llama_tools import LLAMA, LLAMA_VULKAN, write_moe_streamed  # noqa: E402

from cope_core.estimate.cpu_only import host_spec, spec_tpot  # noqa: E402
from cope_core.estimate.refit import HOST_EXPERTS, FitPoint, refit  # noqa: E402
from cope_core.files import write_atomic  # noqa: E402
from cope_core.llamacpp import LlamaFlags, probe_bench_build, run_bench  # noqa: E402
from cope_core.machine import compose_machine  # noqa: E402
from cope_core.mechanisms.probe import probe_host_kernel  # noqa: E402
from cope_core.models import resolve_model  # noqa: E402
from cope_core.platforms import PlatformSpec, with_kernel  # noqa: E402

#: Qwen3-30B-A3B's shapes (its config.json), the vocabulary cut to 512 byte-level tokens
SHAPE = dict(n_experts=128, n_used=8, hidden=2048, inter=768, heads=32, kv_heads=4,
             head_dim=128, vocab=512)
TYPES = ("Q8_0", "Q4_K_M")
THREADS = (1, 2)


def models(work: Path, blocks: int) -> dict[str, Path]:
    """The quantised files, made when missing (F16 written, quantised, then deleted)."""
    out = {t: work / f"qwen3-30b-a3b-shape-{blocks}l-{t}.gguf" for t in TYPES}
    if all(p.is_file() for p in out.values()):
        return out
    src = work / f"qwen3-30b-a3b-shape-{blocks}l-F16.gguf"
    if not src.is_file():
        t0 = time.time()
        write_moe_streamed(src.with_suffix(".partial"), n_blocks=blocks, **SHAPE)
        os.replace(src.with_suffix(".partial"), src)
        print(f"wrote {src} in {time.time() - t0:.0f} s", flush=True)
    for t, p in out.items():
        if p.is_file():
            continue
        t0 = time.time()
        r = subprocess.run([str(LLAMA / "bin" / "llama-quantize"), str(src), str(p) + ".partial",
                            t, "2"], capture_output=True, text=True,
                           env=dict(os.environ, LD_LIBRARY_PATH=str(LLAMA / "bin")))
        if r.returncode:
            sys.exit(f"llama-quantize {t} failed: {r.stderr[-500:]}")
        os.replace(str(p) + ".partial", p)
        print(f"quantised {p.name} in {time.time() - t0:.0f} s", flush=True)
    src.unlink()
    return out


def bench_exe(given: str | None) -> tuple[Path, dict[str, str]]:
    """The llama-bench to run and its environment: the CPU build's, else the Vulkan build's
    with no Vulkan device visible (the same ggml CPU backend, built with the same flags)."""
    if given:
        return Path(given), {}
    cpu = LLAMA / "bin" / "llama-bench"
    if cpu.is_file():
        return cpu, {}
    return LLAMA_VULKAN / "bin" / "llama-bench", {"GGML_VK_VISIBLE_DEVICES": ""}


def measure(a: argparse.Namespace, files: dict[str, Path]) -> tuple[dict, list[dict], dict]:
    """Run llama-bench over ``--rounds`` interleaved rounds: every point's samples, every run,
    and the build."""
    exe, env = bench_exe(a.llama_bench)
    build = probe_bench_build(exe, env)
    samples: dict[tuple[str, int], list[float]] = {(t, n): [] for t in TYPES for n in THREADS}
    runs = []
    for rnd in range(a.rounds):
        order = list(samples) if rnd % 2 == 0 else list(reversed(list(samples)))
        for t, n in order:
            load = os.getloadavg()[0]
            t0 = time.time()
            row = run_bench(build, files[t], LlamaFlags.cpu_only(n).argv("bench"),
                            repetitions=a.reps, n_gen=a.n_gen, env=env)
            samples[(t, n)] += list(row.samples_ts)
            runs.append({"round": rnd, "type": t, "threads": n, "load_avg_1min": load,
                         "seconds": time.time() - t0, "samples_ts": list(row.samples_ts)})
            print(f"round {rnd} {t} t={n}: {np.round(row.samples_ts, 2)} tok/s "
                  f"(load {load:.2f})", flush=True)
    return samples, runs, build.to_dict() | {"env": env}


def saved(path: Path) -> tuple[dict, list[dict], dict, dict]:
    """A saved report's samples, runs, llama-bench build, and the report."""
    r = json.loads(path.read_text())
    samples: dict[tuple[str, int], list[float]] = {(t, n): [] for t in TYPES for n in THREADS}
    for run in r["runs"]:
        samples[(run["type"], int(run["threads"]))] += [float(x) for x in run["samples_ts"]]
    return samples, r["runs"], r["llama_bench"], r


def kernel_now() -> tuple[tuple[float, float, float], dict]:
    """The dot-product kernel probed now, and how (for a saved run that had none)."""
    load = os.getloadavg()[0]
    k = probe_host_kernel()
    return (k.one_thread, k.all_threads, k.cached), {
        "probed": "now, for --rescore", "load_avg_1min": load, "one_thread": k.one_thread,
        "all_threads": k.all_threads, "cached": k.cached, "threads": k.threads,
        "samples": k.samples, "seconds": k.seconds}


def score(samples: dict, spec: PlatformSpec, geo: dict, context: float) -> dict:
    """Every point before any refit, and both halvings' refits (module docstring)."""
    def predict(s: PlatformSpec, p: FitPoint) -> float:
        return spec_tpot(geo[p.what], s, p.threads, context)
    points = {k: FitPoint(f"{k[0]} at {k[1]} thread(s)", k[1], 1e6 / float(np.median(v)), k[0])
              for k, v in samples.items()}
    halves = {"Q8_0@1 + Q4_K_M@2": [("Q8_0", 1), ("Q4_K_M", 2)],
              "Q8_0@2 + Q4_K_M@1": [("Q8_0", 2), ("Q4_K_M", 1)]}
    knobs = [HOST_EXPERTS.at(n) for n in THREADS]
    refits = {}
    for name, fit_keys in halves.items():
        r = refit(spec, knobs, [points[k] for k in fit_keys], predict,
                  held_out=[p for k, p in points.items() if k not in fit_keys])
        refits[name] = r.to_dict()
    before = [{"type": k[0], "threads": k[1], "measured_ts": 1e6 / p.measured_us,
               "measured_spread_ts": [float(np.min(samples[k])), float(np.max(samples[k]))],
               "predicted_ts": 1e6 / predict(spec, p),
               "error_pct": 100.0 * (p.measured_us / predict(spec, p) - 1.0)}
              for k, p in points.items()]
    return {"before_refit": before,
            "mae_before_pct": float(np.mean([abs(b["error_pct"]) for b in before])),
            "refits": refits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    # llama-bench's own default (tg128): a repetition four times longer than 32 tokens averages
    # over more of the machine's drift
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--llama-bench")
    ap.add_argument("--rescore", type=Path, help="a saved report: predict its samples anew")
    ap.add_argument("--kernel", help="with --rescore: the kernel's rates ONE,ALL,CACHED in GB/s "
                    "where the saved run has none (default: probe now)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results"
                    / "llamabench_cpu.json")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    files = models(a.work, a.blocks)
    geo = {t: resolve_model(str(p)) for t, p in files.items()}
    kernel_info: dict = {"from": "the saved run's probes"}
    if a.rescore:
        samples, runs, build, old = saved(a.rescore)
        settings = old["settings"]
        machine_dict = old["machine"]
        spec = PlatformSpec.from_dict(old["spec"])
        if spec.cpu_kernel_bandwidth_per_thread is None:
            if a.kernel:
                one, every, cached = (float(x) * 1e9 for x in a.kernel.split(","))
                rates, kernel_info = (one, every, cached), {"given": a.kernel}
            else:
                rates, kernel_info = kernel_now()
            spec = with_kernel(spec, rates)
    else:
        # the host's probes (memory, dot-product kernel) first, on the machine as it is before
        # llama-bench runs
        kernel_info = {"probed": "before the runs", "load_avg_1min": os.getloadavg()[0]}
        machine = compose_machine(gpu=None, cpu="this", memory="this")
        machine_dict = machine.to_dict()
        spec = host_spec(machine.cpu, machine.memory)
        samples, runs, build = measure(a, files)
        settings = {"reps": a.reps, "rounds": a.rounds, "n_gen": a.n_gen,
                    "context": (a.n_gen + 1) / 2}     # decode token i attends to i + 1 tokens
    scored = score(samples, spec, geo, float(settings["context"]))
    report = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "command": "python " + " ".join(sys.argv),
        **({"rescored_from": str(a.rescore)} if a.rescore else {}),
        "kernel_probe": kernel_info,
        "llama_bench": build, "machine": machine_dict, "spec": spec.to_dict(),
        "model": {"blocks": a.blocks, **SHAPE,
                  "files": {t: {"name": p.name, "bytes": p.stat().st_size}
                            for t, p in files.items()}},
        "settings": settings, "runs": runs, **scored,
        "load_avg_1min": {"min": min(r["load_avg_1min"] for r in runs),
                          "max": max(r["load_avg_1min"] for r in runs)},
        "cores": os.cpu_count(),
    }
    write_atomic(a.out, json.dumps(report, indent=1, allow_nan=False) + "\n", overwrite=True)
    for b in scored["before_refit"]:
        print(f"{b['type']} at {b['threads']} thread(s): measured {b['measured_ts']:.2f} tok/s, "
              f"predicted {b['predicted_ts']:.2f} ({b['error_pct']:+.1f} %)")
    print(f"mean absolute error before any refit: {scored['mae_before_pct']:.1f} % "
          f"(target <= 15 %: {'met' if scored['mae_before_pct'] <= 15 else 'missed'})")
    for name, v in scored["refits"].items():
        after = v["mae_held_out_after_pct"]
        print(f"refit on {name}: held-out error {after:.1f} % "
              f"(target <= 5 %: {'met' if after <= 5 else 'missed'})")
    print(json.dumps({"mae_before_pct": scored["mae_before_pct"],
                      **{k: {"held_out_after": v["mae_held_out_after_pct"],
                             "factors": [x["factor"] for x in v["knobs"]]}
                         for k, v in scored["refits"].items()}}, indent=1))


if __name__ == "__main__":
    main()
