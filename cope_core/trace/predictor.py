"""Next-layer expert prediction: hidden-state files, a small MLP per layer pair, two baselines.

The predictor maps MoE layer ``l``'s input hidden state (what layer ``l``'s router sees) to the
experts layer ``l + 1`` will route to, so a runtime can prefetch them one layer ahead (the
``predicted`` column of ``cope.trace/1``). It is trained on prompts held apart from the ones it
is judged on, and judged against two predictions that need no hidden states:

``previous-token``
    layer ``l + 1``'s experts of the previous token of the same prompt (the first token of a
    prompt, which has none, falls back to ``popularity``);
``popularity``
    the most frequently routed experts of layer ``l + 1`` (in the training prompts, or the
    calibration trace).

Hidden-state folder (``cope.hidden/1``, written by ``cope trace collect --hidden-states DIR``)
-------------------------------------------------------------------------------------------
``DIR/index.json``
    ``{"format": "cope.hidden/1", "model": {geometry}, "dtype": "float16"|"float32",
    "hidden": H, "shards": [{"file": "shard-000000.npz", "tokens": n}, ...]}``
``DIR/shard-NNNNNN.npz`` (plain ``numpy.savez``, read with ``allow_pickle=False``)
    ``hidden`` [n, L, H] MoE-layer inputs, ``routed`` [n, L, top_k] int16, ``prompt`` [n] int32
    and ``token`` [n] int32; rows are decode tokens in collection order.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import CopeInputError
from ..files import atomic_folder, atomic_path
from ..geometry import ModelGeometry
from .data import Trace

HIDDEN_FORMAT = "cope.hidden/1"
PREDICTOR_FORMAT = "cope.predictor/1"
METHODS = ("previous-token", "popularity")


class _Aborted(Exception):
    """Passed to the folder's context on :meth:`HiddenStateWriter.abort`."""


# --- hidden-state folders -----------------------------------------------------------------------
class HiddenStateWriter:
    """Stream per-token hidden states to a ``cope.hidden/1`` folder in shards of ``chunk`` tokens.

    The folder is built under a temporary name and renamed into place by :meth:`close`, so a
    failed collection leaves nothing behind and an existing folder is only replaced with
    ``overwrite``. Use as a context manager.
    """

    def __init__(self, path: str | os.PathLike, model: ModelGeometry, *, overwrite: bool = False,
                 chunk: int = 256, dtype: str = "float16"):
        self.path = Path(path)
        if dtype not in ("float16", "float32"):
            raise CopeInputError(f"expected float16 or float32, got {dtype!r}", field="dtype")
        self.model, self.chunk, self.dtype, self.overwrite = model, int(chunk), dtype, overwrite
        self._folder = contextlib.ExitStack()
        self.tmp = self._folder.enter_context(atomic_folder(self.path, overwrite=overwrite))
        self._rows: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        self._shards: list[dict[str, Any]] = []
        self.hidden: int | None = None

    def add(self, prompt: int, token: int, hidden: np.ndarray, routed: np.ndarray) -> None:
        """Append one decode token: ``hidden`` [L, H], ``routed`` [L, top_k]."""
        L, k = self.model.n_layers, self.model.top_k
        if self.hidden is None:
            self.hidden = int(hidden.shape[-1])
        if hidden.shape != (L, self.hidden) or routed.shape != (L, k):
            raise CopeInputError(f"token {token} of prompt {prompt}: hidden {hidden.shape} / "
                                 f"routed {routed.shape}, expected ({L}, {self.hidden}) / "
                                 f"({L}, {k})", source=str(self.path), field="hidden")
        with np.errstate(over="ignore"):  # overflow is reported below, as an input error
            h = hidden.astype(self.dtype)
        if not np.isfinite(h).all():
            raise CopeInputError(f"token {token} of prompt {prompt}: hidden state does not fit "
                                 f"{self.dtype}; collect with float32", source=str(self.path),
                                 field="hidden")
        self._rows.append((prompt, token, h, routed.astype(np.int16)))
        if len(self._rows) >= self.chunk:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        name = f"shard-{len(self._shards):06d}.npz"
        p, t, h, r = zip(*self._rows)
        with atomic_path(self.tmp / name) as tmp, open(tmp, "wb") as fh:
            # savez appends .npz to string paths, not to open files
            np.savez(fh, hidden=np.stack(h), routed=np.stack(r),
                     prompt=np.asarray(p, np.int32), token=np.asarray(t, np.int32))
        self._shards.append({"file": name, "tokens": len(self._rows)})
        self._rows = []

    def close(self) -> None:
        """Write the index and move the folder into place."""
        self._flush()
        index = {"format": HIDDEN_FORMAT, "model": self.model.to_dict(), "dtype": self.dtype,
                 "hidden": self.hidden or 0, "shards": self._shards}
        (self.tmp / "index.json").write_text(json.dumps(index, indent=1))
        self._folder.close()                 # renames the folder into place

    def abort(self) -> None:
        """Remove what was written; an existing folder at ``path`` is left as it was."""
        self._folder.__exit__(_Aborted, _Aborted(), None)

    def __enter__(self) -> "HiddenStateWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


