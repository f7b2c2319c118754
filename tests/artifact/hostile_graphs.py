"""Hostile but small ONNX graphs under the iRPE lookup pattern (:mod:`irpe.artifact.ort_graph`,
:mod:`irpe.artifact.openvino_graph`), each a model ONNX Runtime can be asked to load.

Every graph reads ``images`` (N, 3, 32, 32) as both the lookup table (N, H=3, n=32, K'=32) and the scores,
gathers rows as an exported lookup does (Transpose to the row layout, Reshape, Gather by a constant (n*n,)
index), puts ``middle`` between the Gather and the Reshape back, adds the transpose back to the scores, and
ends in logits (N, 10) (Flatten, MatMul): the shape :func:`tests.server.helpers.handmade_artifact` serves.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from irpe.artifact.openvino_graph import ROWS_PERM
from tests.server.helpers import CROP, NUM_CLASSES

SIDE = CROP  # n = K' = 32: the index has n*n entries, each a row of the (n*K', N, H) row layout
ADD_CHAIN = 48  # Add(x, x) links: 2**48 paths from the lookup's Add back to the Gather
RESHAPE_CHAIN = 1500  # Reshapes between the Gather and the Reshape back: deeper than Python's recursion limit


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def lookup_graph(middle: Callable[[str], tuple[list, str]], gather_inputs: int = 2) -> tuple[list, dict]:
    """(nodes, initializers) of images -> row lookup -> ``middle(gathered)`` -> scores + lookup -> logits.

    Args:
        middle: given the Gather's output name, (the nodes after it, the name they end in).
        gather_inputs: 2 as exported; 1 drops the index (a Gather ONNX requires two inputs for).
    """
    inits = {"index": np.random.default_rng(0).integers(0, SIDE * SIDE, SIDE * SIDE).astype(np.int64),
             "row_shape": _ints(SIDE * SIDE, -1, 3), "grid_shape": _ints(SIDE, SIDE, -1, 3),
             "W": np.full((3 * SIDE * SIDE, NUM_CLASSES), 1e-20, np.float32)}
    nodes = [helper.make_node("Transpose", ["images"], ["lut_rows"], perm=ROWS_PERM),
             helper.make_node("Reshape", ["lut_rows", "row_shape"], ["rows"]),
             helper.make_node("Gather", ["rows", "index"][:gather_inputs], ["gathered"], axis=0)]
    more, summed = middle("gathered")
    nodes += more + [helper.make_node("Reshape", [summed, "grid_shape"], ["grid"]),
                     helper.make_node("Transpose", ["grid"], ["back"], perm=ROWS_PERM),
                     helper.make_node("Add", ["images", "back"], ["scored"]),
                     helper.make_node("Flatten", ["scored"], ["flat"], axis=1),
                     helper.make_node("MatMul", ["flat", "W"], ["logits"])]
    return nodes, inits


def add_chain(start: str, links: int = ADD_CHAIN) -> tuple[list, str]:
    """x_{k+1} = Add(x_k, x_k), ``links`` times (the value is 2**links times the lookup: finite in float32)."""
    nodes = [helper.make_node("Add", [f"{start}_{k}" if k else start] * 2, [f"{start}_{k + 1}"])
             for k in range(links)]
    return nodes, f"{start}_{links}"


def reshape_chain(start: str, links: int = RESHAPE_CHAIN) -> tuple[list, str]:
    """``links`` Reshapes to the same row layout, one after the other."""
    nodes = [helper.make_node("Reshape", [f"{start}_{k}" if k else start, "row_shape"], [f"{start}_{k + 1}"])
             for k in range(links)]
    return nodes, f"{start}_{links}"


def plain(start: str) -> tuple[list, str]:
    """Nothing between the Gather and the Reshape back: the exported form of one lookup."""
    return [], start


HOSTILE = {  # name -> (nodes, initializers)
    "add_chain": lambda: lookup_graph(add_chain),
    "one_input_gather": lambda: lookup_graph(plain, gather_inputs=1),
    "reshape_chain": lambda: lookup_graph(reshape_chain),
}


def model_bytes(nodes: list, inits: dict) -> bytes:
    """The serialized ModelProto (opset 17) of images -> ``nodes`` -> logits."""
    from onnx import TensorProto, numpy_helper

    graph = helper.make_graph(
        nodes, "hostile", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, CROP, CROP])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def separable_bomb(n: int) -> tuple[list, dict]:
    """(nodes, initializers) of images -> logits with the value side's separable pattern in the middle: two
    one-hot constants of n zeros each (8n bytes in the file) that ask the ONNX Runtime rewrite for an (n, n)
    bucket index (4n² bytes: 256 MB at n = 8192, a 66 KB file). Cheap for ONNX Runtime to run as exported
    (n floats); the pattern's sum is zero, added to the logits."""
    inits = {"attn_shape": _ints(1, 1, 1, n), "start": _ints(n - 1), "end": _ints(n), "axes": _ints(3),
             "rows_shape": _ints(1, -1, 1), "regroup_shape": _ints(n, 1, 1, 1), "flat_shape": _ints(1, -1),
             "col_hot": np.zeros((n, 1, 1), np.float32), "row_hot": np.zeros((n, 1, 1, 1), np.float32),
             "W": np.full((3, NUM_CLASSES), 0.5, np.float32)}
    nodes = [helper.make_node("ConstantOfShape", ["attn_shape"], ["attn"]),
             helper.make_node("Slice", ["attn", "start", "end", "axes"], ["keys"]),
             helper.make_node("Transpose", ["keys"], ["keys_t"], perm=[2, 0, 1, 3]),
             helper.make_node("Reshape", ["keys_t", "rows_shape"], ["rows"]),
             helper.make_node("MatMul", ["rows", "col_hot"], ["col_sums"]),
             helper.make_node("Reshape", ["col_sums", "regroup_shape"], ["regroup"]),
             helper.make_node("MatMul", ["row_hot", "regroup"], ["row_sums"]),
             helper.make_node("Reshape", ["row_sums", "flat_shape"], ["sums"]),
             helper.make_node("ReduceSum", ["sums"], ["total"], keepdims=0),
             helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["scores"]),
             helper.make_node("Add", ["scores", "total"], ["logits"])]
    return nodes, inits


def typed_index_model(values: int, packed: bool = True) -> bytes:
    """The exported lookup (:func:`lookup_graph` with :func:`plain`) whose Gather index has ``values`` entries
    of 5 stored in ``int32_data`` instead of raw bytes: packed (one byte each) or unpacked (a key byte and a
    value byte each; written here, as protobuf would re-pack it). The runtime would refuse the index's size;
    the rewrite reads it first."""
    from onnx import ModelProto, TensorProto

    from irpe.artifact.protowire import fields

    model = ModelProto()
    model.ParseFromString(model_bytes(*lookup_graph(plain)))
    (old,) = [t for t in model.graph.initializer if t.name == "index"]
    model.graph.initializer.remove(old)
    data = model.SerializeToString()
    index = TensorProto(name="index", data_type=TensorProto.INT32, dims=[values]).SerializeToString()
    index += b"\x2a" + _varint(values) + b"\x05" * values if packed else b"\x28\x05" * values  # int32_data
    ((start, end, at),) = [(a, b, at) for n, w, a, b, at in fields(data, 0, len(data)) if n == 7 and w == 2]
    graph = data[start:end] + b"\x2a" + _varint(len(index)) + index  # GraphProto.initializer
    return data[:at] + b"\x3a" + _varint(len(graph)) + graph + data[end:]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))
