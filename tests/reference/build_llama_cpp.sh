#!/usr/bin/env bash
# Build llama.cpp (CPU only) from the sources vendored in PyPI's llama-cpp-python sdist.
# Outputs: $BUILD_ROOT/llama.cpp/build/bin/{llama-quantize,llama-server,llama-bench,llama-tokenize}
# NOTE: on a VM whose CPU advertises AMX but faults on `ldtilecfg` (this one), the -march=native
# build crashes in ggml_backend_amx_mul_mat; run llama-server/llama-bench with --no-repack
# (llama-bench: --repack 0), or rebuild adding -DCMAKE_C_FLAGS/-DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16".
# Usage: VENV=/work/pyref BUILD_ROOT=/work/llama.cpp-build ./build_llama_cpp.sh
set -euo pipefail
VENV=${VENV:-/work/pyref}
BUILD_ROOT=${BUILD_ROOT:-/work/llama.cpp-build}
LLCPP_PY_VERSION=${LLCPP_PY_VERSION:-0.3.36}
JOBS=${JOBS:-2}

mkdir -p "$BUILD_ROOT"
cd "$BUILD_ROOT"

# cmake from PyPI (and scikit-build-core so pip can prepare the sdist's metadata
# without building cmake from source in an isolated build env).
"$VENV/bin/pip" install -q cmake scikit-build-core

if [ ! -f "llama_cpp_python-$LLCPP_PY_VERSION.tar.gz" ]; then
  # --no-binary only for this package and --no-build-isolation: with
  # `--no-binary :all:` pip would compile cmake/ninja from source just to read metadata.
  "$VENV/bin/pip" download --no-deps --no-binary llama-cpp-python --no-build-isolation \
      "llama-cpp-python==$LLCPP_PY_VERSION" -d "$BUILD_ROOT"
fi
if [ ! -d "llama_cpp_python-$LLCPP_PY_VERSION" ]; then
  tar xzf "llama_cpp_python-$LLCPP_PY_VERSION.tar.gz"
fi
rm -f llama.cpp
ln -s "llama_cpp_python-$LLCPP_PY_VERSION/vendor/llama.cpp" llama.cpp
cd llama.cpp

"$VENV/bin/cmake" -S . -B build -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
nice -n 19 "$VENV/bin/cmake" --build build --config Release -j"$JOBS" \
    --target llama-quantize llama-server llama-bench llama-tokenize
ls -la build/bin/
