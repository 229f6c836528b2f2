"""How llama.cpp's CPU MoE decode scales on this machine (issue 53, first part): llama-bench's tg
on the CPU build at every thread count, for random-weight qwen3moe models that differ in their
block count and their experts' width, in two weight types, beside a memory probe at the same
thread counts. Per type and thread count, least squares over the models separates a token's time
into the part that is bytes over an effective bandwidth and the parts that are fixed, per layer
(graph nodes, thread barriers) and per token:

    1 / tps = per_token + blocks * per_layer + bytes / bandwidth

Blocks and width vary apart (bytes per layer change with the width at the same node count), so
the per-layer cost and the bandwidth are both identified.

    python scripts/cpu_scaling.py --run      # measure (an idle machine; ~15 min), then --write
    python scripts/cpu_scaling.py [--write | --check]

``--run`` writes each model in F16 (tests/llama_tools.py ``write_tiny_moe``: 16 experts, top-2,
hidden 1024; blocks x width in ``MODELS``), quantizes it with the build's llama-quantize to each
of ``TYPES``, reads the bytes a token reads from the quantized file, runs ``llama-bench -p 0
-n 64 -r 5 -t 1..N`` of the CPU build (scripts/runtimes.sh), and probes host memory with 1..N
threads (:func:`cope_core.mechanisms.probe.probe_host_memory`); everything goes to
benchmarks/results/cpu-scaling.json. ``--write`` puts the derivation's table into
docs/design.md between its cpu-scaling markers; ``--check`` exits 1 when it is not current.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.linalg
from doc_blocks import block_main  # beside this script, on sys.path when it runs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "results" / "cpu-scaling.json"
START, END = "<!-- cpu-scaling:start -->", "<!-- cpu-scaling:end -->"
SHAPE = dict(n_experts=16, hidden=1024, heads=16, kv_heads=8, head_dim=64, vocab=512)
#: (blocks, expert width): every model is well over this machine's 32 MiB last-level cache
MODELS = ((4, 768), (4, 1536), (12, 768), (12, 1536))
TYPES = ("Q8_0", "Q4_K_M")
TOP_K = 2                       # write_tiny_moe's n_used


def token_bytes(path: Path) -> int:
    """Bytes of weights one decode token reads from a GGUF: every tensor but the embedding (one
    row of it is read) and the routed experts (``TOP_K`` of ``n_experts``), as stored."""
    from gguf import GGUFReader
    total = 0
    for t in GGUFReader(str(path)).tensors:
        if t.name == "token_embd.weight":
            continue
        share = TOP_K / SHAPE["n_experts"] if "_exps." in t.name else 1.0
        total += int(t.n_bytes) * share
    return int(total)


def _bin(name: str) -> Path:
    cache = os.environ.get("COPE_RUNTIMES_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cope-explorer")
    path = Path(cache) / "llama.cpp-b11434" / "bin" / name
    if not path.exists():
        raise SystemExit(f"cpu_scaling: {path} is missing: bash scripts/runtimes.sh")
    return path


def run() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_tools import write_tiny_moe

    from cope_core.llamacpp import LlamaFlags
    from cope_core.mechanisms.probe import probe_host_memory
    bench, quantize = _bin("llama-bench"), _bin("llama-quantize")
    env = dict(os.environ, LD_LIBRARY_PATH=str(bench.parent))
    threads = list(range(1, (os.cpu_count() or 1) + 1))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for blocks, width in MODELS:
            f16 = write_tiny_moe(Path(tmp) / "f16.gguf", n_blocks=blocks, inter=width, **SHAPE)
            for qtype in TYPES:
                model = Path(tmp) / f"{qtype}.gguf"
                subprocess.run([str(quantize), str(f16), str(model), qtype], env=env,
                               check=True, capture_output=True)
                # every thread count in one run (-t 1,2,...,N), decode only
                cmd = LlamaFlags.bench_command(
                    bench, model, LlamaFlags.sweep([LlamaFlags(threads=t) for t in threads]),
                    n_prompt=0, n_gen=64, repetitions=5, output="jsonl")
                out = subprocess.run(cmd, env=env, check=True, capture_output=True,
                                     text=True).stdout
                nbytes = token_bytes(model)
                for line in out.splitlines():
                    r = json.loads(line)
                    rows.append({"type": qtype, "blocks": blocks, "width": width,
                                 "token_bytes": nbytes, "threads": r["n_threads"],
                                 "avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"],
                                 "samples_ts": r["samples_ts"], "build": r["build_number"]})
                model.unlink()
                print(f"{qtype} {blocks} x {width}: done", flush=True)
    probe = []
    for t in threads:
        hb = probe_host_memory(seconds=3.0, threads=t)
        probe.append({"threads": t, "read_bytes_per_s": hb.all_threads,
                      "one_thread_bytes_per_s": hb.one_thread})
    record = {"what": "scripts/cpu_scaling.py --run", "when": time.strftime("%Y-%m-%d"),
              "shape": SHAPE, "models": [list(m) for m in MODELS], "types": list(TYPES),
              "cpu": _cpu_name(), "rows": rows, "probe": probe}
    partial = DATA.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(DATA)
    print(f"wrote {DATA}")


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def fit(rows: list[dict]) -> dict:
    """Least squares of every sample's seconds per token on (1, blocks, bytes): the per-token
    and per-layer fixed costs (s), the bandwidth (bytes/s), the standard errors of the three
    and the largest relative residual of a model's mean."""
    x, y = [], []
    for r in rows:
        for s in r["samples_ts"]:
            x.append((1.0, r["blocks"], r["token_bytes"]))
            y.append(1.0 / s)
    a, b = np.array(x), np.array(y)
    coef, _, _, _ = scipy.linalg.lstsq(a, b)
    resid = b - a @ coef
    dof = max(len(b) - 3, 1)
    cov = np.linalg.inv(a.T @ a) * (resid @ resid) / dof
    se = np.sqrt(np.diag(cov))
    worst = max(abs(1 / r["avg_ts"] - (coef[0] + coef[1] * r["blocks"]
                                       + coef[2] * r["token_bytes"])) * r["avg_ts"]
                for r in rows)
    return {"per_token": coef[0], "per_layer": coef[1], "bandwidth": 1 / coef[2],
            "se_token": se[0], "se_layer": se[1], "bandwidth_rel_se": se[2] / coef[2],
            "worst": worst}


