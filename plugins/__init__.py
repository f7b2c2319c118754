"""Custom iRPE ops for TensorRT (quickly deployable plugins) and ONNX Runtime.

Importing this package is cheap: it pulls in only the torch-free spec (:mod:`irpe.plugins.ops`).
Triton kernels (:mod:`.kernels`), AOT PTX (:mod:`.ptx`), the TensorRT registration
(:mod:`.tensorrt_plugin`) and the ONNX Runtime custom ops (:mod:`.ort_op`) load on demand.
"""

from .ops import (
    BUCKET_SUM_OP,
    DOMAIN,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    RPE_INDEX_OP,
    bucket_sum_ref,
    make_bucket_sum_node,
    make_rpe_index_node,
    plugin_opset_import,
    rpe_index_ref,
)

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
