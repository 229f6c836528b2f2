# Source this (`. scripts/env.sh`) after scripts/install.sh: when the install made the project
# environment .venv (an externally managed Python), it is activated, so `cope` and `python3`
# are the installed ones; otherwise nothing changes.
_cope_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f "$_cope_root/.venv/bin/activate" ]; then
  . "$_cope_root/.venv/bin/activate"
fi
unset _cope_root