def fits(rec: dict) -> dict[tuple[str, int], dict]:
    """:func:`fit` per (type, threads) of a record."""
    keys = sorted({(r["type"], r["threads"]) for r in rec["rows"]})
    return {k: fit([r for r in rec["rows"] if (r["type"], r["threads"]) == k]) for k in keys}


def table() -> str:
    rec = json.loads(DATA.read_text())
    probe = {p["threads"]: p["read_bytes_per_s"] for p in rec["probe"]}
    lines = ["| type | threads | tg t/s, smallest to largest model | effective bandwidth (GB/s) "
             "| per layer (µs) | per token (µs) | fixed share, largest model | memory probe "
             "(GB/s) | effective / probe | worst residual |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (qtype, t), f in fits(rec).items():
        rows = sorted((r for r in rec["rows"] if (r["type"], r["threads"]) == (qtype, t)),
                      key=lambda r: r["token_bytes"])
        big = rows[-1]
        fixed = f["per_token"] + big["blocks"] * f["per_layer"]
        lines.append(
            f"| {qtype} | {t} | {rows[0]['avg_ts']:.0f} … {big['avg_ts']:.0f} | "
            f"{f['bandwidth'] / 1e9:.1f} ± {100 * f['bandwidth_rel_se']:.0f} % | "
            f"{1e6 * f['per_layer']:.0f} ± {1e6 * f['se_layer']:.0f} | "
            f"{1e6 * f['per_token']:.0f} ± {1e6 * f['se_token']:.0f} | "
            f"{100 * fixed * big['avg_ts']:.0f} % | {probe[t] / 1e9:.1f} | "
            f"{f['bandwidth'] / probe[t]:.2f} | {100 * f['worst']:.1f} % |")
    sizes = sorted({r["token_bytes"] for r in rec["rows"]})
    return "\n".join(lines + [
        "", f"Measured {rec['when']} on {rec.get('cpu', 'this machine')} by `python "
        "scripts/cpu_scaling.py --run` (llama.cpp b11434's CPU build, `llama-bench -p 0 -n 64 "
        f"-r 5`; {len(rec['models'])} models per type, {sizes[0] / 2**20:.0f} to "
        f"{sizes[-1] / 2**20:.0f} MiB read per token); each row solves `1 / tps = per_token + "
        "blocks × per_layer + bytes / bandwidth` by least squares over every sample (± one "
        "standard error)."])


def main() -> int:
    return block_main(__doc__.splitlines()[0], ROOT / "docs" / "design.md", START, END, table,
                      run=run)


if __name__ == "__main__":
    raise SystemExit(main())
