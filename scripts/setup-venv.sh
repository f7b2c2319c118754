#!/usr/bin/env bash
# Create ./.venv and install irpe-deploy with the given extras; skipped when pyproject.toml is unchanged.
# Usage: scripts/setup-venv.sh [EXTRAS]   (default: export,train,plugins,dev; "serve": no extras, torch-free)
# Env: PYTHON (the interpreter that makes the venv; default python3, >= 3.10).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-export,train,plugins,dev}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "setup-venv: no Python >= 3.10 as '$py'; to install: apt-get install python3 python3-venv," \
      "or set PYTHON=/path/to/python3.x" >&2
    exit 1
  fi
  fresh=1
  [ -e .venv ] && fresh=0
  if ! "$py" -m venv .venv; then
    [ "$fresh" = 1 ] && rm -rf .venv  # only a .venv this script began
    echo "setup-venv: '$py -m venv .venv' failed; to install: apt-get install python3-venv" \
      "(or set PYTHON to a Python with venv)" >&2
    exit 1
  fi
fi
stamp=".venv/.irpe-installed-$(sha256sum <pyproject.toml | cut -c1-16)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch==2.13.0 resolves to the CPU wheel on this kind of machine; the serving base needs no torch.
  if [ "$extras" = serve ]; then spec="."; else spec=".[${extras}]"; fi
  .venv/bin/python -m pip install -q -e "$spec"
  touch "$stamp"
fi
