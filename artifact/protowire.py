"""The protobuf wire format, read without a schema (torch-free, no protobuf package): the fields of a message
as numbers, wire types and byte spans. Used to find an ONNX file's external tensors without the onnx package
(:mod:`.onnx_scan`) and by the server to split a gRPC request before protobuf parses it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

MAX_FIELD = 2**29 - 1  # the largest field number protobuf reads
TICK = 4096  # fields between two calls of a scan's ``tick``
CHUNK = 1 << 18  # bytes of packed varints decoded at once (the work arrays: about 60 bytes per byte)


def write_varint(value: int) -> bytes:
    """``value`` as a base-128 varint (a negative one as its 64-bit two's complement, as protobuf writes int64)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` with wire type 2 (bytes, string, message) holding ``payload``."""
    return write_varint(number << 3 | 2) + write_varint(len(payload)) + payload


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


def fields(buf: Any, start: int, end: int,
           tick: Callable[[], None] | None = None) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, a, b, where the field starts) per field of ``buf[start:end]``: a varint's value
    in ``a``, a length-delimited field's bytes at ``buf[a:b]``; fixed-width fields and groups are skipped over.
    Malformed for anything that is not well-formed (then a parser refuses it too). ``tick``, when given, is
    called every :data:`TICK` fields, skipped ones included (a budget check: it may raise)."""
    pos, count = start, 0
    while pos < end:
        if tick is not None:
            count += 1
            if not count % TICK:
                tick()
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
            pos = _skip_group(buf, pos, end, number, tick)
        else:
            raise Malformed
    if pos != end:
        raise Malformed


def _skip_group(buf: Any, pos: int, end: int, number: int, tick: Callable[[], None] | None = None) -> int:
    """Position after the END_GROUP that closes group ``number`` (deprecated wire types 3/4); the groups
    inside it must close in order and every field fit, as protobuf reads them."""
    groups, count = [number], 0
    while pos < end:
        if tick is not None:
            count += 1
            if not count % TICK:
                tick()
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


def varint_count(buf: Any, start: int, end: int) -> int:
    """How many varints the packed field ``buf[start:end]`` holds (its bytes below 0x80)."""
    data = np.frombuffer(buf, np.uint8, end - start, start)
    return sum(int(np.count_nonzero(data[i:i + CHUNK] < 0x80)) for i in range(0, len(data), CHUNK))


def varint_array(buf: Any, start: int, end: int, tick: Callable[[], None] | None = None) -> np.ndarray:
    """The packed varints of ``buf[start:end]`` as uint64 (each one's low 64 bits, as :func:`varint` reads
    them), decoded with NumPy :data:`CHUNK` bytes at a time, ``tick`` called between chunks. Its size is
    :func:`varint_count`. Malformed where :func:`varint` would be (one longer than 10 bytes, or cut off)."""
    data = np.frombuffer(buf, np.uint8, end - start, start)
    out = np.empty(varint_count(buf, start, end), np.uint64)
    pos = done = 0
    while pos < len(data):
        if tick is not None:
            tick()
        chunk = data[pos:pos + CHUNK]
        ends = np.flatnonzero(chunk < 0x80)
        if not len(ends) or (pos + len(chunk) == len(data) and ends[-1] != len(chunk) - 1):
            raise Malformed  # no varint ends in the chunk (longer than 10 bytes), or the last one is cut off
        chunk = chunk[:ends[-1] + 1]
        if len(ends) == len(chunk):  # one byte each
            out[done:done + len(ends)] = chunk
        else:
            starts = np.concatenate(([0], ends[:-1] + 1))
            lengths = ends - starts + 1
            if lengths.max() > 10:
                raise Malformed
            shift = (np.arange(len(chunk)) - np.repeat(starts, lengths)).astype(np.uint64) * np.uint64(7)
            out[done:done + len(ends)] = np.add.reduceat((chunk & 0x7F).astype(np.uint64) << shift, starts)
        pos, done = pos + len(chunk), done + len(ends)
    return out
