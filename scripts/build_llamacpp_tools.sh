#!/usr/bin/env bash
# Build llama.cpp's own tools (llama-server, llama-bench, llama-quantize, llama-perplexity) from the
# llama.cpp source vendored in the pinned llama-cpp-python sdist: the same llama.cpp edge runs on,
# so `edge bench http --compare llama-server` and `edge bench engine --llama-bench` measure what a
# user would otherwise run, built from the same code. Nothing else is downloaded (the server's web
# UI is not built; HTTPS support is off).
#
#   scripts/build_llamacpp_tools.sh [OUT_DIR]     (default .cache/llamacpp-tools)
#
# Environment: JOBS (default: nproc), TOOLS (default: the four above), EXTRA_CMAKE_ARGS and
# BUILD_SUFFIX for a variant build next to the default one (e.g. BUILD_SUFFIX=-noomp
# EXTRA_CMAKE_ARGS=-DGGML_OPENMP=OFF TOOLS=llama-bench: ggml's own threadpool instead of OpenMP,
# as scripts/bench_thread_wait.py compares; or the CUDA flags of native/recipes/*.env).
# Idempotent: an existing build is reused. Binaries end up in OUT_DIR/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.cache/llamacpp-tools}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-.venv/bin/python}"
VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
SRC="$OUT/llama_cpp_python-$VERSION"
if [ ! -d "$SRC/vendor/llama.cpp" ]; then
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$OUT/sdist"
  tar -xzf "$OUT/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$OUT"
fi
BUILD="$OUT/build${BUILD_SUFFIX:-}"
# shellcheck disable=SC2086
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF ${EXTRA_CMAKE_ARGS:-} >"$BUILD.cmake.log" 2>&1 \
  || { tail -30 "$BUILD.cmake.log"; exit 1; }
TOOLS="${TOOLS:-llama-server llama-bench llama-quantize llama-perplexity}"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target $TOOLS >"$BUILD.build.log" 2>&1 \
  || { tail -40 "$BUILD.build.log"; exit 1; }
mkdir -p "$OUT/bin${BUILD_SUFFIX:-}"
for t in $TOOLS; do
  cp "$BUILD/bin/$t" "$OUT/bin${BUILD_SUFFIX:-}/$t"
done
echo "llama.cpp tools of llama-cpp-python $VERSION in $OUT/bin${BUILD_SUFFIX:-}"
