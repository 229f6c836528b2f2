#!/usr/bin/env bash
# Install, then run the whole test suite. "No tests collected" (pytest exit 5) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
python3 -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
