#!/usr/bin/env bash
# Regenerate the shipped example inputs under data/examples/ (synthetic traces, analytic profiles).
set -euo pipefail
cd "$(dirname "$0")/../data/examples"
cope synth --model qwen3-30b-a3b --prompts 8 --tokens 128 --seed 11 --description "example evaluation trace" -o qwen3-30b-a3b-trace.parquet --force
cope synth --model qwen3-30b-a3b --prompts 8 --tokens 128 --seed 12 --description "example calibration trace" -o qwen3-30b-a3b-calibration.parquet --force
cope profile --analytic rtx4090 --model qwen3-30b-a3b -o qwen3-30b-a3b-rtx4090-analytic.parquet --force
cope synth --model deepseek-v2-lite --prompts 8 --tokens 128 --seed 21 -o deepseek-v2-lite-trace.parquet --force
cope synth --model deepseek-v2-lite --prompts 8 --tokens 128 --seed 22 -o deepseek-v2-lite-calibration.parquet --force
cope profile --analytic a100-80gb --model deepseek-v2-lite -o deepseek-v2-lite-a100-analytic.parquet --force
