#!/usr/bin/env bash
# Create .venv and install edge with its dev extras. Idempotent and quick once
# pip has cached the llama-cpp-python wheel (the first build compiles llama.cpp:
# about 11 minutes on 2 cores). For a GPU build run native/build.sh afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
