#!/usr/bin/env bash
# Create ./.venv and install irpe-deploy with the given extras; skipped when pyproject.toml is unchanged.
# Usage: scripts/setup-venv.sh [EXTRAS]   (default: export,train,plugins,dev; "serve": no extras, torch-free)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-export,train,plugins,dev}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=".venv/.irpe-installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch==2.13.0 resolves to the CPU wheel on this kind of machine; the serving base needs no torch.
  if [ "$extras" = serve ]; then spec="."; else spec=".[${extras}]"; fi
  .venv/bin/python -m pip install -q -e "$spec"
  touch "$stamp"
fi
