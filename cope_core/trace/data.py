"""The in-memory routing trace (docs/formats.md#routing-trace-copetrace1) as dense arrays the
replay kernels read directly, its popularity and the fill order (docs/design.md#routing-traces)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import CopeInputError
from ..geometry import ModelGeometry

#: The schema id of a trace file (docs/formats.md); :mod:`cope_core.parquet_io` reads it here.
TRACE_SCHEMA = "cope.trace/1"
SOURCES = ("collected", "synthetic", "imported")


@dataclass(frozen=True, eq=False)
class Trace:
    """A routing trace of ``P`` prompts and ``N`` decode tokens in all.

    Attributes
    ----------
    model : ModelGeometry
        Geometry of the traced model.
    prompt_ids : ndarray of int32, shape (P,)
        Prompt ids in file order.
    prompt_start : ndarray of int64, shape (P + 1,)
        Token offsets: prompt ``i`` owns rows ``prompt_start[i]:prompt_start[i+1]``.
    context : ndarray of int32, shape (N,)
        KV-cache length when each token is decoded.
    routed : ndarray of int16, shape (N, L, top_k)
        Routed expert ids, best score first.
    predicted : ndarray of int16, shape (N, L, W)
        Ranked ids predicted for layer ``l + 1`` at layer ``l``, padded with -1 (``W`` may be 0).
    source : str
        ``collected``, ``synthetic`` or ``imported``.
    description : str
        Free text shown with the trace.
    predictor : dict or None
        Metadata of the predictor that filled ``predicted``.
    path : str or None
        File it was read from, for messages.
    """

    model: ModelGeometry
    prompt_ids: np.ndarray
    prompt_start: np.ndarray
    context: np.ndarray
    routed: np.ndarray
    predicted: np.ndarray
    source: str = "synthetic"
    description: str = ""
    predictor: dict[str, Any] | None = None
    path: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.validate()

    def with_model(self, g: ModelGeometry, source: str | None = None) -> Trace:
        """The same routing priced as model ``g`` (e.g. the quantised file the user runs): the
        routing shape (MoE layers, experts, top-k) must agree."""
        for key in ("n_layers", "n_experts", "top_k"):
            a, b = getattr(self.model, key), getattr(g, key)
            if a != b:
                raise CopeInputError(f"the trace routes with {key}={a} but the model has {b}",
                                     source=source or self.path, field=f"model.{key}")
        return dataclasses.replace(self, model=g)

    @property
    def n_prompts(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.routed.shape[0])

    @property
    def tokens_per_prompt(self) -> np.ndarray:
        return np.diff(self.prompt_start)

    @property
    def has_predictions(self) -> bool:
        return bool(self.predicted.shape[2] > 0 and (self.predicted[:, :-1, 0] >= 0).any())

    @cached_property
    def popularity(self) -> np.ndarray:
        """``counts[l, e]``: tokens whose routed set at layer ``l`` contains ``e`` (computed once;
        the arrays of a trace are never modified)."""
        from ._kernels import popularity_counts  # numba loads with the first kernel (validate)
        counts = popularity_counts(self.routed, self.model.n_experts)
        counts.flags.writeable = False
        return counts

    def metadata(self) -> dict[str, Any]:
        return {"schema": TRACE_SCHEMA, "model": self.model.to_dict(), "source": self.source,
                "description": self.description, "predictor": self.predictor}

    def validate(self) -> None:
        """Check array shapes, dtypes and id contracts; raise CopeInputError naming the problem."""
        # numba (about 0.3 s) loads with the first kernel, not with the package: a server
        # answering from its disk cache (cope_core/app/persisted.py) runs none
        from ._kernels import DUPLICATE, LAST_LAYER, OUT_OF_RANGE, PAD_INSIDE, first_list_problem
        src, g = self.path, self.model
        L, E, k = g.n_layers, g.n_experts, g.top_k
        if self.source not in SOURCES:
            raise CopeInputError(f"got {self.source!r}, expected one of {list(SOURCES)}",
                                 source=src, field="source")
        r = self.routed
        if r.dtype != np.int16 or r.ndim != 3 or r.shape[1:] != (L, k):
            raise CopeInputError(f"expected int16 array [tokens, {L}, {k}], got {r.dtype} "
                                 f"{r.shape}", source=src, field="routed")
        n = r.shape[0]
        if n == 0:
            raise CopeInputError("the trace has no decode tokens", source=src, field="routed")
        ps = self.prompt_start
        if (ps.ndim != 1 or ps.shape[0] != self.prompt_ids.shape[0] + 1 or ps[0] != 0
                or ps[-1] != n or (np.diff(ps) <= 0).any()):
            raise CopeInputError("prompt offsets must start at 0, grow strictly and end at the "
                                 "token count", source=src, field="prompt")
        if len(np.unique(self.prompt_ids)) != len(self.prompt_ids):
            raise CopeInputError("prompt ids must be unique", source=src, field="prompt")
        if self.context.shape != (n,) or (self.context < 0).any():
            raise CopeInputError("expected one non-negative context per token", source=src,
                                 field="context")
        found = first_list_problem(r, E, padded=False)
        if found[OUT_OF_RANGE] >= 0 or found[DUPLICATE] >= 0:
            dup = found[OUT_OF_RANGE] < 0
            t, l = divmod(int(found[DUPLICATE if dup else OUT_OF_RANGE]), L)
            ids = r[t, l].tolist()
            if dup:
                raise CopeInputError(f"token row {t} layer {l}: duplicated ids {ids}, expected "
                                     f"{k} distinct", source=src, field="routed")
            bad = next(v for v in ids if not 0 <= v < E)
            raise CopeInputError(f"token row {t} layer {l}: id {bad} out of range, expected "
                                 f"0..{E - 1}", source=src, field="routed")
        p = self.predicted
        if p.dtype != np.int16 or p.ndim != 3 or p.shape[:2] != (n, L):
            raise CopeInputError(f"expected int16 array [tokens, {L}, W], got {p.dtype} {p.shape}",
                                 source=src, field="predicted")
        if p.shape[2]:
            found = first_list_problem(p, E, padded=True, last_empty=True)
            for kind, says in ((OUT_OF_RANGE, f"ids must be in 0..{E - 1}"),
                               (LAST_LAYER, "must be empty at the last layer"),
                               (PAD_INSIDE, "padding (-1) inside a ranked list"),
                               (DUPLICATE, "duplicated ids in a ranked list")):
                if found[kind] >= 0:
                    raise CopeInputError(says, source=src, field="predicted")


def fill_order(calibration: Trace, *, by_id: bool = False) -> np.ndarray:
    """``order[l, r]``: the expert of popularity rank ``r`` at layer ``l`` in ``calibration``
    (descending :attr:`Trace.popularity`, ties to the lower id), or simply ``r`` when filling by
    expert id. Every residency's initial fill is the first ``K`` of each row."""
    L, E = calibration.model.n_layers, calibration.model.n_experts
    if by_id:
        return np.tile(np.arange(E, dtype=np.int32), (L, 1))
    # stable argsort of -count keeps lower ids first among equal counts
    return np.argsort(-calibration.popularity, axis=1, kind="stable").astype(np.int32)
