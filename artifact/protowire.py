"""The protobuf wire format, read without a schema (torch-free, no protobuf package): the fields of a message
as numbers, wire types and byte spans. Used to find an ONNX file's external tensors without the onnx package
(:mod:`.onnx_scan`) and by the server to split a gRPC request before protobuf parses it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAX_FIELD = 2**29 - 1  # the largest field number protobuf reads


class Malformed(Exception):
    """Not well-formed protobuf."""


def varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """(the base-128 varint at ``buf[pos]``, the position after it): at most 10 bytes, its low 64 bits kept,
    as protobuf reads it."""
    value = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
    raise Malformed


def fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, a, b, where the field starts) per field of ``buf[start:end]``: a varint's value
    in ``a``, a length-delimited field's bytes at ``buf[a:b]``; fixed-width fields and groups are skipped over.
    Malformed for anything that is not well-formed (then a parser refuses it too)."""
    pos = start
    while pos < end:
        at = pos
        key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if not 0 < number <= MAX_FIELD:
            raise Malformed
        if wire == 0:
            value, pos = varint(buf, pos, end)
            yield number, 0, value, pos, at
        elif wire == 2:
            length, pos = varint(buf, pos, end)
            if length > end - pos:
                raise Malformed
            yield number, 2, pos, pos + length, at
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 3:
            pos = _skip_group(buf, pos, end, number)
        else:
            raise Malformed
    if pos != end:
        raise Malformed


def _skip_group(buf: Any, pos: int, end: int, number: int) -> int:
    """Position after the END_GROUP that closes group ``number`` (deprecated wire types 3/4); the groups
    inside it must close in order and every field fit, as protobuf reads them."""
    groups = [number]
    while pos < end:
        key, pos = varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if not 0 < field <= MAX_FIELD:
            raise Malformed
        if wire == 0:
            pos = varint(buf, pos, end)[1]
        elif wire == 2:
            length, pos = varint(buf, pos, end)
            if length > end - pos:
                raise Malformed
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 3:
            groups.append(field)
        elif wire == 4:
            if groups.pop() != field:
                raise Malformed
            if not groups:
                return pos
        else:
            raise Malformed
    raise Malformed
