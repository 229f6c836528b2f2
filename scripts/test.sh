#!/usr/bin/env bash
# Install (and set up the runtimes the export tests run), then lint (ruff), check the
# pipeline's import layers (import-linter) and run the whole test suite. "No tests collected" (pytest exit 5) is a failure. Extra arguments go to
# pytest (e.g. -m "not slow" for the quick loop).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
. scripts/env.sh
# llama.cpp and vLLM for the export tests (cached under the user cache folder; a runtime that
# cannot be set up makes its tests skip with the reason)
bash scripts/runtimes.sh
python3 -m ruff check . || exit 1
lint-imports || exit 1
python3 -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
