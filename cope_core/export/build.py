"""Build a :class:`Policy` from the pipeline's inputs: predict, choose, record the fill."""
from __future__ import annotations

import math
import warnings
from datetime import UTC, datetime

from ..errors import CopeInputError
from ..estimate.costs import ESTIMATORS, hrm_spec
from ..estimate.predict import OptimisticPredictionWarning, price, replay_counts
from ..estimate.ranking import fastest_first
from ..files import describe_input
from ..geometry import DEFAULT_CONTEXT, DEFAULT_WORKSPACE_BYTES, GIB
from ..llamacpp import LlamaSettings, Request, llamacpp_record
from ..matrix import get_candidate
from ..platforms import PlatformSpec
from ..profile.data import Profile
from ..profile.pricing import check_compatible
from ..replay.engine import check_ks
from ..trace.data import Trace, fill_order
from ..version import __version__
from .policy import Policy

TOOL = "cope-explorer"


def build_policy(trace: Trace, profile: Profile, calibration: Trace | None = None, *,
                 experts_per_layer: int | None = None, vram_gib: float | None = None,
                 cpu_threads: int | None = None, gpu_share: float | None = None,
                 candidate: str = "best",
                 fill_by_id: bool = False, spec: PlatformSpec | None = None,
                 created: str | None = None, verified: dict | None = None,
                 llamacpp: bool = True, llama: LlamaSettings | None = None,
                 context: int = DEFAULT_CONTEXT, request: Request | None = None) -> Policy:
    """Predict every candidate at one cache size and record the chosen one as a policy.

    Parameters
    ----------
    trace, profile, calibration
        As for :func:`cope_core.estimate.predict.predict`; the calibration trace's popularity
        sets the resident experts (without it, the evaluated trace's, with a warning).
    experts_per_layer : int, optional
        ``K``; give exactly one of it and ``vram_gib``.
    vram_gib : float, optional
        VRAM budget in GiB; ``K`` follows from the memory model
        (docs/design.md#model-geometry-and-memory).
    cpu_threads : int, optional
        Operating point (default: the profile's most threads).
    gpu_share : float, optional
        GPU share of the operating point (default: the largest measured at ``cpu_threads``).
    candidate : str
        A candidate id, or ``"best"`` for COPE's predicted winner.
    fill_by_id : bool
        Fill by expert id instead of popularity.
    spec : PlatformSpec, optional
        Peak numbers for the roofline estimator; default: the profile's ``platform.spec``.
        Without either, HRM is skipped and the reason recorded.
    created : str, optional
        ISO time for the provenance (default: now, UTC).
    verified : dict, optional
        The ``cope verify`` cell that measured ``candidate`` the winner (with its record's path
        and digest): the policy is ``chosen_by`` ``verified`` and keeps it in
        ``provenance.verify``.
    llamacpp : bool
        Also search llama.cpp's own MoE expert cache at the same VRAM (``--n-cpu-moe`` x
        ``--moe-cache-mib`` x ``--moe-cache-cpu-share``) for the llama.cpp format to lead with.
    llama : LlamaSettings, optional
        The model file, context, KV cache types and --fit margin llama.cpp runs with (its
        memory, and its default ``--fit`` placement compared; default: ``context`` tokens,
        f16).
    context : int
        Tokens of KV cache the memory model holds beside the experts: ``K`` follows from
        ``vram_gib`` at this context, and llama.cpp runs with ``-c`` = it unless ``llama`` says.
    request : Request, optional
        A prompt and answer llama.cpp's record prices at each ``-ub`` beside the placement (an
        analytic profile's peaks price the prompt; :mod:`cope_core.llamacpp.answer.request`).

    Returns
    -------
    Policy
    """
    g = trace.model
    if (experts_per_layer is None) == (vram_gib is None):
        raise CopeInputError("give exactly one of experts per layer (K) and a VRAM budget",
                             field="experts_per_layer")
    if vram_gib is not None:
        if isinstance(vram_gib, bool) or not isinstance(vram_gib, (int, float)) \
                or not math.isfinite(vram_gib):
            raise CopeInputError(f"expected a finite size in GiB, got {vram_gib!r}",
                                 field="vram_gib")
        K = g.experts_per_layer_for_vram(vram_gib * GIB, context=context)
    else:
        assert experts_per_layer is not None      # exactly one of the two, checked above
        if isinstance(experts_per_layer, bool):
            raise CopeInputError(f"expected a whole number, got {experts_per_layer!r}",
                                 field="experts_per_layer")
        K = int(check_ks(experts_per_layer, g.n_experts)[0])
    chosen = None if candidate == "best" else get_candidate(candidate).id

    tables: dict[str, dict[str, float] | None] = {}
    confidence: dict = {}
    equivalent: dict[str, str | None] = {}
    notes: dict[str, str] = {}
    attrs: dict = {}
    spec, why = hrm_spec(profile, spec)     # a broken spec costs the baseline, not the export
    if why is not None:
        notes["hrm"] = f"skipped: {why}"
    check_compatible(trace, profile, calibration)
    counts = replay_counts(trace, calibration, K, fill_by_id=fill_by_id)  # once for all three
    for est in ESTIMATORS:
        if est == "hrm" and spec is None:
            tables[est] = None
            continue
        with warnings.catch_warnings():
            if est != "cope":  # the fill warning is the same for every estimator: say it once
                warnings.simplefilter("ignore", OptimisticPredictionWarning)
            df = price(trace, profile, counts, K, cpu_threads=cpu_threads, gpu_share=gpu_share,
                       estimator=est, spec=spec,
                       calibrated=calibration is not None or fill_by_id)
        tables[est] = {row.candidate: float(row.tpot_us) for row in df.itertuples(index=False)}
        attrs = attrs or dict(df.attrs)
        if est == "cope":
            confidence = _confidence(df)
            equivalent = {r.candidate: r.equivalent_to if isinstance(r.equivalent_to, str)
                          else None for r in df.itertuples(index=False)}
    if chosen is None:
        cope = tables["cope"]
        assert cope is not None                   # COPE always runs
        chosen = fastest_first(cope)[0]

    cache = None
    if llamacpp:
        matrix_winner = fastest_first(tables["cope"] or {})[0]
        cache = llamacpp_record(trace, profile, calibration, experts_per_layer=K,
                                vram_gib=vram_gib, matrix_winner=matrix_winner,
                                cpu_threads=attrs["cpu_threads"], gpu_share=attrs["gpu_share"],
                                counts=counts,
                                llama=llama if llama is not None else LlamaSettings(n_ctx=context),
                                request=request)
    order = fill_order(calibration if calibration is not None else trace, by_id=fill_by_id)
    resident = tuple(tuple(int(e) for e in row[:K]) for row in order)
    vram = {"budget_gib": None if vram_gib is None else float(vram_gib),
            "needed_gib": g.vram_for_experts_per_layer(K, context=context) / GIB,
            "context": int(context), "workspace_gib": DEFAULT_WORKSPACE_BYTES / GIB}
    inputs = {role: describe_input(obj) for role, obj in
              (("trace", trace), ("calibration", calibration), ("profile", profile))}
    return Policy(
        model=g, candidate=chosen, experts_per_layer=K, resident_experts=resident,
        predictions_us=tables, platform=dict(profile.platform or {}),
        cpu_threads=int(attrs["cpu_threads"]), gpu_share=float(attrs["gpu_share"]), vram=vram,
        chosen_by="verified" if verified else "best" if candidate == "best" else "user",
        fill={"source": "calibration" if calibration is not None else "trace", "by_id": fill_by_id},
        analytic_profile=bool(profile.analytic), estimator_notes=notes,
        trace={"source": trace.source, "prompts": trace.n_prompts, "tokens": trace.n_tokens},
        provenance={"inputs": inputs, "tool": TOOL, "version": __version__,
                    "created": created or datetime.now(UTC).isoformat(timespec="seconds"),
                    **({"verify": verified} if verified else {})},
        confidence=confidence, equivalent_to=equivalent, llamacpp_cache=cache,
    )


def _confidence(df) -> dict:
    """The cope.policy/1 ``confidence`` of COPE's prediction frame at one K."""
    u = df.attrs.get("uncertainty", {})
    if not u.get("draws"):
        return {"draws": 0}
    conf = next(iter(u["per_k"].values()))
    rows = list(df.itertuples(index=False))
    return {"draws": u["draws"], "seed": u["seed"], "level": u["level"],
            "sources": list(u["sources"]), "profile_spread": u["profile_spread"],
            "tpot_ci_us": {r.candidate: [float(r.tpot_lo_us), float(r.tpot_hi_us)]
                           if math.isfinite(r.tpot_lo_us) else None for r in rows},
            "win_probability": {r.candidate: float(r.win_probability)
                                if math.isfinite(r.win_probability) else None for r in rows},
            "prompts_for_confidence": conf["prompts_for_confidence"]}
