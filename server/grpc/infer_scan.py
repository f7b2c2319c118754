"""A serialized ModelInferRequest read on the wire (:mod:`irpe.artifact.protowire`'s varints, guided by the
message's descriptor), before protobuf parses it: what :mod:`.handlers` cuts out, and the limits that keep
protobuf's parse and the servicer's checks proportional to a real request rather than to the message's size.

- The raw tensors (``raw_input_contents``) and a request id over :data:`MAX_ID_BYTES` are cut out
  (:class:`Cut`): protobuf never copies them.
- At most :data:`FIELD_BUDGET` top-level fields, and :data:`TOTAL_BUDGET` fields in all: the fields of every
  nested message (inputs, outputs, parameters and their map entries, a group's fields) and every value of a
  packed repeated number (a shape) count one each; a nested message of at most :data:`SMALL_BYTES` (a map entry,
  a short output) counts one per two of its bytes instead of being walked, which costs a real request nothing.
  A packed field is one field on the wire however many values it holds, and protobuf's parser holds the GIL
  while it reads them, whichever thread it runs in (measured: 3.6 s for a 19 M-dimension shape, 1.9 s for 1 M
  input parameters, 0.5 s for 16 MB of tiny fields).
- A shape of at most :data:`MAX_DIMS` dimensions, strings of at most :data:`MAX_STRING_BYTES` (names, datatypes,
  parameter keys and values): an error message that quotes them stays short.

Past any limit the request is refused unparsed (:class:`OverLimit`, a ``DecodeError``: INVALID_ARGUMENT naming
the limit). Anything the scan does not understand is left to protobuf, which then refuses it too: the scan
stops where protobuf's parse would stop, so everything before that point was counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from irpe.artifact.protowire import MAX_FIELD, Malformed, varint

RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents: repeated bytes
REQUEST_ID = 3  # ModelInferRequest.id: string
MAX_ID_BYTES = 4096  # a longer id is left out of the parse (the servicer refuses the request, naming its cap)
FIELD_BUDGET = 256  # top-level fields a request may have
TOTAL_BUDGET = 2048  # fields and packed values at every depth
MAX_DIMS = 64  # values of one tensor's shape
MAX_STRING_BYTES = 4096  # bytes of any other string field
MAX_DEPTH = 8  # nesting the descriptor walk follows (the request nests 3 deep)
MAX_GROUPS = 32  # groups nested in groups (protobuf's parser allows 100; a ModelInferRequest has none)
SMALL_BYTES = MAX_DIMS  # a nested message this small is charged, not walked (see _Scan.check)
_LOW = bytes(range(128))  # a varint's last byte is one of these
_VARINT_TYPES = frozenset({FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
                           FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
                           FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM})


class OverLimit(DecodeError):
    """A request past one of the scan's limits (the message says which)."""


class TooManyFields(OverLimit):
    """A request of more top-level fields than :data:`FIELD_BUDGET`."""


class Cut(NamedTuple):
    """A field taken out of the message before protobuf parses the rest: at ``at``, its value ``data[a:b]`` (a
    named tuple: one is made per request, and a dataclass costs several times more)."""

    at: int
    a: int
    b: int
    raw: bool  # a raw tensor (else a request id over MAX_ID_BYTES)


@dataclass(frozen=True)
class Field:
    """What the scan checks of one field of a message: a message to walk, a string, or packed numbers."""

    name: str
    kind: str  # "message", "string" or "numbers"
    fields: dict[int, Field] = field(default_factory=dict)  # a message's own
    cap: int = 0  # values per message (0: only the total budget)


def schema(descriptor: Descriptor, depth: int = 0) -> dict[int, Field]:
    """The fields of ``descriptor`` the scan checks, by number.

    Args:
        descriptor: a protobuf message descriptor.
        depth: how deep it is nested (the walk stops at :data:`MAX_DEPTH`).

    Returns:
        Messages, strings and repeated varint numbers (the shape capped at :data:`MAX_DIMS`).
    """
    out: dict[int, Field] = {}
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE and depth < MAX_DEPTH:
            out[f.number] = Field(f.name, "message", schema(f.message_type, depth + 1))
        elif f.type == FieldDescriptor.TYPE_STRING:
            out[f.number] = Field(f.name, "string")
        elif _repeated(f) and f.type in _VARINT_TYPES:
            out[f.number] = Field(f.name, "numbers", cap=MAX_DIMS if f.name == "shape" else 0)
    return out


def _repeated(f: FieldDescriptor) -> bool:
    flag = getattr(f, "is_repeated", None)  # protobuf 6 (label is deprecated there)
    return bool(flag) if flag is not None else f.label == FieldDescriptor.LABEL_REPEATED


INFER = schema(pb.ModelInferRequest.DESCRIPTOR)


