"""Does ``cope verify`` find the measured winner while measuring much less than a full run?

For each case — the DeepSeek-V2-Lite 4-layer cut (the shipped measured example's cells) and the
Mixtral-8x7B 2-layer grid of emulated platforms (its link and host settings x CPU threads) — a
full measurement of all 13 candidates (``cope measure``, 3 trials) and a ``cope verify`` run at
the same cells. Per cell: is the verified winner in the full measurement's measured-tied set
(``cope evaluate``'s tie test), and what share of the full run's candidate-trials did the race
measure? Targets (issue 27): in the tie set in at least 90 % of cells, at most 40 % of the
candidate-trials.

    python benchmarks/bench_verify.py OUT [--case deepseek|grid|all] [--full-trials 3]
        [--deepseek-from DIR] [--grid-from DIR]

OUT is resumable: a measurement or verify record already there is not made again.
``--deepseek-from data/examples`` takes the shipped example's measurements and verify record
(made by ``scripts/make_data.py --only measured``) instead of measuring again. Writes
``OUT/report.json`` and ``OUT/report.md``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from grid_report import settings_of, tag  # beside this script, on sys.path when it runs

from cope_core import parquet_io
from cope_core.estimate.noise import measured_cells
from cope_core.verify import read_verify

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "data" / "examples" / "deepseek-v2-lite-4l"
GRID = ROOT / "data" / "platforms" / "cpu-emulated-grid"


def _cope(args: list, log) -> float:
    print("$ cope " + " ".join(shlex.quote(str(a)) for a in args), file=log, flush=True)
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "cope_core.cli.main", *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True)
    log.write(r.stdout + r.stderr)
    log.flush()
    if r.returncode:
        raise SystemExit(f"bench_verify: `cope {' '.join(map(str, args))}` failed:\n{r.stderr}")
    return time.time() - t


def run_case(name: str, trace: Path, cal: Path, prof: Path, ks: str, threads: str,
             knobs: list, out: Path, full_trials: int, log, meas: Path | None = None,
             ver: Path | None = None) -> list[dict]:
    """Measure and verify one setting (unless ``meas`` or ``ver`` are given and exist); one row
    per cell."""
    meas = meas or out / f"{name}-measurements.parquet"
    ver = ver or out / f"{name}-verify.json"
    seconds = {}
    if not meas.exists():
        seconds["measure"] = _cope(["measure", "--trace", trace, "--calibration", cal, "-K", ks,
                                    "--threads", threads, "--trials", full_trials,
                                    "--profile", prof, "--no-progress", *knobs, "-o", meas], log)
    if not ver.exists():
        seconds["verify"] = _cope(["verify", "--trace", trace, "--calibration", cal, "--profile",
                                   prof, "-K", ks, "--threads", threads, "--full-trials",
                                   full_trials, "--no-progress", *knobs, "-o", ver], log)
    full = parquet_io.read_measurements(meas)
    cells = measured_cells(full.table, draws=1000, seed=0)
    trials = int(full.table.groupby(["K", "cpu_threads", "candidate", "prompt"])["trial"]
                 .nunique().min())
    rows = []
    for c in read_verify(ver).cells:
        here = cells[(cells["K"] == c.K) & (cells["cpu_threads"] == c.cpu_threads)]
        tied = sorted(here.loc[here["tied"], "candidate"])
        winner = str(here.loc[here["winner"], "candidate"].iloc[0])
        rows.append({"case": name, "K": c.K, "cpu_threads": c.cpu_threads,
                     "measured_winner": winner, "tied": tied,
                     "predicted": c.predicted_winner, "verified": c.verified_winner,
                     "in_tie_set": c.verified_winner in tied,
                     "predicted_in_tie_set": c.predicted_winner in tied,
                     "stop": c.stop, "rounds": c.rounds, "contenders": len(c.contenders),
                     "candidate_trials": c.candidate_trials,
                     "full_candidate_trials": 13 * trials,
                     "share_pct": 100.0 * c.candidate_trials / (13 * trials),
                     "verify_seconds": c.seconds, "full_estimate_seconds":
                         c.full_seconds_estimate, **{f"{k}_seconds": v
                                                     for k, v in seconds.items()}})
    return rows


def summary(rows: list[dict]) -> dict:
    n = len(rows)
    trials = sum(r["candidate_trials"] for r in rows)
    full = sum(r["full_candidate_trials"] for r in rows)
    return {"cells": n, "in_tie_set": sum(r["in_tie_set"] for r in rows),
            "in_tie_set_pct": 100.0 * sum(r["in_tie_set"] for r in rows) / max(n, 1),
            "predicted_in_tie_set": sum(r["predicted_in_tie_set"] for r in rows),
            "candidate_trials": trials, "full_candidate_trials": full,
            "share_pct": 100.0 * trials / max(full, 1),
            "targets_met": {"in_tie_set >= 90 %": 100.0 * sum(r["in_tie_set"] for r in rows)
                            >= 90.0 * n, "share <= 40 %": trials <= 0.40 * full}}


def markdown(rows: list[dict], total: dict, by_case: dict) -> str:
    out = ["| case | K | threads | measured winner | tied with it | predicted | verified | in tie "
           "set | stop | rounds | candidate-trials |", "|" + "---|" * 11]
    for r in rows:
        out.append(f"| {r['case']} | {r['K']} | {r['cpu_threads']} | {r['measured_winner']} | "
                   f"{', '.join(t for t in r['tied'] if t != r['measured_winner']) or '–'} | "
                   f"{r['predicted']} | {r['verified']} | {'yes' if r['in_tie_set'] else 'NO'} "
                   f"| {r['stop']} | {r['rounds']} | {r['candidate_trials']}/"
                   f"{r['full_candidate_trials']} ({r['share_pct']:.0f} %) |")
    out.append("")
    for name, s in [*by_case.items(), ("all", total)]:
        out.append(f"- {name}: verified winner in the measured tie set in {s['in_tie_set']}/"
                   f"{s['cells']} cells ({s['in_tie_set_pct']:.0f} %; the predicted winner in "
                   f"{s['predicted_in_tie_set']}); {s['candidate_trials']} of "
                   f"{s['full_candidate_trials']} candidate-trials ({s['share_pct']:.0f} %)")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--case", choices=["deepseek", "grid", "all"], default="all")
    ap.add_argument("--full-trials", type=int, default=3)
    ap.add_argument("--deepseek-from", type=Path, metavar="DIR",
                    help="take deepseek-v2-lite-4l-cpu-emulated-{measurements.parquet,"
                         "verify.json} from DIR")
    ap.add_argument("--grid-from", type=Path, metavar="DIR",
                    help="a finished benchmarks/fidelity_grid.py folder made on this machine: "
                         "its traces, profiles and measurements (the full measurement) are used "
                         "and only the verify runs are made (default: the shipped grid's "
                         "traces and profiles, measured here)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with open(out / "run.log", "a") as log:
        if args.case in ("deepseek", "all"):
            meas = ver = None
            if args.deepseek_from is not None:
                stem = args.deepseek_from / "deepseek-v2-lite-4l-cpu-emulated"
                meas, ver = Path(f"{stem}-measurements.parquet"), Path(f"{stem}-verify.json")
            rows += run_case("deepseek-v2-lite-4l", Path(f"{EX}-trace.parquet"),
                             Path(f"{EX}-calibration.parquet"),
                             Path(f"{EX}-cpu-emulated-profile.parquet"), "8,16,32,48", "1,2",
                             [], out, args.full_trials, log, meas, ver)
        if args.case in ("grid", "all"):
            for link, slow in settings_of("none:4,4:2,1:1"):
                t = tag(link, slow)
                knobs = (["--link-gbps", link] if link is not None else []) + \
                    ["--cpu-slowdown", slow]
                grid = args.grid_from or GRID
                rows += run_case(f"mixtral-2l-{t}", grid / "trace.parquet",
                                 grid / "calibration.parquet", grid / f"profile-{t}.parquet",
                                 "2", "1,2", knobs, out, args.full_trials, log,
                                 grid / f"measurements-{t}.parquet" if args.grid_from else None)
    by_case: dict[str, dict] = {}
    for name in dict.fromkeys(r["case"].split("-link")[0] for r in rows):
        by_case[name] = summary([r for r in rows if r["case"].startswith(name)])
    total = summary(rows)
    (out / "report.json").write_text(json.dumps({"cells": rows, "cases": by_case,
                                                 "total": total}, indent=1) + "\n")
    (out / "report.md").write_text(markdown(rows, total, by_case))
    print(markdown(rows, total, by_case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
