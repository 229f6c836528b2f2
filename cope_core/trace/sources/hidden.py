"""Hidden-state folders: the MoE-layer inputs a predictor is trained on (``cope.hidden/1``).

Written by ``cope trace collect --hidden-states DIR``:

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CopeInputError
from ...files import atomic_folder, atomic_path
from ...geometry import ModelGeometry

HIDDEN_FORMAT = "cope.hidden/1"


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

    def __enter__(self) -> HiddenStateWriter:
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


def prompt_groups(sets: Sequence[HiddenStates]) -> list[np.ndarray]:
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
