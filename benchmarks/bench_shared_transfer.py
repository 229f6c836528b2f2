"""Profile a cut, predict the whole model: does per-part shared work transfer across layer counts?

For one geometry: profile a cut of it (``--cut`` MoE layers) and the full model (``--full``), time
one whole token of shared work on the full model directly, and measure a full-model trace with
the reference executor (``cope measure``). Then both profiles predict that trace and are scored
against the measurement (``cope evaluate``'s path): the cut's profile must do as well as the full
model's own. Reported: predicted vs measured shared work per token, the MAPE of every candidate's
TPOT, top-1 agreement, and each profile's profiling time.

Run (the emulated accelerator on this machine's CPU; about 10 minutes at the default size):
``python benchmarks/bench_shared_transfer.py [--model deepseek-v2-lite] [--cut 2] [--full 8]
[--json OUT]``.

Until 2026-12-02 tests/test_shared_parts.py ran this on a small geometry (6 MoE layers, hidden
1024, one dense block, a shared expert; a 2-layer cut) and asserted the cut's shared work within
30 % of the full profile's. On the Intel Xeon VM five repeats gave -1.5..+7.2 %; on this round's
AMD EPYC VM a CI run gave +32.3 %, +36.0 % and (third attempt) a shared error 15 points worse
than the full profile's, three attempts in a row, while runs in the development environment
passed — not noise alone, and not explained yet; the test was removed from the suite and the
finding left for an issue. Issue 42 found it (docs/design.md#a-busy-machine): the cut and the full
model are profiled in different minutes, and on a busy machine the profiler's threads spent most
of a shared sample waiting for a CPU; ``cope profile`` now meters that and refuses such a profile
(benchmarks/bench_busy_profile.py).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from cope_core.estimate.evaluate import evaluate
from cope_core.executor.run import ExecutorSettings, measure
from cope_core.geometry import ModelGeometry, get_model
from cope_core.mechanisms import Accelerator, StopRule, host_threads
from cope_core.mechanisms.weights import model_dtype
from cope_core.profile.measure import Bench, ProfilerSettings, measure_profile, profiler_rig
from cope_core.trace.synth import synthesize


@dataclass
class Transfer:
    geometry: str
    cut: int
    full: int
    profile_seconds: dict[str, float]
    shared_predicted_us: dict[str, float]
    shared_measured_us: float
    mape_pct: dict[str, float]
    top1: dict[str, list[int]]
    measure_seconds: float

    def lines(self) -> list[str]:
        out = [f"{self.geometry}: profile a {self.cut}-MoE-layer cut, predict the "
               f"{self.full}-layer model (measured: {self.shared_measured_us / 1e3:.3f} ms of "
               f"shared work per token; cope measure {self.measure_seconds:.0f} s)",
               f"  {'profile':<22} {'profiling':>9} {'shared/token':>13} {'shared err':>10} "
               f"{'TPOT MAPE':>9} {'top-1':>6}"]
        for name in self.mape_pct:
            sh = self.shared_predicted_us[name]
            err = 100 * (sh - self.shared_measured_us) / self.shared_measured_us
            t1 = self.top1[name]
            out.append(f"  {name:<22} {self.profile_seconds[name]:8.0f}s {sh / 1e3:10.3f} ms "
                       f"{err:+9.1f}% {self.mape_pct[name]:8.2f}% {t1[0]:>3}/{t1[1]}")
        return out


def whole_token_us(g: ModelGeometry, context: int, rule: StopRule, threads: int,
                   seed: int = 0) -> float:
    """Median of one whole token of shared work of ``g`` at ``context``, timed directly."""
    with host_threads(threads), Accelerator("cpu", 1) as acc:
        rig = profiler_rig(acc, g, model_dtype(g, None), context, seed)
        from cope_core.mechanisms.timing import until_stable
        return until_stable(Bench(rig).shared(context), rule).median_us


def transfer(g: ModelGeometry, cut: int, full: int, *, prompts: int, tokens: int, K: int,
             candidates: list[str] | None, trials: int, settings: ProfilerSettings,
             shared_rule: StopRule, seed: int = 1) -> Transfer:
    big = g.with_layers(full)
    trace = synthesize(big, prompts=prompts, tokens=tokens, seed=seed, skew=0.7, reuse=0.2,
                       prompt_context=(64, 256))
    cal = synthesize(big, prompts=4, tokens=32, seed=seed, skew=0.7, reuse=0.2,
                     first_prompt=prompts)
    profiles, seconds = {}, {}
    for name, layers in ((f"cut ({cut} MoE layers)", cut), (f"full ({full} MoE layers)", full)):
        prof, _, secs = measure_profile(g.with_layers(layers), settings, progress=False)
        profiles[name], seconds[name] = prof, secs
    t0 = time.perf_counter()
    meas = measure(trace, K, calibration=cal, cpu_threads=settings.cpu_threads or (1,),
                   candidates=candidates, settings=ExecutorSettings(trials=trials),
                   progress=False)
    measure_seconds = time.perf_counter() - t0
    ctx = int(np.median(trace.context))
    shared_measured = whole_token_us(big, ctx, shared_rule, (settings.cpu_threads or (1,))[0])
    mape, top1, shared = {}, {}, {}
    for name, prof in profiles.items():
        ev = evaluate(trace, prof, meas, cal, estimators=["cope"], draws=0)["cope"]
        mape[name] = ev.accuracy.mape_pct
        top1[name] = list(ev.accuracy.top1)
        shared[name] = float(prof.resolve(model=big).shared_at([ctx])[0])
    return Transfer(big.name, cut, full, seconds, shared, shared_measured, mape, top1,
                    measure_seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v2-lite")
    ap.add_argument("--cut", type=int, default=2)
    ap.add_argument("--full", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("-K", type=int, default=16)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    settings = ProfilerSettings(cpu_threads=(2,), contexts=(64, 256))
    res = transfer(get_model(args.model), args.cut, args.full, prompts=args.prompts,
                   tokens=args.tokens, K=args.K, candidates=None, trials=args.trials,
                   settings=settings, shared_rule=settings.shared_rule)
    print("\n".join(res.lines()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res.__dict__, fh, indent=2)


if __name__ == "__main__":
    main()
