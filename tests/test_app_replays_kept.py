"""The replay of every K kept across server starts (cope_core.app.results._replays_disk): after a
restart, a shipped example's first new operating point is priced from the kept replay, not
replayed again, with the same numbers; an upload's is replayed by every server. Each "server" is
a fresh process with a real server's cache storage and ``HOME`` in a temp folder (as in
tests/test_app_persisted.py)."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from cope_core.app.results import _narrowed, _widened
from cope_core.matrix import Residency
from cope_core.replay.engine import ReplayCounts

PRICE = r"""
import json, pickle, sys
from streamlit.runtime.caching import cache_data_api
from streamlit.web.cache_storage_manager_config import create_default_cache_storage_manager
cache_data_api._data_caches.get_storage_manager = create_default_cache_storage_manager
from tiny import tiny_profile, tiny_trace
from cope_core.app import results
from cope_core.app.dataset import assemble
from cope_core.matrix import CANDIDATE_IDS

origin, op, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
replayed = []
_replay = results._replay
results._replay = lambda *a: replayed.append(1) or _replay(*a)
profile = tiny_profile()
ds = assemble("tiny", tiny_trace(), None, profile, None,
              {"trace": f"{origin} t.parquet", "profile": "example p.parquet"})
view = results.sweep_view(ds, profile.operating_points()[op], "cope", CANDIDATE_IDS)
with open(out, "wb") as fh:
    pickle.dump(view.frame, fh)
print(json.dumps({"replayed": len(replayed)}))
"""


def _price(home: Path, origin: str, op: int, out: Path) -> int:
    """One server pricing every K at the profile's ``op``-th point; how many replays it ran."""
    tests = Path(__file__).resolve().parent
    env = dict(os.environ, HOME=str(home),
               PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", PRICE, origin, str(op), str(out)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tests.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["replayed"]


def _frame(path: Path) -> pd.DataFrame:
    return pickle.loads(path.read_bytes())


@pytest.mark.slow
def test_a_restart_prices_a_new_operating_point_from_the_kept_replay(tmp_path):
    home, fresh = tmp_path / "home", tmp_path / "fresh"
    home.mkdir()
    fresh.mkdir()
    assert _price(home, "example", 0, tmp_path / "first.pkl") > 0      # replayed, then kept
    assert _price(home, "example", 1, tmp_path / "kept.pkl") == 0      # a new point, no replay
    assert _price(fresh, "example", 1, tmp_path / "afresh.pkl") > 0
    kept, afresh = _frame(tmp_path / "kept.pkl"), _frame(tmp_path / "afresh.pkl")
    pd.testing.assert_frame_equal(kept, afresh, check_exact=True)
    np.testing.assert_equal(kept.attrs, afresh.attrs)


@pytest.mark.slow
def test_an_upload_is_replayed_by_every_server(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert _price(home, "upload", 0, tmp_path / "1.pkl") > 0
    assert _price(home, "upload", 1, tmp_path / "2.pkl") > 0
    assert not list((home / ".streamlit" / "cache").glob("*.memo"))


@settings(max_examples=60, deadline=None)
@given(top=hs.sampled_from([0, 1, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, 2 ** 40]),
       shape=hs.tuples(hs.integers(0, 3), hs.integers(1, 3), hs.integers(1, 4)),
       seed=hs.integers(0, 2 ** 16))
def test_narrowed_counts_widen_to_the_same_arrays(top, shape, seed):
    rng = np.random.default_rng(seed)
    hist = rng.integers(0, top + 1, shape + (3,), dtype=np.int64)
    if hist.size:
        hist.flat[rng.integers(hist.size)] = top          # the largest count is there
    ins = np.zeros_like(hist)
    counts = {r: ReplayCounts(r, np.arange(shape[0], dtype=np.int64), hist + i, ins)
              for i, r in enumerate(Residency)}
    kept = _narrowed(counts)
    back = _widened(pickle.loads(pickle.dumps(kept)))
    assert back.keys() == counts.keys()
    for r, rc in counts.items():
        assert back[r].residency == rc.residency
        for name in ("ks", "hist", "ins"):
            a, b = getattr(rc, name), getattr(back[r], name)
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
    if hist.size:          # kept in the fewest bytes that hold the largest count
        want = 1 if top < 2 ** 8 else 2 if top < 2 ** 16 else 4 if top < 2 ** 32 else 8
        assert kept[Residency.FIXED][2][0].itemsize == want
