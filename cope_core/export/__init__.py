"""Export a chosen policy to the forms real runtimes take (the last stage of the pipeline).

The app's Export page and ``cope export`` call the same two functions::

    policy = build_policy(trace, profile, calibration, experts_per_layer=16, candidate="best")
    out = render(policy, "llama.cpp")      # Rendered: text, extra files, exact or not

``policy_json`` / ``write_policy`` / ``read_policy`` keep the ``cope.policy/1`` record, from
which every format renders again without the Parquet inputs.
"""
from __future__ import annotations

from ..errors import CopeInputError
from .build import build_policy
from .cache_runtimes import render_fastllm, render_freetoken
from .common import Rendered
from .exllamav3 import DEFAULT_STATS, render_exllamav3
from .ik_llamacpp import render_ik_llamacpp
from .ktransformers import render_ktransformers
from .llamacpp import render_llamacpp
from .policy import SCHEMA, Policy, policy_json, read_policy, write_policy
from .sglang_kt import DEFAULT_PT, render_sglang_kt
from .vllm import render_vllm

FORMATS: tuple[str, ...] = ("json", "llama.cpp", "ik_llama.cpp", "exllamav3", "ktransformers",
                             "sglang-kt", "vllm", "freetoken", "fastllm")
#: Formats that write a file beside their text, and its suffix (``cope export`` needs ``-o``).
FILE_SUFFIX = {"sglang-kt": ".pt", "exllamav3": ".json"}


def render(policy: Policy, fmt: str, *, strict: bool = False,
           pt_path: str = DEFAULT_PT, stats_path: str = DEFAULT_STATS,
           exl3_bits: float | None = None) -> Rendered:
    """Render ``policy`` for one runtime.

    Parameters
    ----------
    policy : Policy
    fmt : str
        One of :data:`FORMATS`.
    strict : bool
        Raise :class:`CopeInputError` when the runtime cannot run exactly the chosen candidate,
        instead of rendering the nearest policy it can run.
    pt_path : str
        For ``sglang-kt``: the path the flags give for the expert-location tensor (its bytes are
        in ``Rendered.files`` under that name).
    stats_path, exl3_bits : str, float
        For ``exllamav3``: the path of the expert-statistics JSON the environment names (in
        ``Rendered.files``), and the model's bits per weight for its memory note (None: not
        sized).

    Returns
    -------
    Rendered
        ``exact`` False means the text deploys ``deployed`` (or, for vLLM, a setting outside
        the Policy Matrix) and ``summary`` says what the runtime cannot express.
    """
    if fmt == "json":
        out = Rendered("json", policy_json(policy))
    elif fmt == "llama.cpp":
        out = render_llamacpp(policy)
    elif fmt == "ik_llama.cpp":
        out = render_ik_llamacpp(policy)
    elif fmt == "exllamav3":
        out = render_exllamav3(policy, stats_path, exl3_bits)
    elif fmt == "ktransformers":
        out = render_ktransformers(policy)
    elif fmt == "sglang-kt":
        out = render_sglang_kt(policy, pt_path)
    elif fmt == "vllm":
        out = render_vllm(policy)
    elif fmt == "freetoken":
        out = render_freetoken(policy)
    elif fmt == "fastllm":
        out = render_fastllm(policy)
    else:
        raise CopeInputError(f"unknown format {fmt!r}; expected one of {list(FORMATS)}",
                             field="format")
    if strict and not out.exact:
        raise CopeInputError(f"{out.summary} (--strict)", field="format")
    return out


__all__ = ["DEFAULT_PT", "DEFAULT_STATS", "FILE_SUFFIX", "FORMATS", "SCHEMA", "Policy", "Rendered",
           "build_policy", "policy_json", "read_policy", "render", "write_policy"]
