#!/usr/bin/env bash
# Install COPE Explorer and its test tools, then check that the install works.
#
# Into the active virtual environment when there is one ($VIRTUAL_ENV); otherwise into the
# project environment .venv (ignored by git), made on first use from `python3` (or $PYTHON)
# without the system's site-packages, so that only what pyproject.toml declares is there: the
# same on a stock Debian 12 / Ubuntu 24.04 Python (externally managed, PEP 668) as on any other.
# `. scripts/env.sh` puts .venv on PATH afterwards (scripts/quickstart.sh does that).
#
# torch is pinned first: the CPU build 2.13.0 satisfies pyproject's range, so the project
# install below does not pull a multi-GB CUDA build. pip runs again only when pyproject.toml
# changed since the last install into that environment (the install is editable; delete .venv
# to start afresh). Ends with every module of the package imported and `cope --help` run, so a
# missing dependency fails here, in seconds, by name.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "install: $PY not found; COPE Explorer needs Python 3.11 or newer (set PYTHON=...)" >&2
  exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "install: $PY is Python $("$PY" -c 'import platform; print(platform.python_version())')," \
       "COPE Explorer needs 3.11 or newer (set PYTHON=...)" >&2
  exit 1
fi
if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "install: creating the project environment .venv from $PY (no system site-packages)"
    if ! "$PY" -m venv .venv; then
      rm -rf .venv
      echo "install: $PY could not make a virtual environment (on Debian/Ubuntu:" \
           "apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
  PY=.venv/bin/python
else
  PY="$VIRTUAL_ENV/bin/python"
fi
PIP=(--quiet --disable-pip-version-check --no-input)
# The install is editable, so only a changed pyproject.toml (or another checkout) needs pip again:
# a stamp in the environment records what was installed from where.
stamp="$("$PY" -c 'import sys; print(sys.prefix)')/.cope-explorer-install"
want="$(pwd) $("$PY" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -f "$stamp"
  "$PY" -m pip install "${PIP[@]}" "torch==2.13.0"
  "$PY" -m pip install "${PIP[@]}" -e ".[test]"
  echo "$want" > "$stamp"
fi

# Fail fast: every module imports (lazily imported ones too) and the command line answers.
if ! "$PY" - <<'PY'
import importlib
import logging
import pkgutil

logging.disable(logging.WARNING)   # Streamlit's "no runtime" notes when its modules load bare
import cope_core

for mod in pkgutil.walk_packages(cope_core.__path__, "cope_core."):
    importlib.import_module(mod.name)
PY
then
  echo "install: the package does not import in $("$PY" -c 'import sys; print(sys.prefix)')" \
       "(the error above); every third-party import must be declared in pyproject.toml" >&2
  exit 1
fi
if ! "$(dirname "$PY")/cope" --help >/dev/null; then
  echo "install: \`cope --help\` failed (the error above)" >&2
  exit 1
fi
echo "install: cope-explorer $("$PY" -c 'from cope_core.version import __version__; print(__version__)')" \
     "ready in $("$PY" -c 'import sys; print(sys.prefix)')"
