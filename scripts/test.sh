#!/usr/bin/env bash
# Set up and run the whole test suite: lint, unit, model and end-to-end tests.
# Real models are pulled into .cache/models by the test fixtures (edge pull).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check edge tests scripts
.venv/bin/python -m pytest -q "$@"