@dataclass(frozen=True, eq=False)
class HiddenStates:
    """One ``cope.hidden/1`` folder, loaded: ``hidden`` [N, L, H], ``routed`` [N, L, k],
    ``prompt`` and ``token`` [N]."""

    model: ModelGeometry
    hidden: np.ndarray
    routed: np.ndarray
    prompt: np.ndarray
    token: np.ndarray
    path: str = field(default="", compare=False)


def read_hidden_states(path: str | os.PathLike) -> HiddenStates:
    """Load a hidden-state folder, checking every shard against the index."""
    src = str(path)
    index_path = Path(path) / "index.json"
    if not Path(path).is_dir() or not index_path.is_file():
        raise CopeInputError("expected a hidden-state folder with an index.json "
                             "(written by 'cope trace collect --hidden-states')", source=src)
    try:
        index = json.loads(index_path.read_text())
    except (ValueError, OSError) as exc:
        raise CopeInputError(f"index.json is not valid JSON ({exc})", source=src) from None
    if not isinstance(index, dict) or index.get("format") != HIDDEN_FORMAT:
        raise CopeInputError(f"expected format {HIDDEN_FORMAT!r}", source=src, field="format")
    g = ModelGeometry.from_dict(index.get("model"), src)
    H = index.get("hidden")
    shards = index.get("shards")
    if not isinstance(H, int) or H < 1 or not isinstance(shards, list) or not shards:
        raise CopeInputError("expected a positive 'hidden' and a non-empty 'shards' list",
                             source=src, field="shards")
    parts: dict[str, list[np.ndarray]] = {"hidden": [], "routed": [], "prompt": [], "token": []}
    for sh in shards:
        fn = Path(path) / str(sh.get("file", "")) if isinstance(sh, dict) else None
        if fn is None or not fn.is_file():
            raise CopeInputError(f"missing shard {sh!r}", source=src, field="shards")
        try:
            with np.load(fn, allow_pickle=False) as z:
                arrs = {k: z[k] for k in parts}
        except (ValueError, OSError, KeyError) as exc:
            raise CopeInputError(f"unreadable shard ({' '.join(str(exc).split())})",
                                 source=str(fn)) from None
        n = arrs["prompt"].shape[0]
        want = {"hidden": (n, g.n_layers, H), "routed": (n, g.n_layers, g.top_k),
                "token": (n,), "prompt": (n,)}
        for k, shape in want.items():
            if arrs[k].shape != shape or n != sh.get("tokens"):
                raise CopeInputError(f"shape {arrs[k].shape}, expected {shape}", source=str(fn),
                                     field=k)
            parts[k].append(arrs[k])
    out = {k: np.concatenate(v) for k, v in parts.items()}
    r = out["routed"]
    if ((r < 0) | (r >= g.n_experts)).any():
        raise CopeInputError(f"expert ids outside 0..{g.n_experts - 1}", source=src,
                             field="routed")
    return HiddenStates(model=g, path=src, **out)


def _prompt_groups(sets: Sequence[HiddenStates]) -> list[np.ndarray]:
    """Rows of each (file, prompt), in token order; checks the files agree in shape."""
    first = sets[0]
    groups: list[np.ndarray] = []
    offset = 0
    for hs in sets:
        g, g0 = hs.model, first.model
        if (g.n_layers, g.n_experts, g.top_k) != (g0.n_layers, g0.n_experts, g0.top_k) \
                or hs.hidden.shape[2] != first.hidden.shape[2]:
            raise CopeInputError(
                f"hidden states [{hs.hidden.shape[1]} layers, {hs.hidden.shape[2]}] top-"
                f"{g.top_k} of {g.n_experts} do not match {first.path} ([{first.hidden.shape[1]}, "
                f"{first.hidden.shape[2]}] top-{g0.top_k} of {g0.n_experts})", source=hs.path,
                field="hidden")
        for p in np.unique(hs.prompt):
            rows = np.flatnonzero(hs.prompt == p)
            groups.append(offset + rows[np.argsort(hs.token[rows], kind="stable")])
        offset += hs.prompt.shape[0]
    return groups


