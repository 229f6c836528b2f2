# Sourced by scripts/runtimes.sh and scripts/runtimes_vulkan.sh (from the source tree's root):
# the cache folder the runtimes are kept in, its logs folder, the interpreter that installs, the
# one that checks the parsers import, and the build's job count. The cache folder is the first
# argument given to `source` when there is one (runtimes_vulkan.sh passes its own), else
# COPE_RUNTIMES_DIR, else the user cache folder.
CACHE="${1:-${COPE_RUNTIMES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cope-explorer}}"
LOGS="$CACHE/logs"
mkdir -p "$CACHE" "$LOGS"
PY=${PYTHON:-python3}
# what imports the runtimes' parsers to check them: the active environment's interpreter (they
# import the project's dependencies, which a bare PYTHON, the one CI makes the .venv from, lacks)
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  CHECK_PY="$VIRTUAL_ENV/bin/python"
else
  CHECK_PY="$PY"
fi
JOBS=$(nproc 2>/dev/null || echo 2)
