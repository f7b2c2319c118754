"""Tensors an ONNX file keeps in other files ("external data"), found without the onnx package.

ONNX Runtime and OpenVINO read a tensor's bytes from another file when the tensor's ``data_location`` is
EXTERNAL (its ``external_data`` entries name the file), and both keep that file mapped while the model
runs: a later write to it changes a loaded model with no reload and no checksum. An artifact is therefore
one checksummed ``.onnx`` file, and :func:`external_tensors` lets the loader refuse anything else.

The walk reads the protobuf wire format of the messages that can hold a tensor (graph initializers,
node attributes, subgraphs, functions, training graphs, sparse tensors), skipping tensor bytes unread.
A file that is not well-formed protobuf yields nothing here: the runtime's parser reads the same wire
format and refuses it. Nesting deeper than :data:`MAX_DEPTH` (protobuf's own default limit) is an error.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 100
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# message -> {field number: embedded message} (onnx.proto: the fields through which a tensor is reachable)
_CHILDREN: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "function": {7: "node", 11: "attribute"},
    "training": {1: "graph", 2: "graph"},
    "sparse": {1: "tensor", 2: "tensor"},
}


@dataclass(frozen=True)
class ExternalTensor:
    """A tensor whose data lives outside the .onnx file: its name and the file it names ("" if none)."""

    name: str
    location: str


class _Malformed(Exception):
    """Not well-formed protobuf (left to the runtime, which refuses it)."""


class TooDeep(ValueError):
    """Messages nested deeper than MAX_DEPTH."""


def external_tensors(path: str | Path) -> list[ExternalTensor]:
    """Every tensor of the ONNX file ``path`` stored outside it ([] for a self-contained file)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            found: list[ExternalTensor] = []
            try:
                _walk(buf, 0, len(buf), "model", 0, found)
            except _Malformed:
                return []
            return found


def _walk(buf: mmap.mmap, start: int, end: int, kind: str, depth: int, found: list[ExternalTensor]) -> None:
    if depth > MAX_DEPTH:
        raise TooDeep(f"ONNX messages nested deeper than {MAX_DEPTH} levels")
    if kind == "tensor":
        _tensor(buf, start, end, found)
        return
    children = _CHILDREN[kind]
    for number, wire, a, b in _fields(buf, start, end):
        if wire == 2 and number in children:
            _walk(buf, a, b, children[number], depth + 1, found)


def _tensor(buf: mmap.mmap, start: int, end: int, found: list[ExternalTensor]) -> None:
    """Record the tensor if it is external (data_location EXTERNAL, or any external_data entry at all)."""
    name, location, external = "", "", False
    for number, wire, a, b in _fields(buf, start, end):
        if number == 8 and wire == 2:
            name = buf[a:b].decode("utf-8", "replace")
        elif number == 13 and wire == 2:
            external = True
            entry = {k: buf[x:y] for k, w, x, y in _fields(buf, a, b) if w == 2 and k in (1, 2)}
            if entry.get(1) == b"location":
                location = entry.get(2, b"").decode("utf-8", "replace")
        elif number == 14 and wire == 0 and a == _EXTERNAL:
            external = True
    if external:
        found.append(ExternalTensor(name, location))


def _varint(buf: mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Malformed


def _fields(buf: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, a, b) per field: a varint's value in ``a``, a length-delimited field's
    bytes at ``buf[a:b]``; fixed-width fields and groups are skipped over."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, 0, value, pos
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise _Malformed
            yield number, 2, pos, pos + length
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 3:
            pos = _skip_group(buf, pos, end, number)
        else:
            raise _Malformed
    if pos != end:
        raise _Malformed


def _skip_group(buf: mmap.mmap, pos: int, end: int, number: int) -> int:
    """Position after the END_GROUP that closes group ``number`` (deprecated wire types 3/4)."""
    depth = 1
    while pos < end:
        key, pos = _varint(buf, pos, end)
        wire = key & 7
        if wire == 0:
            pos = _varint(buf, pos, end)[1]
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 3:
            depth += 1
        elif wire == 4:
            depth -= 1
            if depth == 0:
                return pos
        else:
            raise _Malformed
    raise _Malformed
