#!/usr/bin/env bash
# Build llama-cpp-python for this machine's backend.
#
#   native/build.sh               detect, print the plan, build
#   native/build.sh --dry-run     print the plan only
#   native/build.sh RECIPE        force a recipe: cpu, cpu-openblas, cuda, cuda-jetson-orin, metal
#
# The version comes from setup.py (the low-level API moves between releases).
# PYTHON selects the interpreter (default: .venv/bin/python, else python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
dry_run=0
recipe=""
for arg in "$@"; do
  case "$arg" in
    --dry-run|-n) dry_run=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) recipe="$arg" ;;
  esac
done

detect() {
  if [ -f /etc/nv_tegra_release ] || grep -qs "Orin" /proc/device-tree/model; then
    echo cuda-jetson-orin
  elif [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then
    echo metal
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo cuda
  elif ldconfig -p 2>/dev/null | grep -q libopenblas; then
    echo cpu-openblas
  else
    echo cpu
  fi
}

[ -n "$recipe" ] || recipe="$(detect)"
file="$here/recipes/$recipe.env"
[ -f "$file" ] || { echo "build.sh: unknown recipe '$recipe' (see native/recipes/)" >&2; exit 2; }
if [ "$recipe" = cuda ] && [ -z "${CUDA_ARCH:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  CUDA_ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '.[:space:]')"
  export CUDA_ARCH
fi
# shellcheck disable=SC1090
source "$file"
version="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$repo/setup.py")"
py="${PYTHON:-}"
[ -n "$py" ] || { [ -x "$repo/.venv/bin/python" ] && py="$repo/.venv/bin/python" || py=python3; }
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}"

echo "recipe:      $recipe - $DESCRIPTION"
echo "package:     llama-cpp-python==$version (from setup.py)"
echo "python:      $py"
echo "CMAKE_ARGS:  $CMAKE_ARGS"
[ -n "${CUDACXX:-}" ] && echo "CUDACXX:     $CUDACXX"
echo "jobs:        $jobs"
echo "command:     $py -m pip install --force-reinstall --no-deps --no-binary llama-cpp-python --no-cache-dir llama-cpp-python==$version"
[ "$dry_run" = 1 ] && exit 0

export CMAKE_ARGS CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
[ -n "${CUDACXX:-}" ] && export CUDACXX
"$py" -m pip install --force-reinstall --no-deps --no-binary llama-cpp-python --no-cache-dir "llama-cpp-python==$version"
"$py" -c "from edge.runtime.llama.backend import probe_backends as p; b = p(); print('gpu_offload:', b.gpu_offload, 'cuda:', b.has_cuda, 'metal:', b.has_metal)"
