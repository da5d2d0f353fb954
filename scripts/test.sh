#!/usr/bin/env bash
# Set up and run the whole test suite: lint, unit, model and end-to-end tests.
# Real models are pulled into .cache/models by the test fixtures (edge pull).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check edge tests scripts
# The chat page's browser test (tests/e2e/test_chat_page.py) needs Debian's Chromium.
if [ ! -x /usr/bin/chromium ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends chromium \
        || { apt-get update && apt-get install -y --no-install-recommends chromium; }
fi
.venv/bin/python -m pytest -q "$@"