# --- baselines and recall (numpy only) ----------------------------------------------------------
def popularity_lists(routed: np.ndarray, n_experts: int, width: int) -> np.ndarray:
    """``lists[l]``: the ``width`` most routed experts of layer ``l`` (ties to the lower id)."""
    N, L, k = routed.shape
    flat = (np.arange(L)[None, :, None] * n_experts + routed.astype(np.int64)).ravel()
    counts = np.bincount(flat, minlength=L * n_experts).reshape(L, n_experts)
    return np.argsort(-counts, axis=1, kind="stable")[:, :width].astype(np.int16)


def baseline_predictions(routed: np.ndarray, prompt_start: np.ndarray, method: str,
                         popular: np.ndarray) -> np.ndarray:
    """Predicted lists ``[N, L, k]`` for layer ``l + 1`` made at layer ``l`` by a baseline.

    Parameters
    ----------
    routed : ndarray [N, L, k]
    prompt_start : ndarray [P + 1]
        Token offsets of the prompts (the previous token never crosses a prompt boundary).
    method : {"previous-token", "popularity"}
    popular : ndarray [L, >= k]
        Popularity lists from :func:`popularity_lists`, used by ``popularity`` and for the
        first token of each prompt under ``previous-token``.
    """
    if method not in METHODS:
        raise CopeInputError(f"expected one of {list(METHODS)}, got {method!r}", field="method")
    N, L, k = routed.shape
    out = np.full((N, L, k), -1, np.int16)
    nxt = np.broadcast_to(popular[1:, :k], (N, L - 1, k)).copy()
    if method == "previous-token":
        first = np.zeros(N, bool)
        first[prompt_start[:-1]] = True
        prev = np.roll(routed[:, 1:, :], 1, axis=0)
        nxt = np.where(first[:, None, None], nxt, prev)
    out[:, :-1, :] = nxt
    return out


def recall_at_k(predicted: np.ndarray, routed: np.ndarray, k: int | None = None) -> np.ndarray:
    """Per layer pair ``l -> l + 1``: mean over tokens of ``|top-k(predicted[t, l]) ∩
    routed[t, l + 1]| / k``; shape ``[L - 1]`` (NaN when there are no tokens)."""
    N, L, kk = routed.shape
    k = kk if k is None else k
    if predicted.shape[2] == 0 or N == 0:
        return np.full(L - 1, np.nan)
    top = predicted[:, :-1, :k].astype(np.int64)                   # [N, L-1, <=k]
    true = routed[:, 1:, :].astype(np.int64)                       # [N, L-1, kk]
    hit = ((top[..., :, None] == true[..., None, :]) & (top[..., :, None] >= 0)).any(axis=3)
    return hit.sum(axis=2).mean(axis=0) / kk


def predict_trace(trace: Trace, method: str, calibration: Trace | None = None) -> Trace:
    """A copy of ``trace`` whose ``predicted`` column comes from a baseline (``method``)."""
    cal = calibration if calibration is not None else trace
    if calibration is not None and not calibration.model.same_shape(trace.model):
        raise CopeInputError("calibration geometry differs from the trace's",
                             source=calibration.path, field="model")
    k = trace.model.top_k
    popular = popularity_lists(cal.routed, trace.model.n_experts, k)
    pred = baseline_predictions(trace.routed, trace.prompt_start, method, popular)
    return Trace(model=trace.model, prompt_ids=trace.prompt_ids, prompt_start=trace.prompt_start,
                 context=trace.context, routed=trace.routed, predicted=pred, source=trace.source,
                 description=trace.description,
                 predictor={"kind": "baseline", "method": method,
                            "popularity_from": "calibration" if calibration is not None
                            else "trace"})


