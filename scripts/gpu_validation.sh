#!/usr/bin/env bash
# GPU validation: profile, measure and evaluate a DeepSeek-V2-Lite-geometry trace (all 26 MoE
# layers, real expert shapes) on the CUDA device, at several cache sizes K and CPU-thread counts,
# in under 10 minutes. Installs nothing: run it where `cope` and a CUDA build of torch already work.
# The profile is made on a cut of the model (CUT MoE layers, default 4): shared work is profiled
# per block, so the cut's profile prices all 26 layers. With FULL_PROFILE=1 (default) the full
# model is profiled too and both are evaluated, with both profiling times, to show what the cut
# saves and costs.
#
#   bash scripts/gpu_validation.sh            # results under data/platforms/<gpu-name>/
#
# Knobs (environment): KS (default 8,16,32), THREADS (default "<cores/2>,<cores>", at most 16),
# TOKENS (decode tokens per prompt, default 10), PROMPTS (2), TRIALS (2), CUT (4), FULL_PROFILE (1),
# OUT (output folder).
# Each step has a time limit so the whole run stays inside the budget; the timings are printed
# and kept in run.log next to the results.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
python3 - <<'EOF' || { echo "gpu_validation: no usable CUDA device (torch.cuda.is_available() is False); nothing run" >&2; exit 3; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
command -v cope >/dev/null || { echo "gpu_validation: the cope command is not installed" >&2; exit 3; }

gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0))")
slug=$(printf '%s' "$gpu" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
cores=$(python3 -c "import os; print(len(os.sched_getaffinity(0)))")
max_threads=$(( cores < 16 ? cores : 16 ))
low_threads=$(( max_threads / 2 > 0 ? max_threads / 2 : 1 ))
KS=${KS:-8,16,32}
THREADS=${THREADS:-$low_threads,$max_threads}
TOKENS=${TOKENS:-10}
PROMPTS=${PROMPTS:-2}
TRIALS=${TRIALS:-2}
CUT=${CUT:-4}
FULL_PROFILE=${FULL_PROFILE:-1}
OUT=${OUT:-data/platforms/$slug}
mkdir -p "$OUT"
log="$OUT/run.log"
: > "$log"
say() { echo "[gpu_validation +$(( $(date +%s) - start ))s] $*" | tee -a "$log"; }

say "device: $gpu ($cores host CPUs); K=$KS, CPU threads=$THREADS, $PROMPTS prompts x $TOKENS tokens, $TRIALS trials -> $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv >> "$log" 2>&1 || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$log"

cope synth --model deepseek-v2-lite --prompts "$PROMPTS" --tokens "$TOKENS" --seed 1 \
  --description "gpu_validation evaluation trace" -o "$OUT/trace.parquet" --force | tee -a "$log"
cope synth --model deepseek-v2-lite --prompts 8 --tokens 64 --seed 1 --first-prompt "$PROMPTS" \
  --description "gpu_validation calibration trace" -o "$OUT/calibration.parquet" --force | tee -a "$log"

say "profiling a $CUT-MoE-layer cut (limit 120 s)"
t0=$(date +%s)
timeout 120 cope profile --trace "$OUT/trace.parquet" --layers "$CUT" --device cuda \
  --threads "$THREADS" --contexts 128,1024,4096 --max-samples 25 \
  --raw-samples "$OUT/profile_samples.json" --no-progress -o "$OUT/profile.parquet" --force 2>&1 \
  | tee -a "$log"
say "cut profiled in $(( $(date +%s) - t0 )) s"
if [ "$FULL_PROFILE" = 1 ]; then
  say "profiling all 26 MoE layers, for comparison (limit 180 s)"
  t0=$(date +%s)
  timeout 180 cope profile --trace "$OUT/trace.parquet" --device cuda --threads "$THREADS" \
    --contexts 128,1024,4096 --max-samples 25 --no-progress -o "$OUT/profile-full.parquet" \
    --force 2>&1 | tee -a "$log"
  say "full model profiled in $(( $(date +%s) - t0 )) s"
fi

say "measuring every candidate (limit 300 s)"
timeout 300 cope measure --trace "$OUT/trace.parquet" --calibration "$OUT/calibration.parquet" \
  -K "$KS" --threads "$THREADS" --device cuda --trials "$TRIALS" \
  --profile "$OUT/profile.parquet" --no-progress -o "$OUT/measurements.parquet" --force 2>&1 \
  | tee -a "$log"

say "evaluating"
cope evaluate --trace "$OUT/trace.parquet" --calibration "$OUT/calibration.parquet" \
  --profile "$OUT/profile.parquet" --measurements "$OUT/measurements.parquet" --per-k \
  | tee "$OUT/evaluate.txt" | tee -a "$log"
cope evaluate --trace "$OUT/trace.parquet" --calibration "$OUT/calibration.parquet" \
  --profile "$OUT/profile.parquet" --measurements "$OUT/measurements.parquet" --per-k --json \
  > "$OUT/evaluate.json"
if [ -f "$OUT/profile-full.parquet" ]; then
  say "evaluating the full model's own profile, for comparison"
  cope evaluate --trace "$OUT/trace.parquet" --calibration "$OUT/calibration.parquet" \
    --profile "$OUT/profile-full.parquet" --measurements "$OUT/measurements.parquet" \
    | tee "$OUT/evaluate-full-profile.txt" | tee -a "$log"
fi
say "done in $(( $(date +%s) - start )) s; results in $OUT"
