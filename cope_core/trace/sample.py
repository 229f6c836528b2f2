"""Uniform samples of a trace's prompts, for deciding a policy without replaying a day of logs.

Replay treats prompts independently (every prompt starts from the same initial cache), so a
uniform sample of prompts is an unbiased miniature of the trace; the bootstrap of
:mod:`cope_core.estimate.uncertainty` then says whether the sample is large enough to settle the
pick. The sampler is Algorithm R (Vitter's reservoir sampling) over the stream of prompt ids, so
it needs one pass and memory for ``n`` ids whatever the trace's size or sharding.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..errors import CopeInputError


def reservoir_sample(ids: Iterable[np.ndarray], n: int, seed: int) -> np.ndarray:
    """``n`` ids drawn uniformly without replacement from a stream of id arrays.

    Parameters
    ----------
    ids : iterable of 1-D int arrays
        The stream, chunk by chunk (e.g. the prompt ids of each file of a sharded trace).
    n : int
        Sample size (>= 1). A stream shorter than ``n`` is returned whole.
    seed : int
        Seed (>= 0) of the ``numpy.random.Generator(PCG64)``; the same stream and seed give the
        same sample.

    Returns
    -------
    ndarray of int64
        The sampled ids in stream order.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise CopeInputError(f"expected an integer >= 1, got {n!r}", field="prompts")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise CopeInputError(f"expected an integer >= 0, got {seed!r}", field="seed")
    rng = np.random.Generator(np.random.PCG64(seed))
    slot_pos = np.full(n, -1, np.int64)    # stream position of each reservoir slot's id
    slot_id = np.zeros(n, np.int64)
    seen = 0
    for chunk in ids:
        chunk = np.asarray(chunk, dtype=np.int64).ravel()
        pos = np.arange(seen, seen + len(chunk), dtype=np.int64)
        fill = pos < n
        slot_pos[pos[fill]] = pos[fill]
        slot_id[pos[fill]] = chunk[fill]
        late = np.flatnonzero(~fill)
        if late.size:
            # item i replaces slot j = U{0..i} when j < n (probability n / (i + 1)); applied in
            # stream order, so a later item overwrites an earlier one
            j = rng.integers(0, pos[late] + 1)
            for li, s in zip(late[j < n], j[j < n], strict=True):
                slot_pos[s], slot_id[s] = pos[li], chunk[li]
        seen += len(chunk)
    used = slot_pos >= 0
    order = np.argsort(slot_pos[used], kind="stable")
    return slot_id[used][order]