def cuts(data: bytes) -> list[Cut]:
    """The raw tensors and over-long id of a serialized ModelInferRequest, its limits checked.

    Args:
        data: the message as received.

    Returns:
        The cuts, in order; [] when the message is not well-formed (protobuf then parses it, and fails).

    Raises:
        OverLimit: past a limit (:class:`TooManyFields` past :data:`FIELD_BUDGET`).
    """
    try:
        return _Scan().top(data)
    except Malformed:
        return []


class _Scan:
    """One message's walk, with what is left of :data:`TOTAL_BUDGET`."""

    def __init__(self) -> None:
        self.left = TOTAL_BUDGET
        self.groups = 0  # groups open

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise OverLimit(f"more than {TOTAL_BUDGET} fields in all (nested fields, map entries and repeated "
                            "values each count); a ModelInferRequest has a few per input, output and parameter")

    def top(self, data: bytes) -> list[Cut]:
        out, count, pos = [], 0, 0
        while pos < len(data):
            at = pos
            number, wire, a, b, pos = self.next(data, pos, len(data))
            count += 1
            if count > FIELD_BUDGET:
                raise TooManyFields(f"more than {FIELD_BUDGET} top-level fields; a ModelInferRequest has one per "
                                    "input, output, parameter and raw tensor")
            if wire == 2 and number == RAW_INPUT_CONTENTS:
                out.append(Cut(at, a, b, True))
            elif wire == 2 and number == REQUEST_ID and b - a > MAX_ID_BYTES:
                out.append(Cut(at, a, b, False))
            elif number in INFER and number != REQUEST_ID:
                self.check(data, INFER[number], wire, a, b, "", {})
        return out

    def message(self, buf: bytes, pos: int, end: int, fields: dict[int, Field], path: str) -> None:
        values: dict[int, int] = {}
        while pos < end:
            number, wire, a, b, pos = self.next(buf, pos, end)
            if number in fields:
                self.check(buf, fields[number], wire, a, b, path, values)

    def check(self, buf: bytes, f: Field, wire: int, a: int, b: int, path: str, values: dict[int, int]) -> None:
        """One field's value: a message walked, a string's size, a packed field's values counted."""
        where = f"{path}.{f.name}" if path else f.name
        if f.kind == "message" and wire == 2 and b - a <= SMALL_BYTES:
            self.take((b - a) // 2)  # a field takes 2 bytes at least; it holds no string, no shape over a cap
        elif f.kind == "message" and wire == 2:
            self.message(buf, a, b, f.fields, where)
        elif f.kind == "string" and wire == 2 and b - a > MAX_STRING_BYTES:
            raise OverLimit(f"{where} is a string of {b - a} bytes; at most {MAX_STRING_BYTES}")
        elif f.kind == "numbers" and wire in (0, 2):
            room = f.cap - values.get(f.name, 0) if f.cap else self.left + 1
            if wire == 2 and b - a > 10 * room:  # a varint is 1-10 bytes: more values than there is room for
                n = room + 1
            else:
                n = 1 if wire == 0 else self.packed(buf, a, b)
            if f.cap and n > room:
                raise OverLimit(f"{where} has more than {f.cap} values; a tensor's shape has one per dimension")
            self.take(n - 1)  # the field itself was counted
            values[f.name] = values.get(f.name, 0) + n

    def packed(self, buf: bytes, a: int, b: int) -> int:
        """The values of a packed varint field (each ends with a byte under 0x80): called for a field of at
        most 10 bytes per value the budget has room for, so a huge one is never copied."""
        chunk = buf[a:b]
        return len(chunk) - len(chunk.translate(None, _LOW)) if chunk else 0

    def next(self, buf: bytes, pos: int, end: int) -> tuple[int, int, int, int, int]:
        """(number, wire type, a, b, the position after it) of the field at ``pos``: a varint's value in ``a``, a
        length-delimited field's bytes at ``buf[a:b]``; counted, and a group's fields with it."""
        key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if not 0 < number <= MAX_FIELD:
            raise Malformed
        self.take(1)
        if wire == 0:
            value, pos = varint(buf, pos, end)
            return number, 0, value, pos, pos
        if wire == 2:
            length, pos = varint(buf, pos, end)
            if length > end - pos:
                raise Malformed
            return number, 2, pos, pos + length, pos + length
        if wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise Malformed
            return number, wire, 0, 0, pos
        if wire == 3:
            return number, 3, 0, 0, self.group(buf, pos, end, number)
        raise Malformed

    def group(self, buf: bytes, pos: int, end: int, number: int) -> int:
        """The position after the END_GROUP closing group ``number``; its fields counted."""
        self.groups += 1
        if self.groups > MAX_GROUPS:
            raise OverLimit(f"groups nested more than {MAX_GROUPS} deep; a ModelInferRequest has none")
        while pos < end:
            key, after = varint(buf, pos, end)
            if key & 7 == 4:
                if key >> 3 != number:
                    raise Malformed
                self.groups -= 1
                return after
            pos = self.next(buf, pos, end)[4]
        raise Malformed
