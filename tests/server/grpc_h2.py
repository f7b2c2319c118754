"""gRPC calls written as raw HTTP/2 frames for tests/server/hostile_input/test_grpc_keyless.py: calls that hold a
stream open without their message, streams that send a message now and then, gzip-compressed messages, header
blocks of any size (HPACK literals across CONTINUATION frames), with or without acknowledging the server's
SETTINGS. Nothing here waits for the server beyond what a test asks (:func:`drain`)."""

from __future__ import annotations

import gzip
import socket
import struct
import time

from tests.server.grpc_hostile import PREFACE, SETTINGS, frame

HEADERS, CONTINUATION, DATA, RST_STREAM, GOAWAY = 0x1, 0x9, 0x0, 0x3, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
MAX_FRAME = 16384  # HTTP/2's default SETTINGS_MAX_FRAME_SIZE: the largest frame a peer must accept
HEALTH = "/grpc.health.v1.Health/"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
INFERENCE = "/inference.GRPCInferenceService/"
LIST_SERVICES = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 5.1); ``first`` holds the prefix byte's other bits."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([first | value])
    out, value = bytearray([first | top]), value - top
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: str, value: str | bytes) -> bytes:
    """A header field as an HPACK literal without indexing, new name, no Huffman coding."""
    raw = value.encode() if isinstance(value, str) else value
    return b"\x00" + hpack_int(len(name), 7) + name.encode() + hpack_int(len(raw), 7) + raw


def call_headers(path: str, extra: tuple[tuple[str, str | bytes], ...] = ()) -> bytes:
    """The header block of a gRPC call to ``path``, with ``extra`` fields after the standard ones."""
    fields = ((":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
              ("content-type", "application/grpc"), ("te", "trailers"), *extra)
    return b"".join(literal(name, value) for name, value in fields)


def open_stream(stream: int, block: bytes, end_stream: bool = False) -> bytes:
    """HEADERS and as many CONTINUATION frames as ``block`` needs (each at most :data:`MAX_FRAME`)."""
    pieces = [block[at:at + MAX_FRAME] for at in range(0, len(block), MAX_FRAME)] or [b""]
    frames = []
    for i, piece in enumerate(pieces):
        flags = (END_HEADERS if i == len(pieces) - 1 else 0) | (END_STREAM if i == 0 and end_stream else 0)
        frames.append(frame(HEADERS if i == 0 else CONTINUATION, piece, flags, stream))
    return b"".join(frames)


def message(payload: bytes, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message."""
    return bytes([1 if compressed else 0]) + struct.pack(">I", len(payload)) + payload


def data(stream: int, payload: bytes, end_stream: bool = False) -> bytes:
    """DATA frames of ``payload`` (at most :data:`MAX_FRAME` each; the last one ends the stream if asked)."""
    pieces = [payload[at:at + MAX_FRAME] for at in range(0, len(payload), MAX_FRAME)] or [b""]
    return b"".join(frame(DATA, piece, END_STREAM if end_stream and i == len(pieces) - 1 else 0, stream)
                    for i, piece in enumerate(pieces))


def gzip_bomb(inflated: int) -> bytes:
    """A message body of ``inflated`` bytes of varint fields 15 = 0 (an empty message to protobuf: unknown
    fields), gzip-compressed (19 MiB compress to about 19 KB)."""
    return gzip.compress(b"\x78\x00" * (inflated // 2), compresslevel=9)


def connect(port: int, ack: bool = True, timeout: float = 5.0) -> socket.socket:
    """A client connection to 127.0.0.1:``port``: the preface and an empty SETTINGS sent; with ``ack`` the
    server's SETTINGS acknowledged too (read here: the server sends them at once). Without ``ack`` the server's
    settings (its header list limit among them) never take effect."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(PREFACE + frame(SETTINGS))
    if ack:
        sock.sendall(frame(SETTINGS, flags=ACK))
    return sock


def drain(sock: socket.socket, seconds: float) -> tuple[list[tuple[int, int, int, bytes]], bool]:
    """Frames (kind, flags, stream, payload) read within ``seconds``, and whether the server closed."""
    buf, frames, end = b"", [], time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return frames, False
        sock.settimeout(left)
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            return frames, False
        except OSError:
            return frames, True
        if not chunk:
            return frames, True
        buf += chunk
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            length = int.from_bytes(buf[:3], "big")
            frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + length]))
            buf = buf[9 + length:]


def answered(frames: list[tuple[int, int, int, bytes]], stream: int) -> bool:
    """Whether the server sent a response message on ``stream`` (a refusal is trailers only: no DATA)."""
    return any(kind == DATA and at == stream and payload for kind, _, at, payload in frames)


def reset(frames: list[tuple[int, int, int, bytes]], stream: int) -> bool:
    """Whether the server reset ``stream``."""
    return any(kind == RST_STREAM and at == stream for kind, _, at, _ in frames)
