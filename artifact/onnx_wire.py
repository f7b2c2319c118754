"""An ONNX model's graph read and rewritten in the protobuf wire format (torch-free, no onnx package).

The serving image has no ``onnx`` package (it would put the CPU image over its size budget), yet
:mod:`.ort_graph` must swap a few nodes of the graph ONNX Runtime reads. :func:`read` gives the top graph's
nodes (name, op, domain, inputs, outputs, the int and tensor attributes) and its initializers, decoded lazily;
:func:`write` gives the model's bytes with a new node list, initializers added or dropped and opset imports
added; every other field (weights, inputs, outputs, metadata) is copied byte for byte. (ModelProto and
GraphProto have no fixed-width or group fields, the only kinds :func:`.protowire.fields` steps over.)

Field numbers are onnx.proto's (ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto,
OperatorSetIdProto).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .protowire import Malformed, fields, varint

_GRAPH, _OPSET = 7, 8  # ModelProto
_NODE, _INIT, _OUTPUT = 1, 5, 12  # GraphProto
_DTYPES = {1: np.float32, 6: np.int32, 7: np.int64}  # TensorProto.DataType -> NumPy (the ones read here)
_TYPE_CODE = {np.dtype(v): k for k, v in _DTYPES.items()}


@dataclass
class Node:
    """A NodeProto; ``raw`` is its original bytes (None for a node made here)."""

    op_type: str
    inputs: list[str]
    outputs: list[str]
    name: str = ""
    domain: str = ""
    ints: dict[str, Any] = field(default_factory=dict)  # INT and INTS attributes
    tensors: dict[str, Any] = field(default_factory=dict)  # TENSOR attributes, as (start, end) byte spans
    raw: bytes | None = None


@dataclass
class Model:
    """The top graph of a ModelProto held in ``buf``."""

    buf: bytes
    nodes: list[Node]
    initializers: dict[str, tuple[int, int]]  # name -> span of its TensorProto
    outputs: list[str]

    def array(self, name: str) -> np.ndarray | None:
        """Initializer ``name`` as an array (float32, int32 or int64 only), or None."""
        span = self.initializers.get(name)
        return tensor(self.buf, *span) if span else None


def read(buf: bytes) -> Model:
    """The graph of the ModelProto ``buf``. Malformed for anything that is not one."""
    spans = [(a, b) for number, wire, a, b, _ in fields(buf, 0, len(buf)) if number == _GRAPH and wire == 2]
    if len(spans) != 1:
        raise Malformed
    start, end = spans[0]
    nodes: list[Node] = []
    inits: dict[str, tuple[int, int]] = {}
    outputs: list[str] = []
    for number, wire, a, b, _ in fields(buf, start, end):
        if wire != 2:
            continue
        if number == _NODE:
            nodes.append(_node(buf, a, b))
        elif number == _INIT:
            inits[_tensor_name(buf, a, b)] = (a, b)
        elif number == _OUTPUT:
            outputs += [_text(buf, x, y) for n, w, x, y, _ in fields(buf, a, b) if n == 1 and w == 2]
    return Model(buf, nodes, inits, outputs)


def write(model: Model, nodes: list[Node], add: dict[str, np.ndarray], drop: set[str],
          opsets: dict[str, int]) -> bytes:
    """``model``'s bytes with ``nodes`` as its node list, the ``add`` initializers added, the ``drop`` ones
    left out, and ``opsets`` (domain -> version) imported."""
    buf = model.buf
    (start, end), = [(a, b) for n, w, a, b, _ in fields(buf, 0, len(buf)) if n == _GRAPH and w == 2]
    graph: list[bytes] = []
    placed = False
    for number, wire, a, b, at in fields(buf, start, end):
        if number == _NODE and wire == 2:
            if not placed:
                graph += [_field(_NODE, n.raw if n.raw is not None else _encode_node(n)) for n in nodes]
                placed = True
            continue
        if number == _INIT and wire == 2 and _tensor_name(buf, a, b) in drop:
            continue
        graph.append(bytes(buf[at:b if wire == 2 else _end_of(buf, at, end)]))
    graph += [_field(_INIT, encode_tensor(name, arr)) for name, arr in add.items()]
    out: list[bytes] = []
    for number, wire, _a, b, at in fields(buf, 0, len(buf)):
        out.append(_field(_GRAPH, b"".join(graph)) if number == _GRAPH and wire == 2
                   else bytes(buf[at:b if wire == 2 else _end_of(buf, at, len(buf))]))
    out += [_field(_OPSET, _field(1, d.encode()) + _key(2, 0) + _varint(v)) for d, v in opsets.items()]
    return b"".join(out)


def tensor(buf: bytes, start: int, end: int) -> np.ndarray | None:
    """The TensorProto at ``buf[start:end]`` as an array (float32, int32, int64), or None (another type,
    external data)."""
    dims: list[int] = []
    dtype, raw, typed = 0, None, []
    for number, wire, a, b, _ in fields(buf, start, end):
        if number == 1:
            dims += [a] if wire == 0 else _varints(buf, a, b)
        elif number == 2 and wire == 0:
            dtype = a
        elif number == 9 and wire == 2:
            raw = bytes(buf[a:b])
        elif number in (5, 7) and wire == 0:
            typed.append(a)
        elif number in (5, 7) and wire == 2:
            typed += _varints(buf, a, b)
        elif number == 4 and wire == 2:
            raw = bytes(buf[a:b])  # packed float_data: little-endian float32, as raw_data
        elif number == 14 and wire == 0 and a == 1:
            return None  # external data
    if dtype not in _DTYPES:
        return None
    if raw is not None:
        arr = np.frombuffer(raw, dtype=np.dtype(_DTYPES[dtype]).newbyteorder("<")).astype(_DTYPES[dtype])
    else:
        arr = np.array([_signed(v) for v in typed], dtype=_DTYPES[dtype])
    return arr.reshape(dims) if arr.size == int(np.prod(dims, dtype=np.int64)) else None


def encode_tensor(name: str, arr: np.ndarray) -> bytes:
    """A TensorProto (raw_data, little-endian) of ``arr`` (float32, int32 or int64)."""
    arr = np.ascontiguousarray(arr)
    dims = b"".join(_key(1, 0) + _varint(d) for d in arr.shape)
    return dims + _key(2, 0) + _varint(_TYPE_CODE[arr.dtype]) + _field(8, name.encode()) + \
        _field(9, arr.astype(arr.dtype.newbyteorder("<")).tobytes())


def _node(buf: bytes, start: int, end: int) -> Node:
    node = Node("", [], [], raw=bytes(buf[start:end]))
    for number, wire, a, b, _ in fields(buf, start, end):
        if wire != 2:
            continue
        if number == 1:
            node.inputs.append(_text(buf, a, b))
        elif number == 2:
            node.outputs.append(_text(buf, a, b))
        elif number == 3:
            node.name = _text(buf, a, b)
        elif number == 4:
            node.op_type = _text(buf, a, b)
        elif number == 7:
            node.domain = _text(buf, a, b)
        elif number == 5:
            _attribute(buf, a, b, node)
    return node


def _attribute(buf: bytes, start: int, end: int, node: Node) -> None:
    name, ints, one, tensor_span = "", [], None, None
    for number, wire, a, b, _ in fields(buf, start, end):
        if number == 1 and wire == 2:
            name = _text(buf, a, b)
        elif number == 3 and wire == 0:
            one = _signed(a)
        elif number == 8:
            ints += [_signed(a)] if wire == 0 else [_signed(v) for v in _varints(buf, a, b)]
        elif number == 5 and wire == 2:
            tensor_span = (a, b)
    if tensor_span is not None:
        node.tensors[name] = tensor_span
    elif one is not None:
        node.ints[name] = one
    elif ints:
        node.ints[name] = ints


def _encode_node(node: Node) -> bytes:
    parts = [_field(1, i.encode()) for i in node.inputs] + [_field(2, o.encode()) for o in node.outputs]
    parts += [_field(3, node.name.encode()), _field(4, node.op_type.encode())]
    for name, value in node.ints.items():  # INT attributes (type 2)
        parts.append(_field(5, _field(1, name.encode()) + _key(3, 0) + _varint(value) + _key(20, 0) + _varint(2)))
    if node.domain:
        parts.append(_field(7, node.domain.encode()))
    return b"".join(parts)


def _tensor_name(buf: bytes, start: int, end: int) -> str:
    for number, wire, a, b, _ in fields(buf, start, end):
        if number == 8 and wire == 2:
            return _text(buf, a, b)
    return ""


def _text(buf: bytes, a: int, b: int) -> str:
    return bytes(buf[a:b]).decode("utf-8", "replace")


def _varints(buf: bytes, a: int, b: int) -> list[int]:
    out, pos = [], a
    while pos < b:
        value, pos = varint(buf, pos, b)
        out.append(value)
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _end_of(buf: bytes, at: int, end: int) -> int:
    """Where the non-length-delimited field starting at ``at`` ends."""
    key, pos = varint(buf, at, end)
    wire = key & 7
    if wire == 0:
        return varint(buf, pos, end)[1]
    return pos + (8 if wire == 1 else 4 if wire == 5 else 0)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload
