#!/usr/bin/env bash
# Serve the shipped digits model on http://127.0.0.1:8000 with the torch-free serving runtime only.
#   scripts/serve.sh                       the shipped model (no torch, no training)
#   scripts/serve.sh --retrain             train + export it anew first (installs the training extras)
#   scripts/serve.sh --checkpoint FILE.pth export and serve your checkpoint (installs the export extras)
set -euo pipefail
cd "$(dirname "$0")/.."
extras=serve
for arg in "$@"; do
  case "$arg" in
    --retrain|--checkpoint|--checkpoint=*) extras=export,train ;;
  esac
done
scripts/setup-venv.sh "$extras"
exec .venv/bin/irpe quickstart "$@"
