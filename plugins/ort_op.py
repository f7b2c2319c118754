"""Run an ONNX graph that contains irpe::RPEIndex / irpe::RPEBucketSum nodes in ONNX Runtime on CPU.

Needs only ``onnx`` and ``onnxruntime`` (the ``[export]`` extra, or the serving base install): each plugin
node of an in-memory copy of the model is lowered to standard ONNX ops with exactly the op's semantics
(:mod:`irpe.plugins.ops`), and the file on disk is never modified:

* ``RPEIndex(lut, index)`` -> ``GatherElements(lut, Expand(index, [B, H, Lq, Lk]), axis=3)``
* ``RPEBucketSum(attn, index; num_buckets=K)`` -> ``ScatterElements(zeros[B, H, Lq, K],
  Expand(index, shape(attn)), Cast<float>(attn), axis=3, reduction="add")`` then ``CastLike`` back, so fp16
  graphs accumulate in fp32 like the GPU kernel.

The TensorRT-only attributes (``plugin_namespace``, ``plugin_version``, ``aot``) are dropped with the node.
Batch size is whatever the feed has. Default-domain opset >= 16 is needed (ScatterElements reduction).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .ops import BUCKET_SUM_OP, DOMAIN, RPE_INDEX_OP

MIN_OPSET = 16  # ScatterElements(reduction="add")
LOWERED_OPS = (RPE_INDEX_OP, BUCKET_SUM_OP)


def _num_buckets(node: Any) -> int:
    for a in node.attribute:
        if a.name == "num_buckets":
            return int(a.i)
    raise ValueError(f"{node.name or node.op_type}: irpe::RPEBucketSum node has no int attribute num_buckets")


def _lower_node(node: Any, uid: int) -> tuple[list[Any], list[Any]]:
    """(nodes, initializers) computing ``node``'s output with standard ops."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    x, index, out = node.input[0], node.input[1], node.output[0]
    p = f"{node.name or out}__irpe{uid}"
    nodes = [helper.make_node("Shape", [x], [f"{p}_lead"], end=3, name=f"{p}_lead")]
    if node.op_type == RPE_INDEX_OP:
        nodes += [helper.make_node("Shape", [index], [f"{p}_lk"], start=1, name=f"{p}_lk"),
                  helper.make_node("Concat", [f"{p}_lead", f"{p}_lk"], [f"{p}_shape"], axis=0, name=f"{p}_shape"),
                  helper.make_node("Expand", [index, f"{p}_shape"], [f"{p}_idx"], name=f"{p}_idx"),
                  helper.make_node("GatherElements", [x, f"{p}_idx"], [out], axis=3, name=f"{p}_gather")]
        return nodes, []
    k = numpy_helper.from_array(np.array([_num_buckets(node)], np.int64), f"{p}_k")
    nodes += [helper.make_node("Shape", [x], [f"{p}_xshape"], name=f"{p}_xshape"),
              helper.make_node("Expand", [index, f"{p}_xshape"], [f"{p}_idx"], name=f"{p}_idx"),
              helper.make_node("Concat", [f"{p}_lead", f"{p}_k"], [f"{p}_oshape"], axis=0, name=f"{p}_oshape"),
              helper.make_node("ConstantOfShape", [f"{p}_oshape"], [f"{p}_zeros"], name=f"{p}_zeros",
                               value=numpy_helper.from_array(np.zeros(1, np.float32))),
              helper.make_node("Cast", [x], [f"{p}_x32"], to=TensorProto.FLOAT, name=f"{p}_x32"),
              helper.make_node("ScatterElements", [f"{p}_zeros", f"{p}_idx", f"{p}_x32"], [f"{p}_sum32"],
                               axis=3, reduction="add", name=f"{p}_scatter"),
              helper.make_node("CastLike", [f"{p}_sum32", x], [out], name=f"{p}_cast")]
    return nodes, [k]


def rewrite_for_ort(model: Any) -> Any:
    """A copy of ``model`` with every irpe plugin node lowered to standard ONNX ops (see module doc)."""
    model = copy.deepcopy(model)
    imports = {o.domain: o.version for o in model.opset_import}
    if imports.get("", imports.get("ai.onnx", 0)) < MIN_OPSET:
        raise ValueError(f"plugin graphs run in ONNX Runtime need default-domain opset >= {MIN_OPSET} "
                         "(ScatterElements with reduction); export with --opset 17")
    graph = model.graph
    nodes, uid = [], 0
    for node in graph.node:
        if node.domain == DOMAIN and node.op_type in LOWERED_OPS:
            lowered, inits = _lower_node(node, uid)
            nodes.extend(lowered)
            graph.initializer.extend(inits)
            uid += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(n.domain == DOMAIN for n in graph.node):
        keep = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return model


def session_for_plugin_graph(onnx_path_or_model: str | Path | Any, *, providers: list[str] | None = None,
                             sess_options: Any = None) -> Any:
    """An ``onnxruntime.InferenceSession`` (CPU) that runs a graph with irpe plugin nodes."""
    import onnx
    import onnxruntime as ort

    model = onnx_path_or_model
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    data = rewrite_for_ort(model).SerializeToString()
    return ort.InferenceSession(data, sess_options or ort.SessionOptions(),
                                providers=providers or ["CPUExecutionProvider"])
