"""artifact/protowire.py's NumPy decoding of packed varints says what the one-at-a-time reader says: the same
values (low 64 bits), and Malformed for the same bytes; a scan's ``tick`` is called as fields pass."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irpe.artifact import protowire
from irpe.artifact.protowire import Malformed, fields, varint, varint_array, varint_count


def _one_by_one(data: bytes) -> list[int] | None:
    out, pos = [], 0
    try:
        while pos < len(data):
            value, pos = varint(data, pos, len(data))
            out.append(value)
    except Malformed:
        return None
    return out


def _encode(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 127, 128, 2**63, 2**64 - 1]), max_size=40))
def test_encoded_values_decode_to_themselves(values: list[int]) -> None:
    data = b"\x00" + b"".join(_encode(v) for v in values) + b"\x00"
    assert varint_count(data, 1, len(data) - 1) == len(values)
    assert varint_array(data, 1, len(data) - 1).tolist() == values


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.binary(max_size=40) | st.lists(st.sampled_from([b"\xff", b"\x80", b"\x7f", b"\x01", b"\x00"]),
                                         max_size=30).map(b"".join))
def test_any_bytes_decode_as_the_reader_reads_them(data: bytes) -> None:
    want = _one_by_one(data)
    if want is None:
        with pytest.raises(Malformed):
            varint_array(data, 0, len(data))
    else:
        assert varint_array(data, 0, len(data)).tolist() == want


def test_varints_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protowire, "CHUNK", 16)  # every varint length straddles a chunk boundary somewhere
    values = [(1 << (7 * k)) - 1 + k for k in range(1, 10)] * 7
    data = b"".join(_encode(v) for v in values)
    ticks: list[None] = []
    assert varint_array(data, 0, len(data), lambda: ticks.append(None)).tolist() == values
    assert len(ticks) >= len(data) // 16
    with pytest.raises(Malformed):  # 11 bytes with the continuation bit: longer than protobuf reads
        varint_array(b"\x01" + b"\xff" * 20 + b"\x01", 0, 22)


def test_a_scan_ticks_every_few_thousand_fields_skipped_ones_included() -> None:
    data = b"\x0d\x00\x00\x00\x00" * (3 * protowire.TICK)  # fixed32 fields: skipped, never yielded
    ticks: list[None] = []
    assert list(fields(data, 0, len(data), lambda: ticks.append(None))) == []
    assert len(ticks) == 3
