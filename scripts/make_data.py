#!/usr/bin/env python3
"""Regenerate everything under ``data/`` (seeded), with a progress display.

    python3 scripts/make_data.py                      # every step (~60 min on 2 cores)
    python3 scripts/make_data.py --only synthetic     # one or more steps
    python3 scripts/make_data.py --only measured      # the measured example: ~25 min (profile
                                                      # 1, measure 19, verify 5; 2026-12-02)
    python3 scripts/make_data.py --realdata DIR       # where ../shared/realdata lives

Steps, in order:

calibrate  popularity skew per model from the published expert counts in ``realdata/popularity``,
           generator reuse fitted to the real Mixtral decode trace; written to
           ``data/synthetic-parameters.json`` (later runs without the real data reuse that file).
synthetic  evaluation and calibration traces (``cope synth``) and an ANALYTIC profile
           (``cope profile --analytic``) for each shipped model.
collected  a trace collected with ``cope trace collect`` from a tiny random-weight Mixtral-style
           model, with a predictor trained by ``cope predictor train`` on its hidden states.
measured   a DeepSeek-V2-Lite-geometry example cut to 4 MoE layers, profiled (``cope profile
           --trace``) and measured (``cope measure``) on this machine's CPU with the emulated
           accelerator at 1 and 2 CPU threads (3 trials), verified (``cope verify``), then
           scored (``cope evaluate``).
readme     ``data/README.md`` from ``data/manifest.json`` (every file, its command, platform and
           provenance).

Each step records the exact ``cope`` commands it ran in ``data/manifest.json``; the README is
rendered from it, so the two cannot disagree.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cope_core.files import write_atomic

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
EXAMPLES = DATA / "examples"
COLLECTED = DATA / "collected"
MANIFEST = DATA / "manifest.json"
PARAMS = DATA / "synthetic-parameters.json"

STEPS = ("calibrate", "synthetic", "collected", "measured", "grid", "readme")

#: Shipped models: seed base, the GPU of the analytic what-if profile, and which real counts
#: set the popularity skew ("olmoe": OLMoE's curve carried over by the fraction K / E).
MODELS = {
    "qwen3-30b-a3b": dict(seed=11, gpu="rtx4090", counts="olmoe"),
    "deepseek-v2-lite": dict(seed=21, gpu="a100-80gb", counts="olmoe", label="a100"),
    "qwen3.5-35b-a3b": dict(seed=31, gpu="rtx5090", counts="olmoe"),
    "mixtral-8x7b": dict(seed=41, gpu="rtx4090", counts="mixtral"),
    "olmoe-1b-7b": dict(seed=51, gpu="rtx4090", counts="olmoe"),
}
TRACE_SHAPE = dict(prompts=8, tokens=128)          # evaluation traces
CALIBRATION_SHAPE = dict(prompts=16, tokens=128)   # calibration traces (popularity fill)
PREDICTOR_ACCURACY = 0.7                           # no published recall for these models

# The measured example: the issue-4 fidelity case at a size that fits the time budget.
MEASURED = dict(model="deepseek-v2-lite", layers=4, prompts=2, tokens=12, ks="8,16,32,48",
                threads="1,2", trials=3, min_time=20)
MEASURED_STEM = "deepseek-v2-lite-4l"

# The controlled grid of emulated platforms (benchmarks/fidelity_grid.py): Mixtral-8x7B cut
# to 2 MoE layers (its 336 MiB experts make the MoE layers most of a token), K = 2 of 8,
# three (link, host) settings x CPU threads 1 and 2. About 33 minutes on the 2-core machine.
GRID = dict(model="mixtral-8x7b", layers=2, k=2, settings="none:4,4:2,1:1", threads="1,2",
            prompts=4, tokens=4, trials=2, min_time=10)
GRID_DIR = DATA / "platforms" / "cpu-emulated-grid"

#: Short provenance tags; data/README.md's "Outside data and licences" section expands [1]-[3].
ATTRIBUTION = {
    "olmoe": "skew from OLMoE-1B-7B expert counts [1]",
    "mixtral": "skew from Mixtral-8x7B expert counts [1] and frequencies [2]",
    "reuse": "reuse fitted to a real Mixtral-8x7B-Instruct decode trace [3]",
}


# --- plumbing -----------------------------------------------------------------------------------
class Manifest:
    """``data/manifest.json``: file -> what it is, exact commands, platform, provenance."""

    def __init__(self) -> None:
        self.entries: dict[str, dict] = (json.loads(MANIFEST.read_text())
                                         if MANIFEST.exists() else {})

    def add(self, path: Path, **info) -> None:
        self.entries[str(path.relative_to(DATA))] = info

    def save(self) -> None:
        self.entries = {k: v for k, v in sorted(self.entries.items()) if (DATA / k).exists()}
        _write_text(MANIFEST, json.dumps(self.entries, indent=1) + "\n")


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, text, overwrite=True)   # make_data regenerates its own files


def _rel(p: Path | str) -> str:
    p = Path(p)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def cope(args: list, bar: tqdm, cwd: Path = ROOT) -> str:
    """Run one ``cope`` command (in this interpreter) and return its stdout; exits on failure."""
    shown = _shown(args)
    args = [str(a) for a in args]
    bar.set_postfix_str(" ".join(args[:2]))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cope_core.cli.main", *args], cwd=cwd,
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"make_data: command failed ({r.returncode}): {shown}\n{r.stderr.strip()}")
    bar.write(f"  [{time.perf_counter() - t0:6.1f} s] {shown}")
    return r.stdout


# --- calibrate ----------------------------------------------------------------------------------
def _count_rows(counts: dict, model: str) -> np.ndarray:
    rows = []
    for layers in counts["counts"][model]["expert_counts"].values():
        for layer in layers:
            rows.append([layer[str(i)] for i in range(len(layer))])
    return np.asarray(rows, dtype=np.float64)


def step_calibrate(realdata: Path, man: Manifest, bar: tqdm) -> None:
    from cope_core.geometry import get_model
    from cope_core.trace.fit import coverage_curve, fit_skew_to_counts, fit_synth, transfer_curve
    from cope_core.trace.sources.importers import import_trace

    pop = realdata / "popularity"
    if not pop.is_dir():
        if PARAMS.exists():
            bar.write(f"  {pop} not found: keeping the fitted parameters in {_rel(PARAMS)}")
            return
        sys.exit(f"make_data: {pop}: not found; expected ../shared/realdata (or --realdata DIR)")
    counts = json.loads((pop / "olmoe-and-mixtral-expert-counts.json").read_text())
    freq = np.load(pop / "mixtral-8x7b-instruct-expert-frequencies.npy", allow_pickle=False)
    curves = {"olmoe": coverage_curve(_count_rows(counts, "olmoe")),
              "mixtral": coverage_curve(np.vstack([_count_rows(counts, "mistral"), freq]))}
    out: dict = {"predictor_accuracy": PREDICTOR_ACCURACY, "models": {}}
    for name, spec in MODELS.items():
        g = get_model(name)
        target = transfer_curve(curves[spec["counts"]], g.n_experts)
        fit = fit_skew_to_counts(target, g, seed=0)
        out["models"][name] = dict(skew=fit.skew, skew_max_gap=round(fit.max_gap, 4),
                                   counts=spec["counts"],
                                   transferred=g.n_experts != len(curves[spec["counts"]]) - 1)
        bar.write(f"  {name}: skew {fit.skew} (largest coverage gap {fit.max_gap:.3f}, "
                  f"from {spec['counts']} counts)")
    files = sorted((realdata / "mixtral-8x7b-instruct-decode").glob("*.jsonl"))
    mixtral = get_model("mixtral-8x7b")
    real, _ = import_trace("jsonl", files, mixtral)
    fit = fit_synth(real, seed=0, skew=out["models"]["mixtral-8x7b"]["skew"])
    out["reuse"] = dict(value=fit.reuse, real_measured_reuse=round(fit.real_reuse, 4),
                        synth_measured_reuse=round(fit.synth_reuse, 4),
                        real_tokens=int(real.n_tokens), hit_rate_max_gap=round(fit.max_gap, 4))
    bar.write(f"  reuse {fit.reuse} (real Mixtral decode: measured reuse {fit.real_reuse:.3f}, "
              f"{real.n_tokens} tokens; largest hit-rate gap {fit.max_gap:.3f})")
    _write_text(PARAMS, json.dumps(out, indent=1) + "\n")
    man.add(PARAMS, kind="parameters", what="fitted generator parameters behind every SYNTHETIC "
            "trace: popularity skew per model, reuse, predictor accuracy (an assumption)",
            commands=["python3 scripts/make_data.py --only calibrate"],
            provenance=[ATTRIBUTION["olmoe"], ATTRIBUTION["mixtral"], ATTRIBUTION["reuse"]])


# --- synthetic ----------------------------------------------------------------------------------
def step_synthetic(man: Manifest, bar: tqdm) -> None:
    params = json.loads(PARAMS.read_text())
    reuse = params["reuse"]["value"]
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    for name, spec in MODELS.items():
        p = params["models"][name]
        src = ATTRIBUTION[p["counts"]] + (" carried over by K/E" if p["transferred"] else "")
        # one synthetic model per seed (its popularity ranking): the calibration trace is other
        # prompts of the same model, as a real calibration run would be
        for kind, shape, first in (("trace", TRACE_SHAPE, 0),
                                   ("calibration", CALIBRATION_SHAPE, TRACE_SHAPE["prompts"])):
            path = EXAMPLES / f"{name}-{kind}.parquet"
            args = ["synth", "--model", name, "--prompts", shape["prompts"], "--tokens",
                    shape["tokens"], "--seed", spec["seed"], "--first-prompt", first,
                    "--skew", p["skew"], "--reuse", reuse,
                    "--predictor-accuracy", params["predictor_accuracy"], "--description",
                    ("SYNTHETIC " + ("trace" if kind == "trace" else "calibration trace")
                     + ", skew and reuse calibrated on real routing data"),
                    "-o", path, "--force"]
            cope(args, bar)
            man.add(path, kind="SYNTHETIC " + ("trace" if kind == "trace"
                                               else "calibration trace"), model=name,
                    what=f"{shape['prompts']} prompts x {shape['tokens']} decode tokens; "
                         f"skew {p['skew']}, reuse {reuse}, predictor recall "
                         f"{params['predictor_accuracy']}",
                    commands=[_shown(args)], provenance=[src, ATTRIBUTION["reuse"]])
        path = EXAMPLES / f"{name}-{spec.get('label', spec['gpu'])}-analytic.parquet"
        args = ["profile", "--analytic", "--gpu", spec["gpu"], "--model", name, "-o", path,
                "--force"]
        cope(args, bar)
        man.add(path, kind="ANALYTIC profile", model=name,
                what=f"every cost from published {spec['gpu']} peak numbers with achieved "
                     "efficiencies and per-operation overheads, four of them fitted on the COPE "
                     "paper's A100 winners (cope_core/platforms.py, docs/design.md#overheads-"
                     "and-efficiencies); GPU shares 20/50/80/100 %; a what-if, not a measurement",
                commands=[_shown(args)],
                provenance=["vendor specifications; the COPE paper's Table 2 and Figure 2"])


def _shown(args: list) -> str:
    return "cope " + " ".join(shlex.quote(_rel(a) if isinstance(a, Path) else str(a))
                              for a in args)


# --- collected ----------------------------------------------------------------------------------
WORDS = ("the model routes every token to two of eight experts while a small router scores them "
         "and picks the best pair for each layer of the network").split()


def _tiny_model(folder: Path, seed: int) -> None:
    # MixtralConfig hidden 32, 6 layers, top-2 of 8, a word-level tokenizer over WORDS
    from cope_core.trace.sources.tiny_models import build_tiny_model
    build_tiny_model("mixtral", folder, layers=6, seed=seed, words=WORDS,
                     vocab_size=len(set(WORDS)) + 2, max_position_embeddings=512)


def step_collected(man: Manifest, bar: tqdm) -> None:
    COLLECTED.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    prompts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(24)]
    prompt_file = COLLECTED / "tiny-mixtral-prompts.txt"
    _write_text(prompt_file, "\n".join(prompts) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = tmp / "tiny-mixtral"
        _tiny_model(model_dir, seed=3)
        build = ("python3 scripts/make_data.py --only collected  (builds the random-weight "
                 "model: MixtralConfig hidden 32, 6 layers, top-2 of 8, torch seed 3)")
        common = ["--model", model_dir, "--prompts", prompt_file, "--max-new-tokens", 32,
                  "--ignore-eos", "--no-progress", "--name", "tiny-mixtral"]
        a1 = ["trace", "collect", *common, "--hidden-states", tmp / "hidden",
              "-o", tmp / "plain.parquet"]
        cope(a1, bar)
        pred = COLLECTED / "tiny-mixtral.predictor.safetensors"
        a2 = ["predictor", "train", "--hidden-states", tmp / "hidden", "--seed", 0, "--json",
              "-o", pred, "--force"]
        report = json.loads(cope(a2, bar))
        _write_text(COLLECTED / "tiny-mixtral-predictor-report.json",
                    json.dumps(report, indent=1) + "\n")
        trace = COLLECTED / "tiny-mixtral-trace.parquet"
        a3 = ["trace", "collect", *common, "--predictor", pred, "--description",
              "collected from a tiny RANDOM-WEIGHT Mixtral-style model (pipeline demo)",
              "-o", trace, "--force"]
        cope(a3, bar)
    cmds = [build, _shown(a1).replace(str(model_dir), "TINY_MODEL").replace(str(tmp), "TMP"),
            _shown(a2).replace(str(tmp), "TMP"),
            _shown(a3).replace(str(model_dir), "TINY_MODEL")]
    prov = ["made here; the model's weights are random, so its routing is not that of any "
            "trained model"]
    man.add(prompt_file, kind="prompts", what="24 seeded random word sequences (the tiny "
            "model's whole vocabulary)", commands=[build], provenance=prov)
    man.add(pred, kind="predictor", model="tiny-mixtral",
            what="next-layer expert predictor trained on the tiny model's hidden states "
                 "(held-out recall in tiny-mixtral-predictor-report.json)",
            commands=cmds[:3], provenance=prov)
    man.add(COLLECTED / "tiny-mixtral-predictor-report.json", kind="report",
            model="tiny-mixtral", what="`cope predictor train --json` output: held-out recall "
            "of the predictor and of the previous-token and popularity baselines",
            commands=cmds[:3], provenance=prov)
    man.add(trace, kind="COLLECTED trace", model="tiny-mixtral",
            what="24 prompts x 32 decode tokens, 6 MoE layers, top-2 of 8, with the "
                 "predictor's next-layer predictions", commands=cmds, provenance=prov)


# --- measured -----------------------------------------------------------------------------------
def step_measured(man: Manifest, bar: tqdm, keep_inputs: bool = False) -> None:
    """Make the measured example; ``keep_inputs`` keeps its trace, calibration and profile when
    they exist (their manifest entries stand) and measures, verifies and scores again."""
    from cope_core import parquet_io

    m = MEASURED
    stem = EXAMPLES / MEASURED_STEM
    trace, cal = Path(f"{stem}-trace.parquet"), Path(f"{stem}-calibration.parquet")
    prof = Path(f"{stem}-cpu-emulated-profile.parquet")
    meas = Path(f"{stem}-cpu-emulated-measurements.parquet")
    ver = Path(f"{stem}-cpu-emulated-verify.json")
    params = json.loads(PARAMS.read_text())
    p = params["models"][m["model"]]
    gen = ["--skew", p["skew"], "--reuse", params["reuse"]["value"], "--predictor-accuracy",
           params["predictor_accuracy"]]
    a_tr = ["synth", "--model", m["model"], "--layers", m["layers"], "--prompts", m["prompts"],
            "--tokens", m["tokens"], "--seed", 61, *gen, "--description",
            "SYNTHETIC trace of the measured example", "-o", trace, "--force"]
    a_cal = ["synth", "--model", m["model"], "--layers", m["layers"], "--prompts", 16,
             "--tokens", 128, "--seed", 61, "--first-prompt", m["prompts"], *gen, "--description",
             "SYNTHETIC calibration trace of the measured example", "-o", cal, "--force"]
    a_prof = ["profile", "--trace", trace, "--threads", m["threads"], "--contexts",
              "128,1024,4096", "--min-time", m["min_time"], "--no-progress", "-o", prof,
              "--force"]
    a_meas = ["measure", "--trace", trace, "--calibration", cal, "-K", m["ks"],
              "--threads", m["threads"], "--trials", m["trials"], "--profile", prof,
              "--no-progress", "-o", meas, "--force"]
    a_eval = ["evaluate", "--trace", trace, "--calibration", cal, "--profile", prof,
              "--measurements", meas, "--json"]
    a_ver = ["verify", "--trace", trace, "--calibration", cal, "--profile", prof, "-K", m["ks"],
             "--threads", m["threads"], "--no-progress", "-o", ver, "--force"]
    kept = keep_inputs and all(p.exists() for p in (trace, cal, prof))
    for a in ((a_meas, a_ver) if kept else (a_tr, a_cal, a_prof, a_meas, a_ver)):
        cope(a, bar)
    scores = json.loads(cope(a_eval, bar))
    ev = EXAMPLES.parent / f"{MEASURED_STEM}-evaluation.json"
    _write_text(ev, json.dumps(scores, indent=1) + "\n")
    plat = parquet_io.read_metadata(prof)["platform"]
    where = (f"{plat.get('cpu', '?')} ({plat.get('cpu_cores', '?')} cores), torch "
             f"{plat.get('torch', '?')}, emulated accelerator (a worker thread with its own "
             f"torch threads and slot memory), {time.strftime('%Y-%m-%d')}")
    gprov = [ATTRIBUTION["olmoe"] + " carried over by K/E", ATTRIBUTION["reuse"]]
    what = f"DeepSeek-V2-Lite geometry cut to {m['layers']} MoE layers (real expert shapes)"
    man.add(meas, kind="MEASUREMENTS", model=f"{m['model']} ({m['layers']} MoE layers)",
            what=f"measured TPOT of all 13 candidates per prompt at K = {m['ks']}, CPU threads "
                 f"{m['threads']}, {m['trials']} trial(s)",
            commands=[_shown(a_meas)], platform=where, provenance=["measured here"])
    man.add(ev, kind="report", model=f"{m['model']} ({m['layers']} MoE layers)",
            what="`cope evaluate --json` of the measured example: MAPE, Spearman, top-1/top-3 "
                 "for COPE, the atomic-op simulation and the roofline (HRM)",
            commands=[_shown(a_eval)], platform=where, provenance=["measured here"])
    man.add(ver, kind="VERIFY run", model=f"{m['model']} ({m['layers']} MoE layers)",
            what=f"`cope verify` at the measurements' cells (K = {m['ks']}, CPU threads "
                 f"{m['threads']}): the contenders raced in paired rounds, the verified winner",
            commands=[_shown(a_ver)], platform=where, provenance=["measured here"])
    if kept:
        return
    man.add(trace, kind="SYNTHETIC trace", model=f"{m['model']} ({m['layers']} MoE layers)",
            what=f"{what}; {m['prompts']} prompts x {m['tokens']} decode tokens",
            commands=[_shown(a_tr)], provenance=gprov)
    man.add(cal, kind="SYNTHETIC calibration trace",
            model=f"{m['model']} ({m['layers']} MoE layers)",
            what=f"{what}; 16 prompts x 128 tokens", commands=[_shown(a_cal)], provenance=gprov)
    man.add(prof, kind="MEASURED profile", model=f"{m['model']} ({m['layers']} MoE layers)",
            what=f"{what}; CPU threads {m['threads']}, contexts 128/1024/4096",
            commands=[_shown(a_prof)], platform=where, provenance=["measured here"])


def grid_args(out: Path) -> list[str]:
    g = GRID
    return ["benchmarks/fidelity_grid.py", str(out), "--model", g["model"], "--layers",
            str(g["layers"]), "-K", str(g["k"]), "--settings", g["settings"], "--threads",
            g["threads"], "--prompts", str(g["prompts"]), "--tokens", str(g["tokens"]),
            "--trials", str(g["trials"]), "--min-time", str(g["min_time"])]


def step_grid(man: Manifest, bar: tqdm, done: Path | None = None) -> None:
    """Run the grid in a scratch folder (or take a finished run's folder ``done``) and ship its
    traces, profiles, measurements and report under data/platforms/cpu-emulated-grid/."""
    import shutil
    import tempfile

    from cope_core import parquet_io
    args = grid_args(Path("OUT"))
    shown = "python3 " + " ".join(args).replace("OUT", "<scratch folder>")
    with tempfile.TemporaryDirectory() as tmp:
        src = done or Path(tmp)
        if done is None:
            bar.set_postfix_str("fidelity grid (about 33 min)")
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, *grid_args(src)], cwd=ROOT)
            if r.returncode:
                sys.exit(f"make_data: the grid failed ({r.returncode}): {shown}")
            bar.write(f"  [{time.perf_counter() - t0:6.1f} s] {shown}")
        GRID_DIR.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.iterdir()):
            if f.suffix in (".parquet", ".md") or f.name == "report.json":
                shutil.copyfile(f, GRID_DIR / f.name)
    g = GRID
    what = (f"{g['model']} cut to {g['layers']} MoE layers, K = {g['k']}, CPU threads "
            f"{g['threads']}, {g['prompts']} prompts x {g['tokens']} tokens, {g['trials']} trials")
    for f in sorted(GRID_DIR.iterdir()):
        if f.name.startswith("profile-") or f.name.startswith("measurements-"):
            plat = parquet_io.read_metadata(f)["platform"]
            where = (f"{plat.get('cpu', '?')} ({plat.get('cpu_cores', '?')} cores), "
                     f"{plat.get('link', '?')}, host {plat.get('cpu_slowdown', 1)}x slower, "
                     f"{time.strftime('%Y-%m-%d')}")
            kind = "MEASURED profile" if f.name.startswith("profile-") else "MEASUREMENTS"
            man.add(f, kind=kind, model=f"{g['model']} ({g['layers']} MoE layers)",
                    what=f"grid cell setting {f.stem.split('-', 1)[1]}; {what}",
                    commands=[shown], platform=where, provenance=["measured here"])
        elif f.name in ("trace.parquet", "calibration.parquet"):
            man.add(f, kind="SYNTHETIC " + ("trace" if f.name == "trace.parquet"
                                            else "calibration trace"),
                    model=f"{g['model']} ({g['layers']} MoE layers)",
                    what=f"the grid's {f.stem}", commands=[shown], provenance=["generated"])
        elif f.name in ("report.md", "report.json"):
            man.add(f, kind="report", model=f"{g['model']} ({g['layers']} MoE layers)",
                    what="the grid's report: per cell the measured winner and margin, each "
                         "estimator's pick, regret, tie-aware and strict top-1, MAPE; schedules "
                         "against their isolated-op composition; signed error by residency",
                    commands=[shown], provenance=["measured here"])


# --- readme -------------------------------------------------------------------------------------
def step_readme(man: Manifest, bar: tqdm) -> None:
    from make_data_readme import render  # the long template lives beside this script
    man.save()
    _write_text(DATA / "README.md", render(man.entries, DATA))
    bar.write(f"  wrote {_rel(DATA / 'README.md')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=STEPS, help="run only these steps")
    ap.add_argument("--realdata", type=Path, default=ROOT.parent / "shared" / "realdata",
                    help="folder of the real routing data (default ../shared/realdata)")
    ap.add_argument("--grid-from", type=Path, metavar="DIR",
                    help="the grid step ships this finished `benchmarks/fidelity_grid.py` "
                         "folder (run with the step's settings) instead of running the grid")
    ap.add_argument("--keep-inputs", action="store_true",
                    help="measured step: keep the example's trace, calibration and profile when "
                         "present; measure, verify and score again")
    a = ap.parse_args(argv)
    if a.grid_from is not None and not (a.grid_from / "report.json").is_file():
        ap.error(f"--grid-from {a.grid_from}: no report.json there; expected a finished "
                 "benchmarks/fidelity_grid.py folder")
    steps = [s for s in STEPS if not a.only or s in a.only]
    if "readme" not in steps:
        steps.append("readme")
    man = Manifest()
    t0 = time.perf_counter()
    with tqdm(steps, desc="make_data", unit="step") as bar:
        for step in bar:
            bar.write(f"== {step}")
            fn = globals()[f"step_{step}"]
            if step == "calibrate":
                fn(a.realdata, man, bar)
            elif step == "grid":
                fn(man, bar, a.grid_from)
            elif step == "measured":
                fn(man, bar, a.keep_inputs)
            else:
                fn(man, bar)
            man.save()
    total = sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file())
    print(f"done in {time.perf_counter() - t0:.0f} s; data/ holds {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
