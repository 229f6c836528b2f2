"""The next-layer expert predictor: a small MLP per layer pair, trained with torch.

The predictor maps MoE layer ``l``'s input hidden state (what layer ``l``'s router sees) to the
experts layer ``l + 1`` will route to, so a runtime can prefetch them one layer ahead (the
``predicted`` column of ``cope.trace/1``). It is trained on the hidden states of
:mod:`cope_core.trace.sources.hidden`, on prompts held apart from the ones it is judged on, and
judged against the two baselines of :mod:`cope_core.trace.baselines`. torch is imported only
when a predictor is built, trained or loaded.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import CopeInputError
from ...files import atomic_path
from ...geometry import ModelGeometry
from ..baselines import baseline_predictions, popularity_lists, recall_at_k
from .hidden import HiddenStates, prompt_groups

PREDICTOR_FORMAT = "cope.predictor/1"


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
    groups = prompt_groups(sets)
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
