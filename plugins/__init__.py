"""Custom iRPE ops for TensorRT (quickly deployable plugins) and ONNX Runtime.

Importing this package imports nothing else: the names below come from the torch-free spec
(:mod:`irpe.plugins.ops`, which needs NumPy) on first use, so ``python -m irpe.plugins.gpu_check`` starts on any
Python. Triton kernels (:mod:`.kernels`), AOT PTX (:mod:`.ptx`), the TensorRT registration
(:mod:`.tensorrt_plugin`) and the ONNX Runtime custom ops (:mod:`.ort_op`) load on demand.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BUCKET_SUM_OP",
    "DOMAIN",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "RPE_INDEX_OP",
    "bucket_sum_ref",
    "make_bucket_sum_node",
    "make_rpe_index_node",
    "plugin_opset_import",
    "rpe_index_ref",
]


def __getattr__(name: str) -> Any:
    """The names of :data:`__all__`, from :mod:`irpe.plugins.ops` on first use."""
    if name in __all__:
        return getattr(importlib.import_module(".ops", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
