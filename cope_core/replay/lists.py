"""The recency lists every LRU kernel shares: the replay's (:mod:`cope_core.replay._kernels`) and
llama.cpp's MoE expert cache (its replay port, in llama.cpp's own package). Numba helpers,
inlined into their callers; public so that a kernel of another package can use them.
"""
from __future__ import annotations

import numba

from ..jit import NJIT


# --- recency lists -----------------------------------------------------------------------------
# Nodes are ``layer * E + expert``; ``prv``/``nxt`` link them, -1 ends a list. Head and tail travel
# as plain values (returned, not stored in an array): numba keeps them in registers, which an
# earlier version that kept them in an array did not (2.7-3.6x slower). ``forceinline`` makes LLVM
# inline the helpers: numba's IR-level ``inline="always"`` ran the mutable kernels 7x slower, and
# plain calls 30 % slower. The scan of the predicted ids stays written out in both kernels: as a
# helper it cost 30 %, however written (benchmarks/bench_predict.py, measured when written).
@numba.njit(forceinline=True, **NJIT)
def list_append(prv, nxt, head, tail, node):
    """Link ``node`` after the tail (the newest stamp); returns (head, tail)."""
    prv[node] = tail
    nxt[node] = -1
    if tail >= 0:
        nxt[tail] = node
    else:
        head = node
    return head, node


@numba.njit(forceinline=True, **NJIT)
def list_unlink(prv, nxt, head, tail, node):
    """Take ``node`` out of its list; returns (head, tail)."""
    a = prv[node]
    b = nxt[node]
    if a >= 0:
        nxt[a] = b
    else:
        head = b
    if b >= 0:
        prv[b] = a
    else:
        tail = a
    return head, tail


@numba.njit(forceinline=True, **NJIT)
def list_to_tail(prv, nxt, head, tail, node):
    """Give ``node`` the newest stamp (move it to the tail); returns (head, tail).

    :func:`list_unlink` then :func:`list_append`, without their end-of-list branches: ``node`` is
    not the tail, and the list is not empty (this runs for every hit, the kernels' hottest path)."""
    if tail == node:
        return head, tail
    a = prv[node]
    b = nxt[node]            # not the tail, so it has a successor
    if a >= 0:
        nxt[a] = b
    else:
        head = b
    prv[b] = a
    prv[node] = tail
    nxt[node] = -1
    nxt[tail] = node
    return head, node
