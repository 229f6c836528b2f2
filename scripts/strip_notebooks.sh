#!/usr/bin/env bash
# Strip outputs, execution counts and run-specific metadata from notebooks, with nbstripout.
#
# Git keeps the notebooks without outputs, so diffs stay readable and no stale numbers are
# committed; tests/test_notebooks.py checks it with these same flags. Cell ids are kept (they
# are written by hand), and language_info is reduced to the language name (its version changes
# with every interpreter that ran the notebook).
#
#   bash scripts/strip_notebooks.sh                      # strip notebooks/*.ipynb in place
#   bash scripts/strip_notebooks.sh --dry-run FILE...    # list what would change
#   bash scripts/strip_notebooks.sh --textconv FILE      # print FILE stripped
set -euo pipefail
cd "$(dirname "$0")/.."
keys=""
for k in codemirror_mode file_extension mimetype nbconvert_exporter pygments_lexer version; do
  keys+=" metadata.language_info.$k"
done
if [ "$#" -eq 0 ]; then
  set -- notebooks/*.ipynb
fi
exec python3 -m nbstripout --keep-id --extra-keys "${keys# }" "$@"
