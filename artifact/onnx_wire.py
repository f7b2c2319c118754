"""An ONNX model's graph read and rewritten in the protobuf wire format (torch-free, no onnx package).

The serving image has no ``onnx`` package (it would put the CPU image over its size budget), yet
:mod:`.ort_graph` must swap a few nodes of the graph ONNX Runtime reads. :func:`read` gives the top graph's
nodes (name, op, domain, inputs, outputs, the int and tensor attributes) and its initializers, decoded lazily;
:func:`write` gives the model's bytes with a new node list, initializers added or dropped and opset imports
added; every other field (weights, inputs, outputs, metadata) is copied byte for byte. (ModelProto and
GraphProto have no fixed-width or group fields, the only kinds :func:`.protowire.fields` steps over.)

Field numbers are onnx.proto's (ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto,
OperatorSetIdProto).

The bytes are untrusted: every scan checks a :class:`.graph_limits.Budget` as it goes (every few thousand
fields), and every allocation that grows with the file (node records, decoded tensors, the tables written) is
reserved against its memory budget before it is made. Typed tensor data (``int32_data``, ``int64_data``,
``float_data``) is decoded with NumPy, never one Python int per value; the writer joins views of the file's
bytes once, so the rewritten model costs its own size and no more.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .graph_limits import Budget
from .protowire import Malformed, fields, varint, varint_array, varint_count
from .protowire import length_delimited as _field
from .protowire import write_varint as _varint

_GRAPH, _OPSET = 7, 8  # ModelProto
_NODE, _INIT, _OUTPUT = 1, 5, 12  # GraphProto
_INT, _TENSOR, _INTS = 2, 4, 7  # AttributeProto.AttributeType
_DTYPES = {1: np.float32, 6: np.int32, 7: np.int64}  # TensorProto.DataType -> NumPy (the ones read here)
_TYPE_CODE = {np.dtype(v): k for k, v in _DTYPES.items()}
MAX_RANK = 16  # dims of a tensor decoded here (the rewrites match rank 4 at most)
MAX_INTS = 64  # values of an INTS attribute kept (a perm has 4; a longer one makes the node unmatched)
NODE_BYTES = 768  # a node record and its rewrite index entries; reserved with 16 bytes per byte of it (strings)
NAME_BYTES = 256  # an initializer's or output's entry


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
    ambiguous: bool = False  # an attribute given twice, a tensor attribute protobuf would merge, INTS too long


@dataclass
class Model:
    """The top graph of a ModelProto held in ``buf``, read within ``budget``."""

    buf: bytes
    nodes: list[Node]
    initializers: dict[str, tuple[int, int]]  # name -> span of its TensorProto
    outputs: list[str]
    budget: Budget = field(default_factory=Budget.unlimited)

    def array(self, name: str) -> np.ndarray | None:
        """Initializer ``name`` as an array (float32, int32 or int64 only), or None."""
        span = self.initializers.get(name)
        return tensor(self.buf, *span, budget=self.budget) if span else None


def read(buf: bytes, budget: Budget | None = None) -> Model:
    """The graph of the ModelProto ``buf``.

    Args:
        buf: the model's bytes.
        budget: checked as the fields are read; each record is reserved against it (none when None).

    Returns:
        The graph's nodes, initializers and outputs.

    Raises:
        Malformed: ``buf`` is not a ModelProto with one graph.
        RewriteRefused: the budget ran out.
    """
    budget = budget or Budget.unlimited()
    spans = [(a, b) for number, wire, a, b, _ in fields(buf, 0, len(buf), budget.check)
             if number == _GRAPH and wire == 2]
    if len(spans) != 1:
        raise Malformed
    start, end = spans[0]
    nodes: list[Node] = []
    inits: dict[str, tuple[int, int]] = {}
    outputs: list[str] = []
    for number, wire, a, b, _ in fields(buf, start, end, budget.check):
        if wire != 2:
            continue
        if number == _NODE:
            budget.reserve(NODE_BYTES + 16 * (b - a), "the graph's nodes")
            nodes.append(_node(buf, a, b, budget))
        elif number == _INIT:
            name = _tensor_name(buf, a, b, budget)
            budget.reserve(NAME_BYTES + len(name), "the graph's initializer names")
            inits[name] = (a, b)
        elif number == _OUTPUT:
            budget.reserve(NAME_BYTES + (b - a), "the graph's outputs")
            outputs.append(_last_text(buf, a, b, 1, budget))
    return Model(buf, nodes, inits, outputs, budget)


def write(model: Model, nodes: list[Node], add: dict[str, np.ndarray], drop: set[str],
          opsets: dict[str, int]) -> bytes:
    """``model``'s bytes with ``nodes`` as its node list, the ``add`` initializers added, the ``drop`` ones
    left out, and ``opsets`` (domain -> version) imported: one copy of what is kept, the added tables reserved
    against ``model.budget`` first.

    Raises:
        RewriteRefused: the budget ran out.
    """
    buf, budget, view = model.buf, model.budget, memoryview(model.buf)
    (start, end), = [(a, b) for n, w, a, b, _ in fields(buf, 0, len(buf), budget.check) if n == _GRAPH and w == 2]
    graph: list[Any] = []
    placed = False
    for number, wire, a, b, at in fields(buf, start, end, budget.check):
        if number == _NODE and wire == 2:
            if not placed:
                for n in nodes:
                    graph += _field_parts(_NODE, [n.raw if n.raw is not None else _encode_node(n)])
                placed = True
            continue
        if number == _INIT and wire == 2 and _tensor_name(buf, a, b, budget) in drop:
            continue
        graph.append(view[at:b if wire == 2 else _end_of(buf, at, end)])
    for name, arr in add.items():
        budget.reserve(arr.nbytes, f"the table {name!r} written")
        graph += _field_parts(_INIT, _tensor_parts(name, arr))
    out: list[Any] = []
    for number, wire, _a, b, at in fields(buf, 0, len(buf), budget.check):
        out += _field_parts(_GRAPH, graph) if number == _GRAPH and wire == 2 \
            else [view[at:b if wire == 2 else _end_of(buf, at, len(buf))]]
    out += [_field(_OPSET, _field(1, _utf8(d)) + _key(2, 0) + _varint(v)) for d, v in opsets.items()]
    return b"".join(out)


def tensor(buf: bytes, start: int, end: int, budget: Budget | None = None) -> np.ndarray | None:
    """The TensorProto at ``buf[start:end]`` as an array (float32, int32, int64), read as protobuf and
    ONNX Runtime read it (raw_data before the typed field of its type, int32_data truncated to 32 bits), or
    None (another type, external data, a negative dim, more than :data:`MAX_RANK` dims, data that does not
    fill the dims).

    Raises:
        Malformed: a packed field is not well-formed.
        RewriteRefused: ``budget`` ran out (its memory before the array is allocated).
    """
    budget = budget or Budget.unlimited()
    found = _tensor_fields(buf, start, end, budget)
    if found is None:
        return None
    dims, dtype, raw, typed = found
    kind = np.dtype(_DTYPES[dtype]).newbyteorder("<")
    if raw is None and dtype == 1:
        return _shaped(_floats(buf, typed[4], budget), dims)
    if raw is not None:
        count, rest = divmod(raw[1] - raw[0], kind.itemsize)
        if rest or count != math.prod(dims):
            return None
        budget.reserve(raw[1] - raw[0], "a constant decoded")
        return np.frombuffer(buf, kind, count, raw[0]).astype(kind.newbyteorder("=")).reshape(dims)
    values = _typed_values(buf, typed[5 if dtype == 6 else 7], math.prod(dims), budget)
    if values is None or dtype == 7:
        return _shaped(values.view(np.int64) if values is not None else None, dims)
    budget.reserve(4 * values.size, "a constant decoded")  # int32_data: each value's low 32 bits, as protobuf
    out = values.astype(np.uint32).view(np.int32)  # reads an int32
    budget.release(values.nbytes)
    return _shaped(out, dims)


def _tensor_fields(buf: bytes, start: int, end: int,
                   budget: Budget) -> tuple[list[int], int, tuple[int, int] | None, dict[int, list[Any]]] | None:
    """(dims, data type, raw_data's span, {float_data, int32_data, int64_data: packed spans and unpacked
    values}) of a TensorProto, or None where :func:`tensor` gives None without decoding anything."""
    dims: list[int] = []
    dtype, raw = 0, None
    typed: dict[int, list[Any]] = {4: [], 5: [], 7: []}
    for number, wire, a, b, _ in fields(buf, start, end, budget.check):
        if number == 1:
            dims += [_signed(a)] if wire == 0 else [_signed(int(v)) for v in _few_varints(buf, a, b, MAX_RANK)]
            if len(dims) > MAX_RANK:
                return None
        elif number == 2 and wire == 0:
            dtype = a
        elif number == 9 and wire == 2:
            raw = (a, b)
        elif number in (5, 7):
            _add_value(typed[number], a, b, wire, budget)
        elif number == 4 and wire == 2:
            typed[4].append((a, b))
        elif number == 14 and wire == 0 and a == 1:
            return None  # external data
    if dtype not in _DTYPES or any(d < 0 for d in dims):
        return None
    return dims, dtype, raw, typed


def _shaped(arr: np.ndarray | None, dims: list[int]) -> np.ndarray | None:
    return arr.reshape(dims) if arr is not None and arr.size == math.prod(dims) else None


def _add_value(pieces: list[Any], a: int, b: int, wire: int, budget: Budget) -> None:
    """Record one repeated varint field's occurrence: a packed span, or an unpacked value (kept 8 bytes each,
    reserved a block at a time)."""
    if wire == 2:
        pieces.append((a, b))
        return
    if not pieces or not isinstance(pieces[-1], array):
        pieces.append(array("Q"))
    if not len(pieces[-1]) % 4096:
        budget.reserve(8 * 4096, "a constant decoded")
    pieces[-1].append(a)


def _typed_values(buf: bytes, pieces: list[Any], size: int, budget: Budget) -> np.ndarray | None:
    """int32_data or int64_data's values as uint64, or None when they are not ``size`` values."""
    counts = [len(p) if isinstance(p, array) else varint_count(buf, *p) for p in pieces]
    if sum(counts) != size:
        return None
    budget.reserve(8 * size, "a constant decoded")
    parts = [np.frombuffer(p, np.uint64) if isinstance(p, array) else varint_array(buf, *p, budget.check)
             for p in pieces]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def _floats(buf: bytes, spans: list[tuple[int, int]], budget: Budget) -> np.ndarray | None:
    """Packed float_data's values (every occurrence, in order), or None where one is not whole floats."""
    if any((b - a) % 4 for a, b in spans):
        return None
    budget.reserve(sum(b - a for a, b in spans), "a constant decoded")
    parts = [np.frombuffer(buf, "<f4", (b - a) // 4, a) for a, b in spans]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def _few_varints(buf: bytes, a: int, b: int, most: int) -> list[int]:
    """The packed varints of ``buf[a:b]``, read one by one up to ``most`` + 1 of them (more is too many)."""
    out, pos = [], a
    while pos < b and len(out) <= most:
        value, pos = varint(buf, pos, b)
        out.append(value)
    return out


def encode_tensor(name: str, arr: np.ndarray) -> bytes:
    """A TensorProto (raw_data, little-endian) of ``arr`` (float32, int32 or int64)."""
    return b"".join(_tensor_parts(name, arr))


def _tensor_parts(name: str, arr: np.ndarray) -> list[Any]:
    """:func:`encode_tensor`'s bytes as parts to join: the array's bytes as a view, not a copy."""
    data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    dims = b"".join(_key(1, 0) + _varint(d) for d in arr.shape)
    head = dims + _key(2, 0) + _varint(_TYPE_CODE[arr.dtype]) + _field(8, _utf8(name))
    return [head, *_field_parts(9, [memoryview(data.reshape(-1)).cast("B") if data.size else b""])]


def _node(buf: bytes, start: int, end: int, budget: Budget) -> Node:
    node = Node("", [], [], raw=bytes(buf[start:end]))
    for number, wire, a, b, _ in fields(buf, start, end, budget.check):
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
            _attribute(buf, a, b, node, budget)
    return node


def _attribute(buf: bytes, start: int, end: int, node: Node, budget: Budget) -> None:
    """Record the INT, INTS or TENSOR attribute at ``buf[start:end]`` on ``node``: the value its type field
    names (the first one set where it has no type); INTS longer than :data:`MAX_INTS` make it ambiguous."""
    name, ints, one, spans, kind = "", [], None, [], 0
    for number, wire, a, b, _ in fields(buf, start, end, budget.check):
        if number == 1 and wire == 2:
            name = _text(buf, a, b)
        elif number == 3 and wire == 0:
            one = _signed(a)
        elif number == 8 and len(ints) <= MAX_INTS:
            ints += [_signed(a)] if wire == 0 else [_signed(v) for v in _few_varints(buf, a, b, MAX_INTS)]
        elif number == 5 and wire == 2:
            spans.append((a, b))
        elif number == 20 and wire == 0:
            kind = a
    if name in node.ints or name in node.tensors or len(spans) > 1 or len(ints) > MAX_INTS:
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


def _tensor_name(buf: bytes, start: int, end: int, budget: Budget) -> str:
    return _last_text(buf, start, end, 8, budget)


def _last_text(buf: bytes, start: int, end: int, number: int, budget: Budget) -> str:
    """The string field ``number`` of the message at ``buf[start:end]``: its last occurrence, as protobuf
    reads a field given twice ("" if none)."""
    text = ""
    for n, wire, a, b, _ in fields(buf, start, end, budget.check):
        if n == number and wire == 2:
            text = _text(buf, a, b)
    return text


def _text(buf: bytes, a: int, b: int) -> str:
    return bytes(buf[a:b]).decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 kept as they are


def _utf8(text: str) -> bytes:
    """``text`` as the bytes :func:`_text` read it from."""
    return text.encode("utf-8", "surrogateescape")


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


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _field_parts(number: int, parts: list[Any]) -> list[Any]:
    """:func:`_field` of the joined ``parts`` (bytes or byte views), as parts: nothing copied."""
    return [_key(number, 2) + _varint(sum(len(part) for part in parts)), *parts]
