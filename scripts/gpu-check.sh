#!/usr/bin/env bash
# GPU check for irpe-deploy: nvidia-smi, Triton kernels vs NumPy, the AOT PTX launched with CuPy exactly as
# the TensorRT plugin declares, PyTorch on CUDA vs ONNX Runtime CPU (img/s), TensorRT engine + parity.
# Every step prints PASS / FAIL / SKIP <reason> with timings; exits 1 if a step failed. Runs anywhere:
# on a CPU-only host every GPU step skips with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
echo "irpe gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
exec "$PY" -m irpe.plugins.gpu_check "$@"
