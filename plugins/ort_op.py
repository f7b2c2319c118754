"""Run an ONNX graph that contains irpe::RPEIndex / irpe::RPEBucketSum nodes in ONNX Runtime on CPU.

onnxruntime-extensions Python custom ops (``onnx_op``/``PyOp``) always live in the domain
``ai.onnx.contrib`` and have fixed input/output element types, so :func:`session_for_plugin_graph`
rewrites an in-memory copy of the model: each plugin node moves to that domain under a private op type,
loses the TensorRT-only attributes (``plugin_namespace``, ``plugin_version``, ``aot``), and is wrapped in
``Cast(to=FLOAT)`` / ``CastLike(out, input)`` so fp16 graphs run too (RPEBucketSum then accumulates in
fp32, like the GPU kernel). Batch size is whatever the feed has. The file on disk is never modified.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from .ops import BUCKET_SUM_OP, DOMAIN, RPE_INDEX_OP, bucket_sum_ref, rpe_index_ref

ORT_DOMAIN = "ai.onnx.contrib"
ORT_OPS = {RPE_INDEX_OP: "IrpeRPEIndexF32", BUCKET_SUM_OP: "IrpeRPEBucketSumF32"}
_TRT_ONLY_ATTRS = {"plugin_namespace", "plugin_version", "aot"}
_registered = False


def register_ort_ops() -> None:
    """Declare the two Python custom ops with onnxruntime-extensions (idempotent)."""
    global _registered
    if _registered:
        return
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    f32, i32, i64 = PyCustomOpDef.dt_float, PyCustomOpDef.dt_int32, PyCustomOpDef.dt_int64

    @onnx_op(op_type=ORT_OPS[RPE_INDEX_OP], inputs=[f32, i32], outputs=[f32])
    def _rpe_index(lut: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(rpe_index_ref(lut, index), dtype=np.float32)

    @onnx_op(op_type=ORT_OPS[BUCKET_SUM_OP], inputs=[f32, i32], outputs=[f32], attrs={"num_buckets": i64})
    def _bucket_sum(attn: np.ndarray, index: np.ndarray, num_buckets: int) -> np.ndarray:
        return np.ascontiguousarray(bucket_sum_ref(attn, index, int(num_buckets)), dtype=np.float32)

    _registered = True


def _rewrite_node(node: Any, uid: int) -> list[Any]:
    """Cast -> contrib op -> CastLike replacing one plugin node."""
    from onnx import TensorProto, helper

    x, index = node.input[0], node.input[1]
    x32, y32 = f"{x}__irpe_f32_{uid}", f"{node.output[0]}__irpe_f32_{uid}"
    attrs = [a for a in node.attribute if a.name not in _TRT_ONLY_ATTRS]
    op = helper.make_node(ORT_OPS[node.op_type], [x32, index], [y32], name=f"{node.name}__ort",
                          domain=ORT_DOMAIN)
    op.attribute.extend(attrs)
    return [helper.make_node("Cast", [x], [x32], to=TensorProto.FLOAT, name=f"{node.name}__cast_in"),
            op,
            helper.make_node("CastLike", [y32, x], [node.output[0]], name=f"{node.name}__cast_out")]


def rewrite_for_ort(model: Any) -> Any:
    """A copy of ``model`` with every irpe plugin node replaced by its onnxruntime-extensions form."""
    from onnx import helper

    model = copy.deepcopy(model)
    graph = model.graph
    nodes, uid = [], 0
    for node in graph.node:
        if node.domain == DOMAIN and node.op_type in ORT_OPS:
            nodes.extend(_rewrite_node(node, uid))
            uid += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    imports = {o.domain: o.version for o in model.opset_import}
    if imports.get("", imports.get("ai.onnx", 0)) < 15:
        raise ValueError("plugin graphs run in ONNX Runtime need default-domain opset >= 15 (CastLike)")
    if ORT_DOMAIN not in imports:
        model.opset_import.append(helper.make_opsetid(ORT_DOMAIN, 1))
    return model


def session_for_plugin_graph(onnx_path_or_model: str | Path | Any, *, providers: list[str] | None = None,
                             sess_options: Any = None) -> Any:
    """An ``onnxruntime.InferenceSession`` (CPU) that runs a graph with irpe plugin nodes."""
    import onnx
    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path

    model = onnx_path_or_model
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    register_ort_ops()
    so = sess_options or ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    data = rewrite_for_ort(model).SerializeToString()
    return ort.InferenceSession(data, so, providers=providers or ["CPUExecutionProvider"])
