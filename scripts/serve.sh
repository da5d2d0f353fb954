#!/usr/bin/env bash
# Set up, pull the default model if needed, and serve it on 127.0.0.1:8088.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/edge doctor
exec .venv/bin/edge serve "$@"
