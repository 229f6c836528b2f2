"""llama.cpp as COPE models it: everything that is llama.cpp's and not COPE's, in one package,
one module per concept (docs/design.md#the-code). The rest of the code imports this face only.

* how it places tensors and counts device memory: :mod:`.vram` (the GGUF's tensor table, ``-ngl``,
  ``--n-cpu-moe``, ``-ot``, the KV cache and compute buffer); its ``--fit``: :mod:`.fit`; the
  default a user gets without our flags, priced: :mod:`.default`;
* the command line it is given: :mod:`.command`;
* its MoE expert cache: the replay port (:mod:`.moe_cache`, kernels in ``_cache_kernels``), the
  size cliff (:mod:`.cache_cliff`), the pricing and search (:mod:`.cache_search`), the class-LRU's
  inferred readings (:mod:`.cache_readings`), the record a policy keeps (:mod:`.cache_record`) and
  the notes its export carries (:mod:`.cache_notes`);
* llama-bench: its result files (:mod:`.bench_file`), scored against predictions
  (:mod:`.bench_eval`), run (:mod:`.bench_run`), raced (:mod:`.bench_verify`) and recorded
  (:mod:`.bench_record`); the server's own cache counters in its log (:mod:`.server_log`).
"""
from __future__ import annotations

from .bench_eval import BenchEvaluation, match_rows, score_rows
from .bench_file import BenchRow, read_llama_bench
from .bench_record import bench_record, is_bench_record, read_bench_record, write_bench_record
from .bench_run import BenchBuild, probe_build, run_bench
from .bench_verify import BenchSettings, plan, race
from .cache_cliff import cliff_mib
from .cache_notes import cache_notes, row_spread, spread_text
from .cache_record import CLASS_LRU, CacheRecord, LlamaSettings, llamacpp_record
from .cache_search import LABEL, placement_tpot, search
from .command import EXPERT_TENSORS, cache_flags, llamacpp_flags, override_regex
from .default import KEEP_LEVEL, baseline_of, llama_settings, n_cpu_moe_memory
from .fit import FIT_MARGIN, FIT_NAME
from .moe_cache import (
    READINGS,
    CacheConfig,
    CacheVersion,
    cache_layout,
    cache_mib_for_bytes,
    replay_cache,
)
from .server_log import check_cache_log, read_cache_log
from .vram import read_llama_model

__all__ = [
    "CLASS_LRU", "EXPERT_TENSORS", "FIT_MARGIN", "FIT_NAME", "KEEP_LEVEL", "LABEL", "READINGS",
    "BenchBuild", "BenchEvaluation", "BenchRow", "BenchSettings", "CacheConfig", "CacheRecord",
    "CacheVersion", "LlamaSettings", "baseline_of", "bench_record", "cache_flags", "cache_layout",
    "cache_mib_for_bytes", "cache_notes", "check_cache_log", "cliff_mib", "is_bench_record",
    "llama_settings", "llamacpp_flags", "llamacpp_record", "match_rows", "n_cpu_moe_memory",
    "override_regex", "placement_tpot", "plan", "probe_build", "race", "read_bench_record",
    "read_cache_log", "read_llama_bench", "read_llama_model", "replay_cache", "row_spread",
    "run_bench", "score_rows", "search", "spread_text", "write_bench_record",
]