# --- the MLP predictor (torch) ------------------------------------------------------------------
@dataclass(frozen=True)
class TrainResult:
    """Held-out top-k recall of the predictor and both baselines (means over layer pairs)."""

    recall: float
    recall_previous_token: float
    recall_popularity: float
    per_pair: dict[str, list[float]]
    train_prompts: int
    val_prompts: int
    val_tokens: int
    epochs: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _build_module(P: int, H: int, U: int, E: int):
    import torch

    class PairMLP(torch.nn.Module):
        """One two-layer MLP per layer pair, stored as stacked weights so all pairs run at once."""

        def __init__(self) -> None:
            super().__init__()
            self.w1 = torch.nn.Parameter(torch.randn(P, H, U) / H**0.5)
            self.b1 = torch.nn.Parameter(torch.zeros(P, U))
            self.w2 = torch.nn.Parameter(torch.randn(P, U, E) / U**0.5)
            self.b2 = torch.nn.Parameter(torch.zeros(P, E))
            self.register_buffer("mean", torch.zeros(P, H))
            self.register_buffer("std", torch.ones(P, H))

        def forward(self, x):  # x [B, P, H] -> logits [B, P, E]
            z = (x - self.mean) / self.std
            h = torch.nn.functional.gelu(torch.einsum("bph,phu->bpu", z, self.w1) + self.b1)
            return torch.einsum("bpu,pue->bpe", h, self.w2) + self.b2

    return PairMLP()


class Predictor:
    """A trained next-layer predictor: :meth:`predict` ranks layer ``l + 1``'s experts."""

    def __init__(self, module, model: ModelGeometry, meta: dict[str, Any]):
        self.module, self.model, self.meta = module.eval(), model, meta

    @property
    def width(self) -> int:
        return int(self.meta["width"])

    def predict(self, hidden: np.ndarray) -> np.ndarray:
        """``hidden`` [N, L, H] -> ranked ids ``[N, L, width]`` (the last layer's list is -1)."""
        import torch
        N, L, H = hidden.shape
        out = np.full((N, L, self.width), -1, np.int16)
        if L < 2 or N == 0:
            return out
        with torch.no_grad():
            x = torch.as_tensor(np.ascontiguousarray(hidden[:, :-1], dtype=np.float32))
            logits = self.module(x)
            out[:, :-1] = torch.topk(logits, self.width, dim=-1).indices.numpy().astype(np.int16)
        return out

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> None:
        """Write the predictor as ``cope.predictor/1`` safetensors.

        Parameters
        ----------
        path : str or PathLike
            A file path; missing parent folders are created, as by the other writers.
        overwrite : bool
            Replace an existing file. The file is written through a temporary file and a
            rename, so readers never see half of one and a failed write keeps the old one.
        """
        from safetensors import SafetensorError
        from safetensors.torch import save_file
        tensors = {k: v.detach().contiguous() for k, v in self.module.state_dict().items()}
        meta = dict(self.meta, format=PREDICTOR_FORMAT, model=self.model.to_dict())
        with atomic_path(path, overwrite=overwrite, errors=(SafetensorError,)) as tmp:
            save_file(tensors, str(tmp), metadata={"cope": json.dumps(meta)})


def load_predictor(path: str | os.PathLike) -> Predictor:
    """Read a predictor written by :meth:`Predictor.save` (safetensors, no pickle)."""
    from safetensors import SafetensorError, safe_open
    src = str(path)
    if not os.path.isfile(src):
        raise CopeInputError("file not found", source=src)
    try:
        with safe_open(src, framework="pt") as f:
            raw = (f.metadata() or {}).get("cope")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(raw or "")
    except (SafetensorError, ValueError, OSError) as exc:
        raise CopeInputError(f"not a COPE predictor file ({' '.join(str(exc).split())[:120]})",
                             source=src) from None
    if not isinstance(meta, dict) or meta.get("format") != PREDICTOR_FORMAT:
        raise CopeInputError(f"expected format {PREDICTOR_FORMAT!r}", source=src, field="format")
    g = ModelGeometry.from_dict(meta.get("model"), src)
    P, H, U = tensors["w1"].shape
    module = _build_module(P, H, U, g.n_experts)
    module.load_state_dict(tensors)
    return Predictor(module, g, meta)


