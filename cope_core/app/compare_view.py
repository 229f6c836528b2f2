"""The Compare page's pure logic: which platforms can be chosen, the custom platform's spec,
building the platforms for :func:`cope_core.estimate.compare.compare`, and the table shown."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..errors import CopeInputError
from ..estimate.compare import Comparison, Platform, catalog_platform, spec_platform
from ..estimate.speed import tokens_per_s
from ..platforms import CPUS, DEFAULT_CPU, GPUS, LINKS, PlatformSpec, platform_spec
from ..profile.data import Profile

THIS, CUSTOM = "this", "custom"
#: The custom platform's fields and defaults: an RTX 4090-like card on PCIe 4. Its CPU threads
#: are the operating point's, as for every platform of the comparison (a field of its own
#: changed nothing: `compare` prices every platform at one thread count).
CUSTOM_FIELDS = ("gpu_tflops", "gpu_gbs", "vram_gib", "link_gbs", "cpu_gbs")
CUSTOM_DEFAULT = (165.2, 1008.0, 24.0, 31.5, 150.0)
#: Help for each field, shown by the inputs.
CUSTOM_HELP = {"gpu_tflops": "GPU peak TFLOP/s at the profile's dtype",
               "gpu_gbs": "GPU memory bandwidth, GB/s", "vram_gib": "GPU memory, GiB",
               "link_gbs": "host-to-device link, GB/s (PCIe 4 x16: 31.5)",
               "cpu_gbs": "host memory bandwidth, GB/s (the CPU threads are the operating "
                          "point's)"}
#: The smallest number the custom platform's inputs take.
CUSTOM_MIN = 0.01
MAX_PLATFORMS = 4


def catalog_names() -> list[str]:
    """Every GPU x link x CPU of the spec table, as ``gpu+link+cpu``."""
    return [f"{g}+{lk}+{c}" for g in GPUS for lk in LINKS for c in CPUS]


def options(profile: Profile) -> list[str]:
    """The choices: this dataset's profile, the custom platform, then the spec table."""
    return [THIS, CUSTOM, *catalog_names()]


def label(name: str, profile: Profile) -> str:
    if name == THIS:
        plat = profile.platform or {}
        if "machine" in plat:          # chosen in the sidebar's "Your machine"
            return f"your machine (ANALYTIC, {plat['machine']})"
        kind = "analytic" if profile.analytic else "measured"
        return f"this profile ({kind}, {plat.get('gpu', '?')})"
    if name == CUSTOM:
        return "custom platform"
    return name


def default_choice(profile: Profile) -> list[str]:
    """This profile and one faster GPU of the table."""
    gpu = str((profile.platform or {}).get("gpu", "")).lower()
    other = "h100" if gpu != "h100" else "h200"
    return [THIS, f"{other}+{GPUS[other].default_link}+{DEFAULT_CPU}"]


def parse_custom(text: str) -> tuple[float, ...]:
    """``"TFLOPS,GBS,VRAM,LINK,CPUGBS"`` (the URL's ``custom``) -> five finite numbers of at
    least :data:`CUSTOM_MIN`; ValueError otherwise. A link made when the custom platform also
    had CPU threads (six numbers, the fifth the threads) is read without them."""
    vals = tuple(float(x) for x in text.split(","))
    if len(vals) == len(CUSTOM_FIELDS) + 1:
        vals = vals[:4] + vals[5:]
    if len(vals) != len(CUSTOM_FIELDS) or not all(np.isfinite(vals)) or min(vals) < CUSTOM_MIN:
        raise ValueError(text)
    return vals


def format_custom(values: Sequence[float]) -> str:
    return ",".join(f"{float(v):g}" for v in values)


def custom_spec(values: Sequence[float], threads: int = 16) -> tuple[PlatformSpec, float]:
    """The custom platform with ``threads`` CPU threads: its spec (efficiencies and overheads
    at the table's defaults, the CPU's per-thread bandwidth as the default CPU's) and its VRAM
    in GiB."""
    tflops, gbs, vram, link, cpu_gbs = (float(v) for v in values)
    base = platform_spec("rtx4090")
    cpu = CPUS[DEFAULT_CPU]
    spec = PlatformSpec(name="custom", gpu_name="custom", gpu_flops=tflops * 1e12,
                        gpu_bandwidth=gbs * 1e9, link_name="custom", link_bandwidth=link * 1e9,
                        cpu_name="custom", cpu_cores=max(int(threads), 1),
                        cpu_flops_per_thread=cpu.flops_per_thread, cpu_bandwidth=cpu_gbs * 1e9,
                        cpu_bandwidth_per_thread=cpu.bandwidth_per_thread, source="user",
                        **{f: getattr(base, f) for f in ("gpu_launch_us", "gpu_sync_us",
                                                         "link_latency_us", "cpu_dispatch_us",
                                                         "link_efficiency", "gpu_efficiency",
                                                         "cpu_efficiency")})
    return spec, vram


def build(names: Sequence[str], profile: Profile, custom: Sequence[float],
          op: tuple[int, float]) -> list[Platform]:
    """The chosen platforms, analytic ones for ``profile``'s model at the operating point."""
    g = profile.model
    out = []
    for name in names:
        if name == THIS:
            plat = profile.platform or {}
            gpu = str(plat.get("gpu", "")).lower()
            vram = plat.get("vram_gib") or (GPUS[gpu].vram_bytes / 2**30 if gpu in GPUS
                                            else None)      # "Your machine": its card's memory
            out.append(Platform(label(THIS, profile), profile, vram))
        elif name == CUSTOM:
            spec, vram = custom_spec(custom, op[0])
            out.append(spec_platform(g, spec, vram, cpu_threads=op[0], gpu_share=op[1],
                                     label="custom platform"))
        elif name in catalog_names():
            out.append(catalog_platform(g, name, cpu_threads=op[0], gpu_share=op[1]))
        else:
            raise CopeInputError(f"unknown platform {name!r}", field="plat")
    return out


def table(cmp: Comparison) -> pd.DataFrame:
    """The comparison at the budget, as the page shows it."""
    a = cmp.at_budget
    return pd.DataFrame({
        "platform": a["platform"], "kind": np.where(a["analytic"], "ANALYTIC", "MEASURED"),
        "budget GiB": a["budget_gib"], "K": a["experts_per_layer"], "winner": a["winner"],
        "TPOT ms": a["tpot_us"] / 1e3, "tokens/s": [tokens_per_s(x) for x in a["tpot_us"]],
        "95 % interval ms": [f"[{lo / 1e3:.3f}, {hi / 1e3:.3f}]" if np.isfinite(lo) else ""
                             for lo, hi in zip(a["tpot_lo_us"], a["tpot_hi_us"])],
        "win probability": a["win_probability"], "speed-up": a["speedup"],
        "layer partition ms": a["layer_partition_us"] / 1e3})
