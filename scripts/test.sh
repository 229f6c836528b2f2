#!/usr/bin/env bash
# README command 2, which CI runs after the main job (.ci/run). Install (which ends by importing
# every module and running `cope --help`, so a broken install fails in seconds), check that every
# third-party import is declared (deptry), lint (ruff), check the pipeline's import contracts
# (import-linter), type-check the package (mypy), set up the runtimes the export tests run (the slow part, cached) and run the
# whole test suite. "No tests collected" (pytest exit 5) is a failure. Extra arguments go to
# pytest (e.g. -m "not slow" for the quick loop).
#
# A runtime the export tests need (llama.cpp, vLLM, exllamav3, FreeToken, fastllm: see
# scripts/runtimes.sh) that cannot be set up stops this command before pytest, naming the runtime
# and its log, and its tests fail rather than skip when pytest is run by hand. On a machine that
# cannot have one (no compiler, no network for the first set-up) run
#   COPE_ALLOW_MISSING_RUNTIMES=1 bash scripts/test.sh
# to let those tests skip instead, each saying which runtime is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
. scripts/env.sh
# the whole tree against pyproject.toml, then the runtime code (cope_core, app.py, pages)
# against its runtime dependencies alone: importing a test-only package there is an error
python3 -m deptry . || exit 1
python3 -m deptry . --optional-dependencies-dev-groups test \
  --extend-exclude "tests|benchmarks|scripts|notebooks" || exit 1
python3 -m ruff check . || exit 1
lint-imports || exit 1
python3 -m mypy || exit 1          # the package, type-checked ([tool.mypy] in pyproject.toml)
# the runtimes of the export tests (cached under the user cache folder); one that cannot be set
# up is an error here unless COPE_ALLOW_MISSING_RUNTIMES=1 (above)
if ! bash scripts/runtimes.sh; then
  echo "error: a runtime the tests need could not be set up (named above); set" \
       "COPE_ALLOW_MISSING_RUNTIMES=1 to run the suite without it (its tests then skip)" >&2
  exit 1
fi
python3 -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
