"""Numba kernels of the streaming ``cope.trace/1`` reader (:mod:`cope_core.parquet_io.trace`).

Private: arrays and scalars in, preallocated arrays out, no messages. The reader feeds one Parquet
row group at a time, so the row checks carry their state across calls in ``st`` and record the
first offending row of each problem kind in ``first`` (with the values its message needs in
``info``): the wrapper reports the kinds in a fixed order, exactly as a whole-file check would.
"""
from __future__ import annotations

import numba
import numpy as np

from ..jit import NJIT

# Row problem kinds, in the order they are reported.
LAYER_RANGE, CONTEXT_NEGATIVE, UNSORTED, DUPLICATE_LAYER, MISSING_LAYER, TOKEN_GAP, \
    CONTEXT_CHANGES = range(7)
N_KINDS = 7
# Scan state slots.
PREV_PROMPT, PREV_TOKEN, PREV_LAYER, HAVE_PREV, GROUP_ROWS, TOKEN_INDEX, N_TOKENS, \
    GROUP_CONTEXT = range(8)
N_STATE = 8


@numba.njit(**NJIT)
def _note(first, info, kind, row, a, b, c, d, e, f, g):
    if first[kind] < 0:
        first[kind] = row
        info[kind, 0] = a
        info[kind, 1] = b
        info[kind, 2] = c
        info[kind, 3] = d
        info[kind, 4] = e
        info[kind, 5] = f
        info[kind, 6] = g


@numba.njit(**NJIT)
def _scan_rows(prompt, token, layer, ctx, base, L, st, first, info, tok_prompt, tok_ctx):
    """Check rows ``base .. base + len(prompt) - 1`` of a trace file.

    A *group* is the run of rows of one (prompt, token); it must hold layers 0..L-1 in order.
    Per group the prompt id and context go to ``tok_prompt``/``tok_ctx`` (capacity permitting:
    more groups than capacity means some group is short, which is reported anyway).
    """
    cap = tok_prompt.shape[0]
    for j in range(prompt.shape[0]):
        i = base + j
        p = np.int64(prompt[j])
        t = np.int64(token[j])
        lay = np.int64(layer[j])
        c = np.int64(ctx[j])
        if lay < 0 or lay >= L:
            _note(first, info, LAYER_RANGE, i, lay, 0, 0, 0, 0, 0, 0)
        if c < 0:
            _note(first, info, CONTEXT_NEGATIVE, i, c, 0, 0, 0, 0, 0, 0)
        new_group = True
        if st[HAVE_PREV]:
            pp, pt, pl = st[PREV_PROMPT], st[PREV_TOKEN], st[PREV_LAYER]
            dp, dt, dl = p - pp, t - pt, lay - pl
            if dp < 0 or (dp == 0 and (dt < 0 or (dt == 0 and dl < 0))):
                which = 0 if dp < 0 else (1 if dt < 0 else 2)
                _note(first, info, UNSORTED, i, which, pp, pt, pl, p, t, lay)
            if dp == 0 and dt == 0 and dl == 0:
                _note(first, info, DUPLICATE_LAYER, i, p, t, lay, 0, 0, 0, 0)
            new_group = dp != 0 or dt != 0
            if new_group and st[GROUP_ROWS] != L:
                # the group that just ended is cut short: its last row is i - 1
                _note(first, info, MISSING_LAYER, i - 1, pp, pt, pl, pl + 1, 0, 0, 0)
        if new_group:
            if st[HAVE_PREV] and p == st[PREV_PROMPT]:
                st[TOKEN_INDEX] += 1
            else:
                st[TOKEN_INDEX] = 0
            st[GROUP_ROWS] = 0
            st[GROUP_CONTEXT] = c
            n = st[N_TOKENS]
            if n < cap:
                tok_prompt[n] = p
                tok_ctx[n] = c
            st[N_TOKENS] = n + 1
        pos = st[GROUP_ROWS]
        if lay != pos:
            _note(first, info, MISSING_LAYER, i, p, t, lay, pos, 0, 0, 0)
        st[GROUP_ROWS] = pos + 1
        if t != st[TOKEN_INDEX]:
            _note(first, info, TOKEN_GAP, i, p, t, st[TOKEN_INDEX], 0, 0, 0, 0)
        if c != st[GROUP_CONTEXT]:
            _note(first, info, CONTEXT_CHANGES, i, p, t, lay, c, st[GROUP_CONTEXT], 0, 0)
        st[PREV_PROMPT] = p
        st[PREV_TOKEN] = t
        st[PREV_LAYER] = lay
        st[HAVE_PREV] = 1


# List problem kinds of _pad_lists.
LIST_LAST_LAYER, LIST_RANGE, LIST_TOO_LONG, LIST_DUPLICATE = range(4)
N_LIST_KINDS = 4


@numba.njit(**NJIT)
def _pad_lists(offs, vals, layer, L, E, last_empty, out, dest, seen, base, found):
    """Check list ``j`` (``vals[offs[j]:offs[j+1]]``, file row ``base + j``) and copy it into
    ``out[dest[j]]`` padded with -1 (``dest[j] < 0``: checked, not kept).

    ``found[kind]`` gets the first local row with each problem: a non-empty list at layer
    ``L - 1`` (when ``last_empty``), an id outside ``0..E-1``, more than ``E`` ids, a repeated
    id. ``seen[e]`` holds the last row that had ``e``: a stamp, so nothing is cleared per row.
    """
    W = out.shape[1]
    for j in range(offs.shape[0] - 1):
        a, b = offs[j], offs[j + 1]
        n = b - a
        row = base + j
        if last_empty and n > 0 and layer[j] == L - 1 and found[LIST_LAST_LAYER] < 0:
            found[LIST_LAST_LAYER] = j
        if n > E and found[LIST_TOO_LONG] < 0:
            found[LIST_TOO_LONG] = j
        for m in range(n):
            v = vals[a + m]
            if v < 0 or v >= E:
                if found[LIST_RANGE] < 0:
                    found[LIST_RANGE] = j
            else:
                if seen[v] == row and found[LIST_DUPLICATE] < 0:
                    found[LIST_DUPLICATE] = j
                seen[v] = row
        d = dest[j]
        if d >= 0:
            for m in range(W):
                out[d, m] = vals[a + m] if m < n else -1


@numba.njit(**NJIT)
def _compact(ids, offsets, values):
    """The -1-padded rows of ``ids`` (padding is a suffix) as list offsets and flat values;
    returns the number of values. ``values`` must hold ``ids.size``."""
    n, W = ids.shape
    m = 0
    offsets[0] = 0
    for r in range(n):
        for j in range(W):
            v = ids[r, j]
            if v < 0:
                break
            values[m] = v
            m += 1
        offsets[r + 1] = m
    return m
