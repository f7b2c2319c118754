"""artifact/onnx_wire.py: a graph read and written in the wire format says what the onnx package says."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from irpe.artifact import onnx_wire
from irpe.artifact.protowire import Malformed


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.arange(3, dtype=np.int64))),
             helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[1, 0]),
             helper.make_node("Gather", ["t", "c"], ["g"], name="ga", axis=-1),
             helper.make_node("Relu", ["g"], ["dead"], name="unused")]
    inits = [numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "w"),
             helper.make_tensor("i32", TensorProto.INT32, [3], [-2, 0, 7]),  # int32_data, not raw
             helper.make_tensor("f32", TensorProto.FLOAT, [2], [0.5, -1.5])]  # float_data
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")


def test_read_gives_the_nodes_attributes_and_initializers() -> None:
    wire = onnx_wire.read(_model().SerializeToString())
    assert [n.op_type for n in wire.nodes] == ["Constant", "Transpose", "Gather", "Relu"]
    tr, ga = wire.nodes[1], wire.nodes[2]
    assert (tr.name, tr.inputs, tr.outputs, tr.ints) == ("tr", ["x"], ["t"], {"perm": [1, 0]})
    assert ga.ints == {"axis": -1} and wire.outputs == ["g"]
    np.testing.assert_array_equal(onnx_wire.tensor(wire.buf, *wire.nodes[0].tensors["value"]), np.arange(3))
    np.testing.assert_array_equal(wire.array("w"), np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(wire.array("i32"), np.array([-2, 0, 7], np.int32))
    np.testing.assert_array_equal(wire.array("f32"), np.array([0.5, -1.5], np.float32))
    assert wire.array("nope") is None


def test_write_swaps_nodes_adds_and_drops_initializers_and_keeps_the_rest() -> None:
    model = _model()
    wire = onnx_wire.read(model.SerializeToString())
    new = onnx_wire.Node("Mine", ["g", "idx"], ["m"], name="mine", domain="my.ops", ints={"k": 5})
    out = onnx_wire.write(wire, [*wire.nodes[:3], new], {"idx": np.array([[1, -2]], np.int32)}, {"f32"}, {"my.ops": 1})
    back = onnx.load_from_string(out)
    assert [n.op_type for n in back.graph.node] == ["Constant", "Transpose", "Gather", "Mine"]
    mine = back.graph.node[3]
    assert (mine.domain, list(mine.input), helper.get_attribute_value(mine.attribute[0])) == ("my.ops", ["g", "idx"], 5)
    inits = {t.name: numpy_helper.to_array(t) for t in back.graph.initializer}
    assert sorted(inits) == ["i32", "idx", "w"] and inits["idx"].tolist() == [[1, -2]]
    assert {(o.domain, o.version) for o in back.opset_import} == {("", 17), ("my.ops", 1)}
    assert back.producer_name == "test" and back.graph.input[0].name == "x"
    assert back.graph.node[1] == model.graph.node[1]  # untouched nodes are the same bytes


@pytest.mark.parametrize("data", [b"", b"\x3a\x05\x0a", b"\x0a\x02ab", b"\xff\xff"])
def test_what_is_not_a_model_is_malformed(data: bytes) -> None:
    with pytest.raises(Malformed):
        onnx_wire.read(data)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.sampled_from([TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT]),
       st.lists(st.integers(-2**63, 2**63 - 1), max_size=12), st.booleans())
def test_typed_data_decodes_as_onnx_decodes_it(dtype: int, values: list[int], raw: bool) -> None:
    """int32_data, int64_data and float_data (packed, as onnx writes them) or raw_data: onnx's array."""
    kind = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64, TensorProto.FLOAT: np.float32}[dtype]
    if dtype == TensorProto.INT32:
        values = [v % 2**32 - (v % 2**32 >= 2**31) * 2**32 for v in values]
    want = np.array(values, np.float64 if dtype == TensorProto.FLOAT else kind).astype(kind)
    proto = helper.make_tensor("t", dtype, [len(values)], want.tobytes() if raw else want.tolist(), raw=raw)
    data = proto.SerializeToString()
    got = onnx_wire.tensor(data, 0, len(data))
    assert got is not None and got.dtype == kind
    np.testing.assert_array_equal(got, numpy_helper.to_array(proto))


@pytest.mark.parametrize("array", [np.array(3, np.int64), np.zeros((0, 3), np.int32),
                                   np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]])
def test_encoded_tensors_read_back_as_onnx_reads_them(array: np.ndarray) -> None:
    """A scalar, an empty table and a strided view: the writer's bytes (views joined once) are the tensor."""
    proto = onnx.TensorProto()
    proto.ParseFromString(onnx_wire.encode_tensor("t", array))
    np.testing.assert_array_equal(numpy_helper.to_array(proto), array)
    assert numpy_helper.to_array(proto).shape == array.shape
