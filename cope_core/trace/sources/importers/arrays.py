"""numpy arrays (``format="npz"``): ``.npy`` and ``.npz`` files, one prompt per array; the
layout is in :mod:`cope_core.trace.sources.importers`."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ....errors import CopeInputError
from ....geometry import ModelGeometry
from ...data import Trace
from .records import (
    Block,
    ImportReport,
    PromptReport,
    assemble,
    check_ids,
    existing_files,
    prompt_block,
)


def import_npz(paths: Sequence[str | os.PathLike], model: ModelGeometry, *,
               context_start: int = 0) -> tuple[Trace, ImportReport]:
    """Import numpy arrays ``[tokens, layers, top_k]`` (format in the module docstring)."""
    g = model
    want = (g.n_layers, g.top_k)
    blocks: list[Block] = []
    reports: list[PromptReport] = []
    srcs = existing_files(paths)
    for src in srcs:
        try:
            z = np.load(src, allow_pickle=False)
            items = ([("", z, None)] if isinstance(z, np.ndarray) else
                     [("routed", z["routed"], z["context"] if "context" in z.files else None)]
                     if "routed" in z.files else [(n, z[n], None) for n in z.files])
        except (ValueError, OSError) as exc:
            raise CopeInputError(f"not a numpy .npy/.npz file ({' '.join(str(exc).split())})",
                                 source=src) from None
        for name, arr, ctx in items:
            where = f"array {name!r}" if name else "array"
            if arr.ndim != 3 or arr.shape[1:] != want or arr.dtype.kind not in "iu":
                raise CopeInputError(f"{where}: got {arr.dtype} {arr.shape}, expected integers "
                                     f"[tokens, {want[0]}, {want[1]}] for {g.name}", source=src,
                                     field=name or "routed")
            if ctx is not None and ctx.shape != (arr.shape[0],):
                raise CopeInputError(f"shape {ctx.shape}, expected ({arr.shape[0]},)",
                                     source=src, field="context")
            routed = np.where(arr < 0, -1, arr).astype(np.int64)
            # a record with any missing id is missing as a whole
            routed[(routed < 0).any(axis=2)] = -1
            check_ids(routed, g, src, where)
            label = f"{os.path.basename(src)}" + (f": {name}" if name else "")
            r, c, rep = prompt_block(label, routed, ctx, len(blocks), g)
            blocks.append((r, c))
            reports.append(rep)
    return assemble(blocks, reports, g, context_start, "npz", srcs)
