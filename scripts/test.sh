#!/usr/bin/env bash
# README command 2, which CI runs after the main job (.ci/run). Install (which ends by importing
# every module and running `cope --help`, so a broken install fails in seconds), check that every
# third-party import is declared (deptry), lint (ruff), check the pipeline's import contracts
# (import-linter), type-check the package (mypy), set up the runtimes the export tests run (the slow part, cached) and run the
# whole test suite. "No tests collected" (pytest exit 5) is a failure. Extra arguments go to
# pytest (e.g. -m "not slow" for the quick loop).
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
# llama.cpp and vLLM for the export tests (cached under the user cache folder; a runtime that
# cannot be set up makes its tests skip with the reason)
bash scripts/runtimes.sh
python3 -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
