"""The explorer's results kept across server starts (cope_core.app.persisted): a second server
finds the first one's sweep, files and exported policy on disk and gets the same numbers without
computing them; a changed library fingerprint, or an upload, computes afresh.

Each "server" is a fresh Python process with the storage a real server gives ``st.cache_data``
(Streamlit's ``LocalDiskCacheStorageManager``; bare mode and ``AppTest`` keep caches in memory
only) and ``HOME`` in a temp folder, where Streamlit keeps ``~/.streamlit/cache``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SERVER = r"""
import json, pickle, sys
from streamlit.runtime.caching import cache_data_api
from streamlit.web.cache_storage_manager_config import create_default_cache_storage_manager
cache_data_api._data_caches.get_storage_manager = create_default_cache_storage_manager
from tiny import tiny_profile, tiny_trace
from cope_core import parquet_io
from cope_core.app import persisted, policies, results, whatif
from cope_core.app.dataset import assemble
from cope_core.matrix import CANDIDATE_IDS

mode, trace_file, out = sys.argv[1:4]
if mode == "changed":                       # another version of the library
    persisted.fingerprint = lambda: "another library"
swept, reads, built = [], [], []
_swept = results._swept
results._swept = lambda *a: swept.append(1) or _swept(*a)
_build = policies.build_policy
policies.build_policy = lambda *a, **k: built.append(1) or _build(*a, **k)
origin = {"trace": "upload t.parquet" if mode == "upload" else "example t.parquet",
          "profile": "example p.parquet"}
profile = tiny_profile()
ds = assemble("tiny", tiny_trace(), None, profile, None, origin)
view = results.sweep_view(ds, profile.operating_points()[0], "cope", CANDIDATE_IDS)
trace = persisted.read_shipped("trace", trace_file, "stamp",
                               lambda p: reads.append(1) or parquet_io.read_trace(p))
gib = whatif.budget_range(ds.trace.model)[1]          # every expert fits: llama.cpp's search too
policy = policies.policy_for(ds, gib, profile.operating_points()[0], "best")
with open(out, "wb") as fh:
    pickle.dump((view.frame, view.warnings, trace, json.dumps(policy.to_dict())), fh)
print(json.dumps({"swept": len(swept), "read": len(reads), "built": len(built)}))
"""


def _start(home: Path, mode: str, trace_file: Path, out: Path) -> dict:
    """One server's first sweep and read; how often each was computed."""
    tests = Path(__file__).resolve().parent
    env = dict(os.environ, HOME=str(home),
               PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", SERVER, mode, str(trace_file), str(out)],
                          env=env, capture_output=True, text=True, timeout=300,
                          cwd=tests.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _same(a: Path, b: Path, same_run: bool = True) -> None:
    """The same numbers; ``same_run``: the same policy file too, down to its creation time (one
    computation, found again on disk)."""
    (fa, wa, ta, pa), (fb, wb, tb, pb) = (pickle.loads(p.read_bytes()) for p in (a, b))
    pa, pb = json.loads(pa), json.loads(pb)
    if not same_run:
        for p in (pa, pb):
            del p["provenance"]["created"]
    assert pa == pb                               # the policy, its llama.cpp record with it
    pd.testing.assert_frame_equal(fa, fb, check_exact=True)
    np.testing.assert_equal(fa.attrs, fb.attrs)
    assert wa == wb
    for name in ("prompt_ids", "prompt_start", "context", "routed", "predicted"):
        np.testing.assert_array_equal(getattr(ta, name), getattr(tb, name))


def _cache_files(home: Path) -> list[str]:
    folder = home / ".streamlit" / "cache"
    return sorted(p.name for p in folder.glob("*.memo")) if folder.is_dir() else []


@pytest.mark.slow
def test_second_start_reads_the_sweep_and_files_from_disk(tmp_path, files):
    home = tmp_path / "home"
    home.mkdir()
    first = _start(home, "shipped", files["trace"], tmp_path / "1.pkl")
    assert first == {"swept": 1, "read": 1, "built": 1}
    assert len(_cache_files(home)) == 4    # the sweep, its replay, the trace file, the policy
    second = _start(home, "shipped", files["trace"], tmp_path / "2.pkl")
    assert second == {"swept": 0, "read": 0, "built": 0}      # all unpickled from disk
    _same(tmp_path / "1.pkl", tmp_path / "2.pkl")
    # another library version misses both, computes the same numbers and keeps its own files
    changed = _start(home, "changed", files["trace"], tmp_path / "3.pkl")
    assert changed == {"swept": 1, "read": 1, "built": 1}
    assert len(_cache_files(home)) == 8
    _same(tmp_path / "1.pkl", tmp_path / "3.pkl", same_run=False)


@pytest.mark.slow
def test_an_upload_is_never_kept_on_disk(tmp_path, files):
    home = tmp_path / "home"
    home.mkdir()
    for out in ("1.pkl", "2.pkl"):
        got = _start(home, "upload", files["trace"], tmp_path / out)
        assert got["swept"] == got["built"] == 1  # priced and searched afresh by every server
    # only the shipped file's read is kept (the test reads it as a shipped file)
    assert len(_cache_files(home)) == 1
    _same(tmp_path / "1.pkl", tmp_path / "2.pkl", same_run=False)


def test_only_shipped_files_and_catalog_choices_are_kept(trace, profile):
    from cope_core.app.dataset import assemble
    from cope_core.app.persisted import shipped

    def ds(origin: dict[str, str], prof=profile):
        return assemble("k", trace, None, prof, None, origin)
    assert shipped(ds({"trace": "example t.parquet", "profile": "example p.parquet"}))
    assert shipped(ds({"trace": "SYNTHETIC, made here as the shipped examples'",
                       "profile": "ANALYTIC, made here (rtx4090)", "model": "catalog m in Q4"}))
    assert not shipped(ds({"trace": "example t.parquet", "profile": "upload p.parquet"}))
    assert not shipped(ds({"trace": "example t.parquet", "model": "upload m.gguf (not used)"}))
    mine = dataclasses.replace(profile, platform={**(profile.platform or {}), "machine": "m"})
    assert not shipped(ds({"trace": "example t.parquet", "profile": "your machine m"}, mine))


def test_the_explorer_imports_no_numba():
    """numba loads with the first kernel: a restarted server whose first page comes from disk
    neither imports it nor scipy (which numba imports), about 0.3 s of its first page."""
    code = ("import sys; from cope_core.app import results, session, figures, persisted, "
            "llamacpp_view, timeline; import cope_core.cli; "
            "print(sorted(m for m in ('numba', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
