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
# The load-balancer test (tests/e2e/test_haproxy_e2e.py) needs Debian's HAProxy.
if [ ! -x /usr/sbin/haproxy ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends haproxy \
        || { apt-get update && apt-get install -y --no-install-recommends haproxy; } \
        || echo "haproxy could not be installed: tests/e2e/test_haproxy_e2e.py will be skipped"
fi
.venv/bin/python -m pytest -q "$@"
