#!/usr/bin/env bash
# Write the llama-bench fixtures of tests/test_llamabench.py: real outputs of llama.cpp b11434's
# llama-bench (the Vulkan build of scripts/runtimes_vulkan.sh) on the tests' tiny random-weight
# qwen3moe GGUF (tests/llama_tools.py write_tiny_moe at test_llamabench.TINY's sizes).
#   cpu.*      no Vulkan device visible, -ngl 0: CPU only
#   offload.*  the software Vulkan device (Mesa lavapipe), -ngl 99, -ncmoe 0,1,2 by
#              -ot token_embd=CPU (where it is anyway) and -ot exps=CPU
#   prompt.json  prompt tests (pp64) on the same device, -ncmoe 0 and 2, -ub 16 (below op
#              offload's 32 tokens) and 32, op offload on and off (-nopo)
# Run from the repository root: bash tests/data/llama-bench/write.sh
set -euo pipefail
. scripts/env.sh
OUT=tests/data/llama-bench
VK="${COPE_RUNTIMES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cope-explorer}/llama.cpp-b11434-vulkan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -c "
import sys; from pathlib import Path; sys.path.insert(0, 'tests')
from llama_tools import write_tiny_moe; from test_llamabench import TINY
write_tiny_moe(Path('$tmp/tiny-moe.gguf'), **TINY)"
export LD_LIBRARY_PATH="$VK/bin"
for fmt in json jsonl csv md; do
  env -u GGML_VK_VISIBLE_DEVICES "$VK/bin/llama-bench" -m "$tmp/tiny-moe.gguf" \
    -p 0 -n 8 -r 2 -t 2 -ngl 0 -o "$fmt" > "$OUT/cpu.$fmt"
  GGML_VK_VISIBLE_DEVICES=0 "$VK/bin/llama-bench" -m "$tmp/tiny-moe.gguf" \
    -p 0 -n 8 -r 2 -t 2 -ngl 99 -ncmoe 0,1,2 -ot "token_embd=CPU,exps=CPU" -o "$fmt" \
    > "$OUT/offload.$fmt"
done
GGML_VK_VISIBLE_DEVICES=0 "$VK/bin/llama-bench" -m "$tmp/tiny-moe.gguf" \
  -p 64 -n 0 -r 2 -t 2 -ngl 99 -ncmoe 0,2 -ub 16,32 -nopo 0,1 -o json > "$OUT/prompt.json"
# the temporary folder's name is in model_filename: write a stable one
sed -i "s#$tmp/#/tmp/#g" "$OUT"/cpu.* "$OUT"/offload.* "$OUT"/prompt.json
