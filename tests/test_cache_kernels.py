"""The class-LRU kernel's arithmetic shortcuts (cope_core/llamacpp/cache/_cache_kernels.py) give
what
they replace, bit for bit: a score's class read from its exponent bits is
``min(floor(log2(v)), N_CLASS - 1)`` (libm's log2, which rounds up to a power of two just below
it), the decay table holds the kernels' own exp2, and the victim's score as a product equals
the quotient. The replay's counts against the plain-Python reference are tests/test_moe_cache.py.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from cope_core.llamacpp.cache import _cache_kernels as K


@numba.njit
def _kernel_exp2(d):
    """What the kernels computed before the table: exp2 as numba compiles it."""
    out = np.empty(d.shape[0])
    for i in range(d.shape[0]):
        out[i] = math.exp2(-d[i] / K.HALF_LIFE)
    return out


@numba.njit
def _kernel_log2_class(v):
    out = np.empty(v.shape[0], np.int64)
    for i in range(v.shape[0]):
        out[i] = min(int(math.floor(math.log2(v[i]))), K.N_CLASS - 1)
    return out


def _scores() -> np.ndarray:
    rng = np.random.default_rng(0)
    near = []
    for j in range(K.N_CLASS + 2):
        p = 2.0 ** j
        x_lo = x_hi = p
        for _ in range(4):                   # a few ulps either side of the power
            x_lo, x_hi = np.nextafter(x_lo, 0.0), np.nextafter(x_hi, np.inf)
            near += [x_lo, x_hi]
        for e in (38, 39, 40, 41, 42, 50):   # either side of the 2**-40 edge the kernel uses
            near += [p * (1 - 2.0 ** -e), p * (1 + 2.0 ** -e)]
    v = np.concatenate([[1.0], near, rng.uniform(1.0, 400.0, 20_000),
                        2.0 ** rng.uniform(0.0, 9.0, 20_000)])
    return v[v >= 1.0]


def test_class_from_bits_is_floor_log2():
    v = _scores()
    fbits = np.empty(1, np.float64)
    ibits = fbits.view(np.int64)
    got = np.array([K._class(x, fbits, ibits) for x in v])
    np.testing.assert_array_equal(got, _kernel_log2_class(v))
    # and libm's log2 does round some of them up: the edge is needed
    below = np.nextafter(64.0, 0.0)
    assert math.floor(math.log2(below)) == 6
    assert K._class(below, fbits, ibits) == 6


def test_decay_table_is_the_kernels_exp2():
    d = np.arange(K._DECAY.shape[0] + 100, dtype=np.int64)
    want = _kernel_exp2(d)
    np.testing.assert_array_equal(K._DECAY, want[:K._DECAY.shape[0]])
    got = np.array([K._decay(x) for x in d])
    np.testing.assert_array_equal(got, want)


def test_victim_score_product_is_the_quotient():
    age = np.arange(0, 2_000_000, 7, dtype=np.int64).astype(np.float64)
    for c in range(K.N_CLASS):
        np.testing.assert_array_equal(age * K._INV_POW2[c], age / (2.0 ** c))
