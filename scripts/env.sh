# Source this (`. scripts/env.sh`) after scripts/install.sh: unless a virtual environment is
# already active (the one the install went into), the project environment .venv is activated,
# so `cope` and `python3` are the installed ones.
_cope_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f "$_cope_root/.venv/bin/activate" ]; then
  . "$_cope_root/.venv/bin/activate"
fi
unset _cope_root
