#!/usr/bin/env bash
# Install COPE Explorer and its test tools into the current Python environment.
# torch is pinned first: the CPU build 2.13.0 satisfies pyproject's range, so the project
# install below does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
