"""Run Triton kernels on the CPU interpreter: TRITON_INTERPRET must be set before triton is imported."""

import os

os.environ["TRITON_INTERPRET"] = "1"
