"""HRM with the shipped profiles' probed peaks against the fixed probe's (decode-shape FLOP/s),
on the shipped measured example and each setting of the controlled grid: the roofline's
predicted/measured ratio (median over pairs) and MAPE. The fixed probe runs here, on this
machine, at each setting's paced link and host speed.

    python benchmarks/probe_hrm.py
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from cope_core import parquet_io
from cope_core.estimate.evaluate import evaluation_pairs
from cope_core.mechanisms import Accelerator
from cope_core.mechanisms.probe import probe_platform

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "data" / "examples"
GRID = ROOT / "data" / "platforms" / "cpu-emulated-grid"
CASES = [("measured example", EX / "deepseek-v2-lite-4l-trace.parquet",
          EX / "deepseek-v2-lite-4l-calibration.parquet",
          EX / "deepseek-v2-lite-4l-cpu-emulated-profile.parquet",
          EX / "deepseek-v2-lite-4l-cpu-emulated-measurements.parquet", None, 1.0)]
CASES += [(f"grid {t}", GRID / "trace.parquet", GRID / "calibration.parquet",
           GRID / f"profile-{t}.parquet", GRID / f"measurements-{t}.parquet", link, slow)
          for t, link, slow in (("link-unpaced-slow-4", None, 4.0), ("link-4-slow-2", 4.0, 2.0),
                                ("link-1-slow-1", 1.0, 1.0))]


def main() -> None:
    warnings.simplefilter("ignore")
    for name, trace, cal, prof, meas, link, slow in CASES:
        tr, c = parquet_io.read_trace(trace), parquet_io.read_trace(cal)
        p, m = parquet_io.read_profile(prof), parquet_io.read_measurements(meas)
        with Accelerator("cpu", link_gbps=link, cpu_slowdown=slow) as acc:
            spec = probe_platform(acc, torch.bfloat16, tr.model.hidden)
        for label, sp in (("shipped probe", None), ("fixed probe", spec)):
            pr = evaluation_pairs(tr, p, m, c, estimators=["hrm"], spec=sp, draws=0)["hrm"]
            r = pr.predicted_us / pr.measured_us
            print(f"{name:<28} {label:<14} pred/meas median {r.median():.3f}  "
                  f"MAPE {(abs(r - 1)).mean() * 100:.1f} %", flush=True)


if __name__ == "__main__":
    main()
