"""llama.cpp as COPE models it: everything that is llama.cpp's and not COPE's, in one package,
one module per concept, in four folders by job, each above the ones it reads (an import-linter
layers contract; docs/design.md#the-code). The rest of the code imports this face only
(tests/test_architecture.py fails on a deep import).

* :mod:`.placement`: how it places tensors and counts device memory (:mod:`.placement.vram`:
  the GGUF's tensor table, ``-ngl``, ``--n-cpu-moe``, ``-ot``, the KV cache and compute
  buffer), its ``--fit`` (:mod:`.placement.fit`) and the one command builder for the whole
  family, settings in, argv out, every tensor pattern (:mod:`.placement.command`);
* :mod:`.cache`: its MoE expert cache: the replay port (:mod:`.cache.moe_cache`, kernels in
  ``_cache_kernels``), the size cliff (``cache_cliff``), the pricing and search
  (``cache_search``), the class-LRU's inferred readings (``cache_readings``) and the server's own
  cache counters in its log (``server_log``);
* :mod:`.answer`: the answer, made once: which build has which flag, cache and default
  (``builds``); the settings it runs with (``settings``: ``-c``, ``-ctk``/``-ctv``, ``-fitt``);
  the prompt model, a prompt's time to first token as llama.cpp evaluates it (``prompt``); the
  request as the objective, priced at each ``-ub`` (``request``; the context grows to hold it
  there, ``Request.context_for``); the one rule for whether our flags lead (``rule``); the
  default priced, as facts (``baseline``); the record a policy keeps (``cache_record``) and the
  notes its export carries (``cache_notes``); the recommended command, its verdict and the typed
  offers beside it, every decode figure at one operating point (``answer``);
* :mod:`.bench`: llama-bench: its result files (``bench_file``), scored against predictions
  (``bench_eval``), run (``bench_run``), raced (``bench_verify``) and recorded
  (``bench_record``).
"""
from __future__ import annotations

from .answer.answer import Kind, LlamaAnswer, Offer, Verdict, cpu_only_answer, llamacpp_answer
from .answer.builds import (
    BUILD_EVIDENCE,
    LATEST_BUILD,
    Build,
    build_rows,
    first_build,
    latest,
    milestones,
    parse_build,
)
from .answer.cache_notes import build_lines, cache_note_lines, row_spread, spread_text
from .answer.cache_record import CLASS_LRU_CANDIDATE, CacheRecord, llamacpp_record
from .answer.devices_answer import (
    Cards,
    DevicesAnswer,
    device_names,
    devices_answer,
    devices_memory,
)
from .answer.prompt import (
    PromptRun,
    card_efficiency,
    prompt_time,
    prompt_unpriced,
    selection_rates,
)
from .answer.prompt_rates import (
    PAGEABLE_PRIOR_SHARE,
    host_pinned,
    staging_bandwidth,
    unpriced_reason,
)
from .answer.request import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    Request,
    RequestSetting,
    ttft_by_experts,
)
from .answer.rule import share_text
from .answer.settings import LlamaSettings, llama_settings, n_cpu_moe_memory
from .bench.bench_eval import BenchEvaluation, match_bench_rows, score_bench_rows
from .bench.bench_file import read_llama_bench
from .bench.bench_record import (
    bench_race_record,
    is_bench_record,
    read_bench_record,
    write_bench_record,
)
from .bench.bench_refit import read_prompt_refit, refit_lines, refit_prompt, write_prompt_refit
from .bench.bench_run import probe_bench_build, run_bench
from .bench.bench_verify import BenchSettings, plan_bench_race, run_bench_race
from .cache.cache_cliff import cliff_mib
from .cache.cache_search import CACHE_LABEL, placement_tpot, search_cache
from .cache.moe_cache import (
    READINGS,
    TUNER_SHARES,
    CacheConfig,
    CacheVersion,
    cache_layout,
    cache_mib_for_bytes,
    replay_cache,
)
from .cache.server_log import check_cache_log, read_cache_log
from .placement.command import LlamaFlags
from .placement.device_search import blocks_tpot
from .placement.devices import split_counts
from .placement.fit import FIT_MARGIN, FIT_NAME
from .placement.vram import read_llama_model

__all__ = [
    "Cards", "DevicesAnswer", "blocks_tpot", "device_names", "split_counts", "devices_answer",
    "devices_memory",
    "LATEST_BUILD", "LlamaAnswer", "Offer", "Kind", "Verdict", "cpu_only_answer",
    "PromptRun", "prompt_time", "prompt_unpriced", "selection_rates", "card_efficiency",
    "PAGEABLE_PRIOR_SHARE", "host_pinned", "staging_bandwidth", "unpriced_reason",
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
    "write_bench_record", "read_prompt_refit", "refit_lines", "refit_prompt",
    "write_prompt_refit",
]
