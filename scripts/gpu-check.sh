#!/usr/bin/env bash
# irpe GPU check, from a plain checkout: no install, no network, no compiled extension of ours.
#   scripts/gpu-check.sh [--quick] [--budget SECONDS] OUTDIR
# Steps: nvidia-smi; Triton kernels vs NumPy; the AOT PTX launched with CuPy exactly as the TensorRT plugin
# declares; PyTorch on CUDA vs ONNX Runtime CPU (img/s); ONNX Runtime's CUDA provider; TensorRT engines + parity.
# Each prints PASS / FAIL / SKIP <reason> with figures as it ends, and OUTDIR/gpu-check.json and
# OUTDIR/gpu-check.txt are rewritten after every step. Exit status 1 if a step failed. Python: $PYTHON, else
# the checkout's .venv, else python3 (3.11+; 3.10 works when run from outside the checkout's root).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi
# irpe.* -> the checkout's top-level folders, as pyproject's package-dir maps them (links in a temporary folder)
PACKAGE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/irpe-checkout.XXXXXX")"
trap 'rm -rf "$PACKAGE_DIR"' EXIT
"$PY" "$ROOT/scripts/checkout_package.py" "$PACKAGE_DIR" >/dev/null
# PYTHONSAFEPATH: the working directory is not searched first, so nothing in the checkout root can shadow the links
PYTHONPATH="$PACKAGE_DIR${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1 "$PY" -m irpe.plugins.gpu_check "$@"
