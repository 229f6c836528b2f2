#!/usr/bin/env bash
# Install COPE Explorer and its test tools.
#
# Into the active virtual environment when there is one, else into whatever `python3` is --
# unless that Python is externally managed (PEP 668: stock Debian 12, Ubuntu 24.04), which
# refuses `pip install`; then a project virtual environment .venv (ignored by git) is created
# and used. `. scripts/env.sh` puts it on PATH afterwards (the README's commands do that).
#
# torch is pinned first: the CPU build 2.13.0 satisfies pyproject's range, so the project
# install below does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
externally_managed() {
  "$1" - <<'PY'
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if os.path.exists(marker) and sys.prefix == sys.base_prefix else 1)
PY
}
if [ -z "${VIRTUAL_ENV:-}" ] && { [ -x .venv/bin/python ] || externally_managed "$PY"; }; then
  if [ ! -x .venv/bin/python ]; then
    echo "install: $PY is externally managed (PEP 668); creating the project environment .venv"
    "$PY" -m venv .venv
  fi
  PY=.venv/bin/python
fi
"$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
