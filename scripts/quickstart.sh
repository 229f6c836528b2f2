#!/usr/bin/env bash
# README command 1, and what CI runs as the main job (.ci/run): install, predict the best
# offloading policy for the shipped Qwen3-30B-A3B example at a 16 GiB VRAM budget (prints every
# candidate and the winner), then serve the explorer on the shipped data at
# http://localhost:8501 (COPE_PORT to change it) until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. scripts/env.sh
cope predict --trace data/examples/qwen3-30b-a3b-trace.parquet \
  --calibration data/examples/qwen3-30b-a3b-calibration.parquet \
  --profile data/examples/qwen3-30b-a3b-rtx4090-analytic.parquet --vram-gib 16
exec cope app --headless --port "${COPE_PORT:-8501}"
