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
# Bytecode now, as a wheel install has it: an editable install gets none until an import writes
# it, and never where PYTHONDONTWRITEBYTECODE is set (then every `edge serve` compiles its
# modules again: ~0.3 s of each start on a 2-core VM).
.venv/bin/python -m compileall -q edge >/dev/null
