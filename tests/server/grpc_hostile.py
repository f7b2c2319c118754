"""Hostile gRPC clients for tests/server/hostile_input/test_grpc_listener.py, without tritonclient's messages (the test
process imports kserve, whose protobuf package clashes with them): protobuf bytes written by hand, raw HTTP/2 frames
over a socket, and a probe that times a keyed gRPC call and HTTP /healthz while an attack runs."""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import grpc
import httpx
import numpy as np

SERVICE = "/inference.GRPCInferenceService/"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, GOAWAY, RST_STREAM, HEADERS = 0x4, 0x7, 0x3, 0x1
MAX_CONCURRENT_STREAMS = 0x3


def varint(value: int) -> bytes:
    """The base-128 varint of ``value``."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def infer_request(model: str = "tiny-mean", images: int = 1, request_id: str = "", seed: int = 0) -> bytes:
    """A serialized ModelInferRequest of ``images`` random 3x32x32 FP32 images as raw_input_contents."""
    x = np.random.default_rng(seed).standard_normal((images, 3, 32, 32), dtype=np.float32)
    shape = b"".join(varint(d) for d in x.shape)
    tensor = field_bytes(1, b"images") + field_bytes(2, b"FP32") + field_bytes(3, shape)
    return (field_bytes(1, model.encode()) + (field_bytes(3, request_id.encode()) if request_id else b"")
            + field_bytes(5, tensor) + field_bytes(7, x.astype("<f4").tobytes()))


def tiny_fields(size: int) -> bytes:
    """``size`` bytes of two-byte varint fields (number 15, value 0): a message costly to walk field by field."""
    return b"\x78\x00" * (size // 2)


def keyed(key: str) -> tuple[tuple[str, str], ...]:
    """The metadata of a keyed call."""
    return (("authorization", f"Bearer {key}"),)


def call(channel: grpc.Channel, rpc: str, request: bytes = b"", key: str = "", timeout: float = 10.0) -> bytes:
    """One unary RPC with raw bytes in and out."""
    return channel.unary_unary(SERVICE + rpc)(request, metadata=keyed(key) if key else None, timeout=timeout)


def status_of(fn: object) -> tuple[grpc.StatusCode, str]:
    """(status code, details) of calling ``fn``."""
    try:
        fn()  # type: ignore[operator]
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def frame(kind: int, payload: bytes = b"", flags: int = 0, stream: int = 0) -> bytes:
    """One HTTP/2 frame."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def h2_connect(port: int, preface: bool = True) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port``, with the HTTP/2 preface and an empty SETTINGS frame sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if preface:
        sock.sendall(PREFACE + frame(SETTINGS))
    return sock


def read_frames(sock: socket.socket, seconds: float) -> tuple[list[tuple[int, int, bytes]], bool]:
    """The frames (kind, stream, payload) read within ``seconds``, and whether the peer closed."""
    buf, frames, end = b"", [], time.monotonic() + seconds
    while time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionError:
            return frames, True
        if not data:
            return frames, True
        buf += data
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            length = int.from_bytes(buf[:3], "big")
            frames.append((buf[3], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + length]))
            buf = buf[9 + length:]
    return frames, False


def settings_of(frames: list[tuple[int, int, bytes]]) -> dict[int, int]:
    """The values of the SETTINGS frames among ``frames``."""
    values = {}
    for kind, _, payload in frames:
        if kind == SETTINGS:
            for at in range(0, len(payload), 6):
                ident, value = struct.unpack(">HI", payload[at:at + 6])
                values[ident] = value
    return values


def headers_frame(stream: int, path: str) -> bytes:
    """A HEADERS frame opening a gRPC call to ``path`` (HPACK literals, no END_STREAM: the message never comes)."""
    block = b""
    for name, value in ((":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                        ("content-type", "application/grpc"), ("te", "trailers")):
        block += b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()
    return frame(HEADERS, block, flags=0x4, stream=stream)  # END_HEADERS


@dataclass
class Probe:
    """Times a keyed gRPC call and HTTP /healthz, one after the other, from a thread until stopped."""

    address: str
    http_url: str
    key: str
    grpc_ms: list[float] = field(default_factory=list)
    http_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Probe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)

    def _run(self) -> None:
        own = [("grpc.use_local_subchannel_pool", 1)]  # its own connection, not one an earlier channel left
        with grpc.insecure_channel(self.address, options=own) as channel, httpx.Client(timeout=10) as http:
            while not self._stop.is_set():
                start = time.perf_counter()
                code, details = status_of(lambda: call(channel, "ServerMetadata", key=self.key))
                self.grpc_ms.append((time.perf_counter() - start) * 1000)
                if code != grpc.StatusCode.OK:
                    self.failures.append(f"gRPC {code.name} {details}")
                start = time.perf_counter()
                status = http.get(self.http_url + "/healthz").status_code
                self.http_ms.append((time.perf_counter() - start) * 1000)
                if status != 200:
                    self.failures.append(f"/healthz {status}")
                time.sleep(0.02)

    def warm(self, calls: int = 3, timeout: float = 10.0) -> Probe:
        """Wait until ``calls`` rounds were timed (the probe's connection is up before the attack starts)."""
        deadline = time.monotonic() + timeout
        while len(self.http_ms) < calls and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def worst_ms(self) -> float:
        """The slowest answer of either kind (ms; infinite when none came)."""
        return max(self.grpc_ms + self.http_ms, default=float("inf"))
