#!/usr/bin/env bash
# Set up .venv from nothing (if needed), lint, and run the test suite (GPU tests skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh export,train,plugins,dev,cpu
.venv/bin/ruff check .
.venv/bin/python -m pytest -m "not slow" "$@"
