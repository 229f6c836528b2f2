"""llama.cpp as COPE models it: everything that is llama.cpp's and not COPE's, in one package,
one module per concept (docs/design.md#the-code). The rest of the code imports this face only
(tests/test_architecture.py fails on a deep import).

* how it places tensors and counts device memory: :mod:`.vram` (the GGUF's tensor table, ``-ngl``,
  ``--n-cpu-moe``, ``-ot``, the KV cache and compute buffer); its ``--fit``: :mod:`.fit`; the
  settings it runs with (``-c``, ``-ctk``/``-ctv``, ``-fitt``): :mod:`.settings`;
* the one command builder (settings in, argv out; every tensor pattern): :mod:`.command`;
  which build has which flag, cache and default, and the build a user runs: :mod:`.builds`;
* the answer, made once: llama.cpp's default priced, as facts (:mod:`.baseline`); the prompt
  model, a prompt's time to first token as llama.cpp evaluates it (:mod:`.prompt`); the request
  as the objective, priced at each ``-ub`` (:mod:`.request`; the context grows to hold it there,
  ``Request.context_for``); the one rule for whether our flags lead (:mod:`.rule`); the
  recommended command, its verdict and the typed offers beside it, every decode figure at one
  operating point (:mod:`.answer`);
* its MoE expert cache: the replay port (:mod:`.moe_cache`, kernels in ``_cache_kernels``), the
  size cliff (:mod:`.cache_cliff`), the pricing and search (:mod:`.cache_search`), the class-LRU's
  inferred readings (:mod:`.cache_readings`), the record a policy keeps (:mod:`.cache_record`) and
  the notes its export carries (:mod:`.cache_notes`);
* llama-bench: its result files (:mod:`.bench_file`), scored against predictions
  (:mod:`.bench_eval`), run (:mod:`.bench_run`), raced (:mod:`.bench_verify`) and recorded
  (:mod:`.bench_record`); the server's own cache counters in its log (:mod:`.server_log`).
"""
from __future__ import annotations

from .answer import Kind, LlamaAnswer, Offer, Verdict, cpu_only_answer, llamacpp_answer
from .bench_eval import BenchEvaluation, match_bench_rows, score_bench_rows
from .bench_file import read_llama_bench
from .bench_record import bench_race_record, is_bench_record, read_bench_record, write_bench_record
from .bench_run import probe_bench_build, run_bench
from .bench_verify import BenchSettings, plan_bench_race, run_bench_race
from .builds import (
    BUILD_EVIDENCE,
    LATEST_BUILD,
    Build,
    build_rows,
    first_build,
    latest,
    milestones,
    parse_build,
)
from .cache_cliff import cliff_mib
from .cache_notes import build_lines, cache_note_lines, row_spread, spread_text
from .cache_record import CLASS_LRU_CANDIDATE, CacheRecord, llamacpp_record
from .cache_search import CACHE_LABEL, placement_tpot, search_cache
from .command import LlamaFlags
from .fit import FIT_MARGIN, FIT_NAME
from .moe_cache import (
    READINGS,
    TUNER_SHARES,
    CacheConfig,
    CacheVersion,
    cache_layout,
    cache_mib_for_bytes,
    replay_cache,
)
from .prompt import PromptRun, prompt_time, selection_rates
from .request import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    Request,
    RequestSetting,
    ttft_by_experts,
)
from .rule import share_text
from .server_log import check_cache_log, read_cache_log
from .settings import LlamaSettings, llama_settings, n_cpu_moe_memory
from .vram import read_llama_model

__all__ = [
    "LATEST_BUILD", "LlamaAnswer", "Offer", "Kind", "Verdict", "cpu_only_answer",
    "PromptRun", "prompt_time", "selection_rates",
    "Request", "RequestSetting", "ttft_by_experts", "DEFAULT_GEN_TOKENS", "DEFAULT_PROMPT_TOKENS",
    "BUILD_EVIDENCE", "build_rows",
    "CACHE_LABEL", "CLASS_LRU_CANDIDATE", "FIT_MARGIN", "FIT_NAME", "READINGS",
    "TUNER_SHARES", "BenchEvaluation", "BenchSettings", "Build", "CacheConfig", "CacheRecord",
    "CacheVersion", "LlamaFlags", "LlamaSettings", "bench_race_record",
    "build_lines", "cache_layout", "cache_mib_for_bytes", "cache_note_lines", "check_cache_log",
    "cliff_mib", "first_build", "is_bench_record", "latest", "llama_settings", "llamacpp_answer",
    "llamacpp_record", "match_bench_rows", "milestones", "n_cpu_moe_memory", "parse_build",
    "placement_tpot", "plan_bench_race", "probe_bench_build", "read_bench_record",
    "read_cache_log", "read_llama_bench", "read_llama_model", "replay_cache", "row_spread",
    "run_bench", "run_bench_race", "score_bench_rows", "search_cache", "share_text", "spread_text",
    "write_bench_record",
]
