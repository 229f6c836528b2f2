"""The prompt model against llama.cpp's own prompt processing on this machine's software Vulkan
device (Mesa lavapipe): which bytes cross per physical batch as ``--n-cpu-moe``, ``-ub`` and
``--no-op-offload`` change (docs/design.md#prompt-processing, docs/results.md).

    python scripts/vulkan_pp.py --run      # measure (minutes; an idle machine), then --write
    python scripts/vulkan_pp.py [--write | --check]

``--run`` writes a random-weight qwen3moe GGUF (tests/llama_tools.py ``write_tiny_moe``'s
defaults: 4 blocks of 8 F16 experts, top-2, 103 MiB), probes this machine (host memory read and
copy bandwidth, the CPU as ``--cpu this`` composes it) and runs the Vulkan build's llama-bench
(scripts/runtimes_vulkan.sh) on it: ``-p 512 -n 0 -ngl 99 -ncmoe 0,2,4 -ub 32,128,512
-nopo 0,1 -t 2 -r 1`` (the software device runs a 2048-token prompt at 32-token batches for
minutes per test, so the prompt is 512 tokens and the largest batch the whole prompt).
Everything measured goes to benchmarks/results/vulkan-pp.json.

The table prices every row with :func:`cope_core.llamacpp.match_bench_rows` (what ``cope evaluate
--llama-bench`` runs) on a machine whose parts are this one's: the CPU as probed, the device's
memory = host memory (probed), its "link" = a host memcpy (probed; lavapipe's device memory is
host memory, so op offload's upload is a copy). A software device has no published FLOP rate or
launch cost: those two numbers are taken from the runs, the ``-ncmoe 0`` rows at ``-ub`` 128 and
512 (every weight on the device, no copy); every other row is a prediction. ``--write`` puts the
table into docs/results.md between its vulkan-pp markers; ``--check`` exits 1 when it is not
current (tests/test_llamacpp_prompt.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from doc_blocks import block_main  # beside this script, on sys.path when it runs
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "results" / "vulkan-pp.json"
START, END = "<!-- vulkan-pp:start -->", "<!-- vulkan-pp:end -->"
#: the grid llama-bench runs: host layers (-ncmoe), -ub and op offload
GRID = {"n_cpu_moe": (0, 2, 4), "n_ubatch": (32, 128, 512), "op_offload": (True, False)}
#: the rows the device's FLOP rate and launch cost are taken from: every weight on the device,
#: op offload on, -ub 128 and 512 (host layers, -ub, op offload)
CALIBRATION = ((0, 128, False), (0, 512, False))


def bench_command(bench: str | Path, model: str | Path) -> list[str]:
    """The one llama-bench run, written by the command builder: a 512-token prompt once on 2
    threads, every layer on the device, every configuration of :data:`GRID` (``-ncmoe 0,2,4
    -ub 32,128,512 -nopo 0,1``), one JSON line per test."""
    from cope_core.llamacpp import LlamaFlags
    grid = [LlamaFlags(n_gpu_layers=99, threads=2, n_cpu_moe=n, n_ubatch=ub, op_offload=o)
            for n in GRID["n_cpu_moe"] for ub in GRID["n_ubatch"] for o in GRID["op_offload"]]
    return LlamaFlags.bench_command(bench, model, LlamaFlags.sweep(grid), n_prompt=512, n_gen=0,
                                    repetitions=1, output="jsonl")


def write_model(path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_tools import write_tiny_moe
    return write_tiny_moe(path)


def vulkan_dir() -> Path:
    cache = os.environ.get("COPE_RUNTIMES_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cope-explorer")
    return Path(cache) / "llama.cpp-b11434-vulkan"


def copy_bandwidth(nbytes: int = 256 << 20, samples: int = 7) -> float:
    """Host memcpy bandwidth (bytes copied per second): the fastest of a few copies."""
    import torch
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(samples + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def run() -> None:
    from cope_core.machine import compose_machine
    vk = vulkan_dir()
    bench = vk / "bin" / "llama-bench"
    if not bench.exists():
        raise SystemExit(f"vulkan_pp: {bench} is missing: bash scripts/runtimes_vulkan.sh")
    m = compose_machine(gpu=None, cpu="this", memory="this", probe_seconds=3.0)
    copy_bw = copy_bandwidth()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp) / "moe.gguf")
        env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="0", LD_LIBRARY_PATH=str(vk / "bin"))
        t0 = time.time()
        # one JSON line per test as it ends (a software device takes minutes per test):
        # progress is the line count of the partial file
        partial = DATA.with_suffix(".jsonl.partial")
        with open(partial, "w") as out:
            subprocess.run(bench_command(bench, model), env=env, check=True,
                           stdout=out, stderr=subprocess.DEVNULL)
        rows = [json.loads(line) for line in partial.read_text().splitlines() if line.strip()]
        partial.unlink()
    for r in rows:   # the temporary folder's name: a stable one
        r["model_filename"] = "/tmp/moe.gguf"
    record = {"what": "scripts/vulkan_pp.py --run", "when": time.strftime("%Y-%m-%d"),
              "host": platform.processor() or platform.machine(),
              "llama_bench": bench_command("llama-bench", "moe.gguf"),
              "bench_seconds": round(time.time() - t0, 1),
              "copy_bandwidth": copy_bw, "cpu": dataclasses.asdict(m.cpu),
              "memory": dataclasses.asdict(m.memory), "threads": m.threads, "rows": rows}
    tmp_path = DATA.with_suffix(".json.partial")
    tmp_path.write_text(json.dumps(record, indent=1) + "\n")
    tmp_path.replace(DATA)
    print(f"wrote {DATA} ({len(rows)} rows, {record['bench_seconds']} s of llama-bench)")


def _spec(record: dict, gpu_flops: float, launch_us: float):
    """This machine with the software device as its GPU."""
    from cope_core.machine import compose_machine
    from cope_core.parts.records import CpuPart, MemoryPart
    cpu = CpuPart(**{k: tuple(v) if isinstance(v, list) else v
                     for k, v in record["cpu"].items()})
    mem = MemoryPart(**record["memory"])
    m = compose_machine(gpu="rtx3090", cpu=cpu, memory=mem, threads=record["threads"])
    assert m.spec is not None
    return dataclasses.replace(
        m.spec, name="lavapipe on this machine", gpu_name="lavapipe", gpu_flops=gpu_flops,
        gpu_bandwidth=mem.bandwidth, gpu_efficiency=1.0, gpu_launch_us=launch_us,
        link_name="host memcpy", link_bandwidth=record["copy_bandwidth"],
        # the device's rate is fitted on its own rows, and its "pageable" copy is the memcpy
        gpu_prompt_efficiency=1.0, host_copy_bandwidth=record["copy_bandwidth"])


def _key(r) -> tuple:
    return (r.n_cpu, r.row.n_ubatch, r.row.no_op_offload)


def priced(record: dict) -> tuple[list, float, float]:
    """Each row's match (:class:`cope_core.llamacpp.BenchMatch`), and the device's FLOP rate and
    launch cost taken from the two calibration rows (solved exactly by scipy)."""
    from cope_core.llamacpp import match_bench_rows, read_llama_bench, read_llama_model
    from cope_core.models import resolve_model
    from cope_core.profile.analytic import analytic_profile
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp) / "moe.gguf")
        bench = Path(tmp) / "bench.json"
        bench.write_text(json.dumps(record["rows"]))
        rows = read_llama_bench(bench)
        lm = read_llama_model(model)
        g = resolve_model(str(model))

    def seconds(flops: float, launch_us: float) -> tuple[list, dict]:
        spec = _spec(record, flops, launch_us)
        prof = analytic_profile(g, spec, cpu_threads=[record["threads"]])
        got = match_bench_rows(rows, lm, g, prof, spec=spec)
        return got, {_key(x): x.row.n_prompt / x.predicted_ts for x in got}
    measured = {_key(x): x.row.n_prompt / x.row.avg_ts for x in seconds(1e12, 1.0)[0]}

    def misfit(v: np.ndarray) -> list[float]:     # log rate (FLOP/s) and log launch cost (µs)
        _, t = seconds(float(np.exp(v[0])), float(np.exp(v[1])))
        return [np.log(t[k] / measured[k]) for k in CALIBRATION]
    fit = least_squares(misfit, x0=[np.log(1e9), np.log(100.0)])
    flops, launch_us = (float(np.exp(x)) for x in fit.x)
    assert max(abs(r) for r in fit.fun) < 1e-6, fit.fun      # two rows, two numbers: exact
    got, _ = seconds(flops, launch_us)
    return got, flops, launch_us


def table() -> str:
    record = json.loads(DATA.read_text())
    got, flops, launch_us = priced(record)
    base = {(x.row.n_ubatch, x.row.no_op_offload): x for x in got if x.n_cpu == 0}
    lines = ["| --n-cpu-moe | -ub | op offload | measured t/s | predicted t/s | error | "
             "ratio to -ncmoe 0, measured | predicted | ratio error |",
             "|---|---|---|---|---|---|---|---|---|"]
    errs, rerrs = [], []
    for x in sorted(got, key=lambda x: (x.row.no_op_offload, x.row.n_ubatch, x.n_cpu)):
        meas, pred = x.row.avg_ts, x.predicted_ts
        err = 100 * (pred / meas - 1)
        b = base[(x.row.n_ubatch, x.row.no_op_offload)]
        rm, rp = meas / b.row.avg_ts, pred / b.predicted_ts
        rerr = 100 * (rp / rm - 1)
        cal = _key(x) in CALIBRATION
        if not cal:
            errs.append(abs(err))
        if x.n_cpu:
            rerrs.append(abs(rerr))
        lines.append(f"| {x.n_cpu} | {x.row.n_ubatch} | "
                     f"{'off' if x.row.no_op_offload else 'on'} | {meas:.1f} | {pred:.1f} | "
                     + ("(calibration)" if cal else f"{err:+.1f} %") + f" | {rm:.2f} | "
                     f"{rp:.2f} | " + (f"{rerr:+.1f} %" if x.n_cpu else "") + " |")
    mean, rmean = sum(errs) / len(errs), sum(rerrs) / len(rerrs)
    lines += ["", f"Mean absolute error {mean:.1f} % over {len(errs)} rows (the two calibration "
              f"rows left out); ratio error {rmean:.1f} % over {len(rerrs)} ratios to the same "
              "-ub's -ncmoe 0 row.",
              "", f"Measured {record['when']} with `{' '.join(record['llama_bench'])}` "
              f"(llama.cpp b11434, Vulkan build, `GGML_VK_VISIBLE_DEVICES=0`; "
              f"{record['bench_seconds']:.0f} s); host memcpy {record['copy_bandwidth'] / 1e9:.1f} "
              f"GB/s, host memory {record['memory']['bandwidth'] / 1e9:.1f} GB/s; the "
              f"device's FLOP rate ({flops / 1e9:.2f} GFLOP/s) and fixed cost per kernel and "
              f"batch ({launch_us / 1e3:.1f} ms, the spec's launch cost) from the -ncmoe 0 rows "
              "at -ub 128 and 512."]
    return "\n".join(lines)


def main() -> int:
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "results.md", START, END, table,
                      run=run)


if __name__ == "__main__":
    raise SystemExit(main())
