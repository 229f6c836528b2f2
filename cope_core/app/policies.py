"""The export package's policy of a dataset at a budget, operating point, candidate, llama.cpp
build and request, and its llama.cpp record (Streamlit layer, cached per dataset and settings;
a shipped example's policy outlives the server: :mod:`.persisted`)."""
from __future__ import annotations

import warnings

import streamlit as st

from ..export import Policy, build_policy
from ..geometry import GIB
from ..llamacpp import LATEST_BUILD, CacheRecord, LlamaSettings, Request, parse_build
from . import persisted, whatif
from .dataset import Dataset


@st.cache_data(show_spinner=False, max_entries=64)
def _policy_cached(key: str, gib: float, op: tuple[int, float], candidate: str,
                   llamacpp: str, tokens: tuple[int, int] | None, ram_gib: float | None,
                   _ds: Dataset) -> Policy:
    # the sidebar's context reaches the memory model and llama.cpp's -c (whatif.vram_at_context)
    vram, ctx = whatif.vram_at_context(_ds.trace.model, gib, _ds.profile.platform)
    request = None if tokens is None else Request(*tokens)

    def build() -> Policy:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the fill warning is already shown on every page
            return build_policy(_ds.trace, _ds.profile, _ds.calibration, vram_gib=vram,
                                context=ctx, cpu_threads=int(op[0]), gpu_share=float(op[1]),
                                candidate=candidate,
                                llama=LlamaSettings(
                                    n_ctx=ctx if request is None else request.context_for(ctx),
                                    build=parse_build(llamacpp),
                                    host_ram_bytes=None if ram_gib is None else ram_gib * GIB),
                                request=request)
    # a shipped example's policy outlives the server (its llama.cpp search is the slowest step
    # of a first Policy Matrix or Export): never one of an upload or a chosen machine
    key_ = (gib, op, candidate, llamacpp, tokens) if ram_gib is None else \
        (gib, op, candidate, llamacpp, tokens, ram_gib)      # as before where RAM is not given
    return persisted.kept("policy", _ds, key_, build)


def policy_for(ds: Dataset, gib: float, op: tuple[int, float], candidate: str,
               llamacpp: str = LATEST_BUILD, request: Request | None = None,
               ram_gib: float | None = None) -> Policy:
    """The export package's policy of ``candidate`` (an id or ``"best"``) at the VRAM budget
    ``gib`` (K follows, as on every page) and the operating point ``op``, its llama.cpp answer
    for the build ``llamacpp`` (``--llamacpp``'s spellings), cached per dataset, budget,
    operating point, candidate, build and ``request`` (its llama.cpp answer ranked by the
    request's time; None: by decode alone) and the host memory ``ram_gib`` (with it the request's
    search prices ``--load-mode none``); with ``"best"`` its llama.cpp record is
    :func:`llamacpp_at`'s."""
    tokens = None if request is None else (request.prompt_tokens, request.gen_tokens)
    return _policy_cached(ds.key, float(gib), (int(op[0]), float(op[1])), candidate, llamacpp,
                          tokens, None if ram_gib is None else float(ram_gib), ds)


def llamacpp_at(ds: Dataset, gib: float, op: tuple[int, float], llamacpp: str = LATEST_BUILD,
                request: Request | None = None, ram_gib: float | None = None) -> CacheRecord:
    """llama.cpp's own MoE cache searched at the budget: the record of the policy
    :func:`policy_for` exports there (:func:`cope_core.export.build_policy` calls
    :func:`cope_core.llamacpp.answer.cache_record.llamacpp_record`, as ``cope predict`` and ``cope
    export`` do), so the Policy Matrix and the Export page show one search, computed once."""
    rec = policy_for(ds, gib, op, "best", llamacpp, request, ram_gib).llamacpp_cache
    assert rec is not None      # None is only a budget below K = 0's, which K refuses first
    return rec
