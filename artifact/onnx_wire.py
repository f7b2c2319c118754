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

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .protowire import Malformed, fields, varint

_GRAPH, _OPSET = 7, 8  # ModelProto
_NODE, _INIT, _OUTPUT = 1, 5, 12  # GraphProto
_INT, _TENSOR, _INTS = 2, 4, 7  # AttributeProto.AttributeType
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
    ambiguous: bool = False  # an attribute given twice, or a tensor attribute protobuf would merge: not matched


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
            outputs.append(_last_text(buf, a, b, 1))
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
    out += [_field(_OPSET, _field(1, _utf8(d)) + _key(2, 0) + _varint(v)) for d, v in opsets.items()]
    return b"".join(out)


def tensor(buf: bytes, start: int, end: int) -> np.ndarray | None:
    """The TensorProto at ``buf[start:end]`` as an array (float32, int32, int64), read as protobuf and
    ONNX Runtime read it (raw_data before the typed field of its type, int32_data truncated to 32 bits), or
    None (another type, external data, a negative dim, data that does not fill the dims)."""
    dims: list[int] = []
    dtype, raw = 0, None
    typed: dict[int, list[int]] = {5: [], 7: []}  # int32_data, int64_data
    floats: list[bytes] = []  # float_data, packed
    for number, wire, a, b, _ in fields(buf, start, end):
        if number == 1:
            dims += [_signed(a)] if wire == 0 else [_signed(v) for v in _varints(buf, a, b)]
        elif number == 2 and wire == 0:
            dtype = a
        elif number == 9 and wire == 2:
            raw = bytes(buf[a:b])
        elif number in typed:
            typed[number] += [a] if wire == 0 else _varints(buf, a, b)
        elif number == 4 and wire == 2:
            floats.append(bytes(buf[a:b]))
        elif number == 14 and wire == 0 and a == 1:
            return None  # external data
    if dtype not in _DTYPES or any(d < 0 for d in dims):
        return None
    kind = np.dtype(_DTYPES[dtype])
    if raw is None and dtype == 1:
        raw = b"".join(floats)
    if raw is not None:
        if len(raw) % kind.itemsize:
            return None
        arr = np.frombuffer(raw, dtype=kind.newbyteorder("<")).astype(kind)
    elif dtype == 6:  # int32_data: each value's low 32 bits, as protobuf reads an int32
        arr = np.array([(v & 0xFFFFFFFF) - ((v & 0x80000000) << 1) for v in typed[5]], dtype=np.int32)
    else:
        arr = np.array([_signed(v) for v in typed[7]], dtype=np.int64)
    return arr.reshape(dims) if arr.size == math.prod(dims) else None


def encode_tensor(name: str, arr: np.ndarray) -> bytes:
    """A TensorProto (raw_data, little-endian) of ``arr`` (float32, int32 or int64)."""
    arr = np.ascontiguousarray(arr)
    dims = b"".join(_key(1, 0) + _varint(d) for d in arr.shape)
    return dims + _key(2, 0) + _varint(_TYPE_CODE[arr.dtype]) + _field(8, _utf8(name)) + \
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
    """Record the INT, INTS or TENSOR attribute at ``buf[start:end]`` on ``node``: the value its type field
    names (the first one set where it has no type)."""
    name, ints, one, spans, kind = "", [], None, [], 0
    for number, wire, a, b, _ in fields(buf, start, end):
        if number == 1 and wire == 2:
            name = _text(buf, a, b)
        elif number == 3 and wire == 0:
            one = _signed(a)
        elif number == 8:
            ints += [_signed(a)] if wire == 0 else [_signed(v) for v in _varints(buf, a, b)]
        elif number == 5 and wire == 2:
            spans.append((a, b))
        elif number == 20 and wire == 0:
            kind = a
    if name in node.ints or name in node.tensors or len(spans) > 1:
        node.ambiguous = True
    elif spans and kind in (0, _TENSOR):
        node.tensors[name] = spans[0]
    elif one is not None and kind in (0, _INT):
        node.ints[name] = one
    elif ints and kind in (0, _INTS):
        node.ints[name] = ints


def _encode_node(node: Node) -> bytes:
    parts = [_field(1, _utf8(i)) for i in node.inputs] + [_field(2, _utf8(o)) for o in node.outputs]
    parts += [_field(3, _utf8(node.name)), _field(4, _utf8(node.op_type))]
    for name, value in node.ints.items():  # INT attributes (type 2)
        parts.append(_field(5, _field(1, _utf8(name)) + _key(3, 0) + _varint(value) + _key(20, 0) + _varint(2)))
    if node.domain:
        parts.append(_field(7, _utf8(node.domain)))
    return b"".join(parts)


def _tensor_name(buf: bytes, start: int, end: int) -> str:
    return _last_text(buf, start, end, 8)


def _last_text(buf: bytes, start: int, end: int, number: int) -> str:
    """The string field ``number`` of the message at ``buf[start:end]``: its last occurrence, as protobuf
    reads a field given twice ("" if none)."""
    text = ""
    for n, wire, a, b, _ in fields(buf, start, end):
        if n == number and wire == 2:
            text = _text(buf, a, b)
    return text


def _text(buf: bytes, a: int, b: int) -> str:
    return bytes(buf[a:b]).decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 kept as they are


def _utf8(text: str) -> bytes:
    """``text`` as the bytes :func:`_text` read it from."""
    return text.encode("utf-8", "surrogateescape")


def _varints(buf: bytes, a: int, b: int) -> list[int]:
    out, pos = [], a
    while pos < b:
        value, pos = varint(buf, pos, b)
        out.append(value)
    return out


def _signed(value: int) -> int:
    """An int64 field's value: the varint's low 64 bits, two's complement."""
    value &= (1 << 64) - 1
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
