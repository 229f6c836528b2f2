"""Speed and memory of trace I/O against a plain Arrow read of the same file, in the same run.

Workloads (issue: traces at production scale):

* a Qwen3-30B-A3B synthetic trace of 64 prompts x 2,048 tokens (131,072 tokens x 48 layers =
  6.3 M rows): ``cope synth`` writing it, ``read_trace`` reading it, and the yardstick — a
  ``pyarrow.parquet.read_table`` of the same file with every column (list values and offsets
  flattened) taken to numpy;
* ``--big``: a 1,000,000-token x 48-layer trace (48 M rows): ``cope synth`` writing it and
  ``cope predict`` at one K end to end from the file.

Each measurement runs in a fresh Python process; peak RSS is the child's ``ru_maxrss`` and the
baseline RSS that of the same process right after its imports, so "+x GB" is what the operation
itself added. Numba caches its kernels on disk: a warm-up run on a tiny trace compiles them
first, as any earlier use would have.

``--before DIR`` runs every case also on another checkout (e.g. ``git worktree add DIR <commit>``)
and prints both with the ratio; ``--limit-gb`` caps each child's address space so that a version
that cannot fit fails fast instead of swapping. Run:
``python benchmarks/bench_io.py [--big] [--before DIR] [--json OUT] [--workdir DIR]``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, resource, sys, time
def rss_gb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
{imports}
base = rss_gb()
t0 = time.perf_counter()
{work}
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({{"seconds": seconds, "peak_gb": peak, "base_gb": base, "added_gb": peak - base}}))
"""

READ = ("from cope_core.parquet_io import read_trace", "tr = read_trace(sys.argv[1])")
YARDSTICK = ("import numpy as np, pyarrow.parquet as pq, pyarrow.compute as pc",
             "t = pq.read_table(sys.argv[1])\n"
             "cols = {}\n"
             "for name in t.column_names:\n"
             "    c = t.column(name).combine_chunks()\n"
             "    if str(c.type).startswith('list'):\n"
             "        cols[name] = (pc.list_flatten(c).to_numpy(zero_copy_only=False),\n"
             "                      c.offsets.to_numpy(zero_copy_only=False))\n"
             "    else:\n"
             "        cols[name] = c.to_numpy(zero_copy_only=False)")


def _probe(code: Path, imports: str, work: str, *args: str, limit_gb: float | None = None) -> dict:
    def cap() -> None:
        if limit_gb:
            import resource
            lim = int(limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    r = subprocess.run([sys.executable, "-c", PROBE.format(imports=imports, work=work), *args],
                       capture_output=True, text=True, cwd=code, preexec_fn=cap,
                       env=dict(os.environ, PYTHONPATH=str(code)))
    if r.returncode != 0:
        lines = [s for s in r.stderr.strip().splitlines() if s.strip()]
        said = [s for s in lines if s.startswith("cope: error:")]  # the CLI's own message
        return {"error": ((said or lines or [f"exit status {r.returncode}"])[-1])[:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cope(code: Path, *args: str, limit_gb: float | None = None) -> dict:
    """Time and peak RSS of one ``cope`` command in its own process."""
    work = ("import contextlib, io\n"
            "from cope_core.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    code = main({list(args)!r})\n"
            "assert code == 0, code")
    return _probe(code, "import cope_core.cli.main", work, limit_gb=limit_gb)


def _show(name: str, r: dict, base: dict | None = None, what: str = "") -> str:
    if "error" in r:
        return f"  {name:<46} failed: {r['error']}"
    ratio = ""
    if base and "error" not in base:
        ratio = (f"   {r['seconds'] / base['seconds']:.2f}x time, "
                 f"{r['peak_gb'] / max(base['peak_gb'], 1e-9):.2f}x peak{what}")
    return (f"  {name:<46} {r['seconds']:8.2f} s  peak {r['peak_gb']:5.2f} GB "
            f"(+{r['added_gb']:.2f} GB){ratio}")


def _warm(code: Path, work: Path) -> None:
    tiny, cal, prof = work / "warm.parquet", work / "warm-cal.parquet", work / "warm-prof.parquet"
    _cope(code, "synth", "--model", "qwen3-30b-a3b", "--prompts", "2", "--tokens", "8",
          "--seed", "1", "-o", str(tiny), "--force")
    _cope(code, "synth", "--model", "qwen3-30b-a3b", "--prompts", "2", "--tokens", "8",
          "--seed", "2", "-o", str(cal), "--force")
    _cope(code, "profile", "--analytic", "--gpu", "rtx4090", "--model", "qwen3-30b-a3b", "-o",
          str(prof), "--force")
    _cope(code, "predict", "--trace", str(tiny), "--calibration", str(cal), "--profile",
          str(prof), "-K", "32", "--json")


def run(code: Path, work: Path, big: bool, limit_gb: float | None) -> dict:
    _warm(code, work)
    out: dict = {}
    path = work / "qwen3-64x2048.parquet"
    out["synth_64x2048"] = _cope(code, "synth", "--model", "qwen3-30b-a3b", "--prompts", "64",
                                 "--tokens", "2048", "--seed", "1", "-o", str(path), "--force",
                                 limit_gb=limit_gb)
    if not path.exists():
        return out
    out["file_mb"] = path.stat().st_size / 2**20
    out["yardstick"] = _probe(code, *YARDSTICK, str(path))
    out["read_trace"] = _probe(code, *READ, str(path), limit_gb=limit_gb)
    if big:
        # the big trace is written once, by this checkout's synth, and read by each version
        bigf, cal, prof = work / "qwen3-1M.parquet", work / "qwen3-cal.parquet", work / "p.parquet"
        out["synth_1M"] = _cope(code, "synth", "--model", "qwen3-30b-a3b", "--prompts", "500",
                                "--tokens", "2000", "--seed", "3", "-o",
                                str(work / f"synth-{code.name}.parquet"), "--force",
                                limit_gb=limit_gb)
        if not bigf.exists():
            _cope(ROOT, "synth", "--model", "qwen3-30b-a3b", "--prompts", "500", "--tokens",
                  "2000", "--seed", "3", "-o", str(bigf), "--force")
        _cope(code, "synth", "--model", "qwen3-30b-a3b", "--prompts", "16", "--tokens", "256",
              "--seed", "4", "-o", str(cal), "--force")
        _cope(code, "profile", "--analytic", "--gpu", "rtx4090", "--model", "qwen3-30b-a3b", "-o",
              str(prof), "--force")
        out["predict_1M_one_k"] = _cope(code, "predict", "--trace", str(bigf), "--calibration",
                                        str(cal), "--profile", str(prof), "-K", "32", "--json",
                                        limit_gb=limit_gb)
        (work / f"synth-{code.name}.parquet").unlink(missing_ok=True)
    return out


def report(out: dict, before: dict | None) -> None:
    b = before or {}
    print(f"Qwen3-30B-A3B, 64 prompts x 2,048 tokens x 48 layers (6.3 M rows, "
          f"{out.get('file_mb') or 0:.0f} MB); {os.cpu_count()} CPUs")
    for key, name in (("synth_64x2048", "cope synth"), ("read_trace", "read_trace (validated)")):
        if key in b:
            print(_show(f"{name}, before", b[key]))
        if key in out:
            print(_show(name, out[key], b.get(key), " of before"))
    if "yardstick" in out:
        print(_show("yardstick: pq.read_table + to numpy", out["yardstick"]))
        print(_show("read_trace against the yardstick (goal 2x, 1.5x)", out["read_trace"],
                    out["yardstick"]))
    if "synth_1M" in out:
        print("1,000,000 tokens x 48 layers (48 M rows)")
        for key, name in (("synth_1M", "cope synth"),
                          ("predict_1M_one_k", "cope predict -K 32 (goal 60 s, 4 GB)")):
            if key in b:
                print(_show(f"{name}, before", b[key]))
            print(_show(name, out[key], b.get(key), " of before"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="also the 48 M-row trace and predict")
    ap.add_argument("--before", help="another checkout to measure the same cases on")
    ap.add_argument("--limit-gb", type=float, help="address-space cap per child process")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--workdir", help="keep the trace files here (default: a temporary folder)")
    args = ap.parse_args()
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="cope-io-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {"cpus": os.cpu_count()}}
    if args.before:
        result["before"] = run(Path(args.before).resolve(), work, args.big, args.limit_gb)
    result["after"] = run(ROOT, work, args.big, args.limit_gb)
    report(result["after"], result.get("before"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