def _split(n_groups: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if n_groups < 2:
        raise CopeInputError(f"need at least 2 prompts to train and validate on separate prompts, "
                             f"got {n_groups}", field="hidden-states")
    if not 0 < val_fraction < 1:
        raise CopeInputError(f"expected a number in (0, 1), got {val_fraction}",
                             field="val_fraction")
    perm = np.random.default_rng(seed).permutation(n_groups)
    n_val = min(max(1, int(round(val_fraction * n_groups))), n_groups - 1)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def train_predictor(sets: Sequence[HiddenStates] | HiddenStates, *, epochs: int = 40,
                    hidden_units: int = 128, lr: float = 3e-3, batch: int = 256,
                    val_fraction: float = 0.25, seed: int = 0, width: int | None = None,
                    progress: bool = False) -> tuple[Predictor, TrainResult]:
    """Train one MLP per layer pair on some prompts and measure recall on the others.

    Parameters
    ----------
    sets : HiddenStates or sequence of them
        Collected hidden states (all of the same shape). Prompts are the split unit: a prompt's
        tokens are all in training or all in validation.
    epochs, hidden_units, lr, batch : training settings (Adam, multi-label BCE).
    val_fraction : float
        Share of prompts held out (at least one prompt on each side).
    seed : int
        Seeds the split and torch.
    width : int, optional
        Length of the ranked lists the predictor emits (default ``top_k``).

    Returns
    -------
    (Predictor, TrainResult)
        The predictor, trained on the training prompts only, and held-out recalls.
    """
    import torch
    sets = [sets] if isinstance(sets, HiddenStates) else list(sets)
    if not sets:
        raise CopeInputError("no hidden-state folder given", field="hidden-states")
    g = sets[0].model
    L, E, k = g.n_layers, g.n_experts, g.top_k
    if L < 2:
        raise CopeInputError("a next-layer predictor needs at least 2 MoE layers",
                             source=sets[0].path, field="model")
    width = k if width is None else int(width)
    if not 1 <= width <= E:
        raise CopeInputError(f"expected 1..{E}, got {width}", field="width")
    groups = _prompt_groups(sets)
    hidden = np.concatenate([s.hidden for s in sets])
    routed = np.concatenate([s.routed for s in sets])
    tr_g, va_g = _split(len(groups), val_fraction, seed)
    tr = np.concatenate([groups[i] for i in tr_g])
    va = np.concatenate([groups[i] for i in va_g])
    va_start = np.concatenate([[0], np.cumsum([len(groups[i]) for i in va_g])])

    torch.manual_seed(seed)
    H = hidden.shape[2]
    module = _build_module(L - 1, H, hidden_units, E)
    x_tr = torch.as_tensor(hidden[tr, :-1].astype(np.float32))
    y_tr = torch.zeros(len(tr), L - 1, E)
    y_tr.scatter_(2, torch.as_tensor(routed[tr, 1:].astype(np.int64)), 1.0)
    module.mean.copy_(x_tr.mean(0))
    module.std.copy_(x_tr.std(0, unbiased=False).clamp_min(1e-6))
    opt = torch.optim.Adam(module.parameters(), lr=lr, weight_decay=1e-5)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(seed)
    it: Iterable[int] = range(epochs)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="training", unit="epoch")
    for _ in it:
        for idx in torch.randperm(len(tr), generator=gen).split(batch):
            opt.zero_grad()
            loss_fn(module(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
    meta = {"width": width, "hidden": H, "hidden_units": hidden_units, "epochs": epochs,
            "seed": seed, "train_prompts": int(len(tr_g))}
    pred = Predictor(module, g, meta)

    # judged on held-out prompts only; popularity comes from the training prompts
    popular = popularity_lists(routed[tr], E, k)
    r_val = routed[va]
    rec = recall_at_k(pred.predict(hidden[va]), r_val)
    rec_prev = recall_at_k(baseline_predictions(r_val, va_start, "previous-token", popular), r_val)
    rec_pop = recall_at_k(baseline_predictions(r_val, va_start, "popularity", popular), r_val)
    result = TrainResult(recall=float(rec.mean()), recall_previous_token=float(rec_prev.mean()),
                         recall_popularity=float(rec_pop.mean()),
                         per_pair={"predictor": rec.tolist(), "previous-token": rec_prev.tolist(),
                                   "popularity": rec_pop.tolist()},
                         train_prompts=int(len(tr_g)), val_prompts=int(len(va_g)),
                         val_tokens=int(len(va)), epochs=epochs)
    pred.meta.update(recall=result.recall, recall_previous_token=result.recall_previous_token,
                     recall_popularity=result.recall_popularity)
    return pred, result
