"""A controlled grid of emulated platforms: does COPE pick the winner where the ranking flips?

Platform settings (paced link GB/s, host slowdown) x CPU threads are the cells. Per setting the
model is profiled once (``cope profile --link-gbps X --cpu-slowdown F``) and every candidate is
measured (``cope measure`` with the same settings); then ``cope evaluate --per-k --json``
scores every estimator per cell. The output folder is resumable: a step whose output exists is
skipped. The report (``report.md``, ``report.json``) gives per cell the measured winner and its
margin over the fastest candidate that is not the same policy, whether that margin is beyond
the tie test, each estimator's pick, regret, tie-aware and strict top-1 and MAPE, and the
aggregate — the shape of the paper's Table 3 — then the platforms' cost ratios, schedules against
their isolated-op composition, each estimator's signed error by residency and its residency gap
by execution, and COPE with the profiles' prefetch rows beside CPU misses dropped.

    python benchmarks/fidelity_grid.py OUT [--model mixtral-8x7b] [--layers 2] [-K 2]
        [--settings none:4,4:2,1:1] [--threads 1,2] [--prompts 2] [--tokens 8]
        [--trials 2] [--min-time 20]

``--settings`` is a comma list of LINK:SLOWDOWN (LINK ``none`` for an unpaced copy worker).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from grid_report import (  # beside this script, on sys.path when it runs
    ablation_rows,
    ablation_table,
    bias_rows,
    bias_table,
    cells_of,
    contention_rows,
    contention_table,
    gap_table,
    margins,
    report,
    resemblance,
    resemblance_table,
    settings_of,
    tag,
)

ROOT = Path(__file__).resolve().parent.parent


def _cope(args: list[str], log) -> float:
    cmd = [sys.executable, "-m", "cope_core.cli.main", *map(str, args)]
    print("$ cope " + " ".join(shlex.quote(str(a)) for a in args), file=log, flush=True)
    t = time.time()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log.write(r.stdout + r.stderr)
    log.flush()
    if r.returncode != 0:
        raise SystemExit(f"fidelity_grid: `cope {' '.join(map(str, args))}` failed:\n{r.stderr}")
    return time.time() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("-K", type=int, default=2, dest="k")
    ap.add_argument("--settings", default="none:4,4:2,1:1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=20.0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm
    settings = settings_of(args.settings)
    trace, cal = out / "trace.parquet", out / "calibration.parquet"
    steps = 2 + 3 * len(settings)
    bar = tqdm(total=steps, unit="step", desc="fidelity grid")
    times: dict[str, float] = {}
    start = time.time()
    with open(out / "run.log", "a") as log:
        base = ["--model", args.model, "--layers", args.layers, "--seed", 1]
        for path, extra in ((trace, ["--prompts", args.prompts, "--tokens", args.tokens]),
                            (cal, ["--prompts", 8, "--tokens", 64, "--first-prompt",
                                   args.prompts])):
            if not path.exists():
                times[path.name] = _cope(["synth", *base, *extra, "-o", path], log)
            bar.update(1)
        cells = []
        top1: dict[str, list[int]] = {}
        for link, slow in settings:
            t = tag(link, slow)
            knobs = (["--link-gbps", link] if link is not None else []) + \
                ["--cpu-slowdown", slow]
            prof, meas = out / f"profile-{t}.parquet", out / f"measurements-{t}.parquet"
            ev_path = out / f"evaluate-{t}.json"
            bar.set_postfix_str(f"profile {t}")
            if not prof.exists():
                times[prof.name] = _cope(["profile", "--trace", trace, "--threads",
                                          args.cpu_threads, "--contexts", "128,1024",
                                          "--min-time", args.min_time, "--no-progress", *knobs,
                                          "-o", prof], log)
            bar.update(1)
            bar.set_postfix_str(f"measure {t}")
            if not meas.exists():
                times[meas.name] = _cope(["measure", "--trace", trace, "--calibration", cal,
                                          "-K", args.k, "--threads", args.cpu_threads,
                                          "--trials", args.trials, "--profile", prof,
                                          "--no-progress", *knobs, "-o", meas], log)
            bar.update(1)
            if not ev_path.exists():
                r = subprocess.run([sys.executable, "-m", "cope_core.cli.main", "evaluate",
                                    "--trace", str(trace), "--calibration", str(cal),
                                    "--profile", str(prof), "--measurements", str(meas),
                                    "--per-k", "--json"], cwd=ROOT, capture_output=True,
                                   text=True)
                if r.returncode != 0:
                    raise SystemExit(f"fidelity_grid: evaluate failed:\n{r.stderr}")
                ev_path.write_text(r.stdout)
            bar.update(1)
            ev = json.loads(ev_path.read_text())
            for est, e in ev.items():           # per prompt, strict: summed over settings
                if e and est != "measurement_quality":
                    acc = top1.setdefault(est, [0, 0])
                    acc[0] += e["top1"][0]
                    acc[1] += e["top1"][1]
            m = margins(meas, trace, cal, prof)
            for c in cells_of(ev, link, slow):
                c["runner_up"], c["margin_pct"], same = m[(c["K"], c["cpu_threads"])]
                c["tied"] = [x for x in c["tied"] if x not in same]    # other policies only
                c["same_policy"] = sorted(same - {c["measured"]})
                cells.append(c)
    bar.close()
    profiles = {tag(lk, sl): out / f"profile-{tag(lk, sl)}.parquet" for lk, sl in settings}
    like = resemblance(profiles)
    cont = contention_rows(profiles)
    bias = bias_rows(trace, cal, {tag(lk, sl): (profiles[tag(lk, sl)],
                                                out / f"measurements-{tag(lk, sl)}.parquet")
                                  for lk, sl in settings})
    abl = ablation_rows(trace, cal, {tag(lk, sl): (profiles[tag(lk, sl)],
                                                 out / f"measurements-{tag(lk, sl)}.parquet")
                                     for lk, sl in settings})
    text = (report(cells, top1) + "\n\n" + resemblance_table(like) + "\n\n"
            + contention_table(cont) + "\n\n" + bias_table(bias) + "\n\n" + gap_table(bias))
    if abl:
        text += "\n\n" + ablation_table(abl, cells)
    prior = {}
    if (out / "report.json").exists():      # a resumed run keeps the times of skipped steps
        prior = json.loads((out / "report.json").read_text())
    earlier = prior.get("seconds", {})
    walls = prior.get("earlier_wall_seconds", []) + (
        [prior["wall_seconds"]] if "wall_seconds" in prior else [])
    (out / "report.md").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps({"cells": cells, "resemblance": like,
                                                 "contention": cont, "bias": bias,
                                                 "ablation": abl,
                                                 "top1_prompts": top1,
                                                 "seconds": {**earlier, **times},
                                                 "wall_seconds": time.time() - start,
                                                 "earlier_wall_seconds": walls},
                                                indent=1) + "\n")
    print(text)
    print(f"\nwall time this run: {time.time() - start:.0f} s (steps: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
