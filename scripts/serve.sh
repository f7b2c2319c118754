#!/usr/bin/env bash
# Set up .venv, train (once, cached) + export the embedded digits model, and serve it on 127.0.0.1:8000.
# Pass --checkpoint PATH to export and serve that checkpoint instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh export,train
exec .venv/bin/irpe quickstart "$@"
