"""server/http/protocol.py over a real socket pair and uvicorn's machinery: a body of declared size reaches the
application as one ASGI message however it was split on the wire; other bodies keep uvicorn's path; the bytes
are the ones sent; a head over --max-header-kb is 431 whatever the read size, and the application never sees
it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from irpe.server.config import Settings
from irpe.server.http.protocol import Limits
from tests.server.helpers import protocol_over_socketpair

BODY = bytes(range(256)) * 2352  # 602,112 bytes: one 224 px FP32 image


async def _serve_one(request: bytes, pieces: int, settings: Settings,
                     reads: list[int] | None = None) -> tuple[list[dict[str, Any]], bytes]:
    """Send ``request`` in ``pieces`` writes (each its own read on the server side) to irpe's HTTP protocol,
    and return the ASGI ``http.request`` messages the application received and the answer; ``reads`` collects
    the size of each read the protocol got."""
    messages: list[dict[str, Any]] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        while True:
            message = await receive()
            messages.append(message)
            if not message.get("more_body"):
                break
        size = str(sum(len(m.get("body", b"")) for m in messages)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(size))]})
        await send({"type": "http.response.body", "body": size})

    proto, transport, theirs = await protocol_over_socketpair(app, settings)
    if reads is not None:
        received = proto.data_received  # type: ignore[attr-defined]
        proto.data_received = lambda data: (reads.append(len(data)), received(data))  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    step = -(-len(request) // pieces)
    for start in range(0, len(request), step):
        try:
            await loop.sock_sendall(theirs, request[start:start + step])
        except (BrokenPipeError, ConnectionResetError):
            break  # the server answered and closed (431) before the rest was sent
        await asyncio.sleep(0.005)  # the server reads each piece before the next one is sent
    got = b""
    while b"\r\n\r\n" not in got or not got.split(b"\r\n\r\n", 1)[1]:
        piece = await asyncio.wait_for(loop.sock_recv(theirs, 65536), 5)
        assert piece, f"closed after {got!r}"
        got += piece
    transport.close()
    theirs.close()
    return messages, got


def _post(body: bytes, headers: bytes = b"", path: bytes = b"/v2/models/m/infer") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\n%s\r\n" % (path, len(body), headers) + body


def test_a_declared_body_split_on_the_wire_is_one_message() -> None:
    messages, answer = asyncio.run(_serve_one(_post(BODY), 12, Settings()))
    assert answer.endswith(b"\r\n\r\n602112")
    assert len(messages) == 1 and messages[0]["more_body"] is False and messages[0]["body"] == BODY


def test_other_routes_keep_uvicorns_path() -> None:
    """Only the inference routes (which read their whole body once the key is checked) collect it first."""
    messages, answer = asyncio.run(_serve_one(_post(BODY, path=b"/classify"), 12, Settings()))
    assert len(messages) == 1 and messages[0]["body"] == BODY
    for path in (b"/v2/repository/index", b"/v2/models/m/infer/x"):
        messages, answer = asyncio.run(_serve_one(_post(BODY, path=path), 12, Settings()))
        assert answer.endswith(b"\r\n\r\n602112")
        assert len(messages) > 1 and b"".join(m["body"] for m in messages) == BODY


def test_expect_100_continue_still_gets_its_interim_answer() -> None:
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\nexpect: 100-continue\r\n\r\n" % len(BODY)

    async def main() -> tuple[list[dict[str, Any]], bytes]:
        return await _serve_one(head + BODY, 6, Settings())

    messages, answer = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert [m["body"] for m in messages] == [BODY]


def test_a_body_over_the_whole_body_size_keeps_uvicorns_path() -> None:
    """Larger than ``whole_body_bytes``: streamed in several messages (uvicorn pauses reading past 64 KB),
    the bytes unchanged."""
    settings = Settings(max_body_mb=0.25)  # whole_body_bytes = min(8 MB, --max-body-mb)
    assert Limits.from_settings(settings).whole_body_bytes == 262144
    messages, answer = asyncio.run(_serve_one(_post(BODY), 12, settings))
    assert answer.endswith(b"\r\n\r\n602112")
    assert len(messages) > 1 and b"".join(m["body"] for m in messages) == BODY


def test_a_chunked_body_keeps_uvicorns_path() -> None:
    pieces = [BODY[i:i + 100000] for i in range(0, len(BODY), 100000)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    request = b"POST /classify HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n" + chunked
    messages, answer = asyncio.run(_serve_one(request, 12, Settings()))
    assert answer.endswith(b"\r\n\r\n602112")
    assert len(messages) > 1 and b"".join(m["body"] for m in messages) == BODY


def _head_of(size: int, body: bytes = b"") -> bytes:
    """A request whose head (request line through the blank line) is ``size`` bytes, padded by one header."""
    start = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\nx-pad: " % len(body)
    pad = size - len(start) - 4
    return start + b"a" * pad + b"\r\n\r\n" + body


@pytest.mark.parametrize(("settings", "header"), [(Settings(max_header_kb=2), 5000), (Settings(), 70000)],
                         ids=["5000-bytes-over-2kb", "70000-bytes-over-the-default-64kb"])
@pytest.mark.parametrize("piece", [None, 1000], ids=["one-write", "1000-byte-writes"])
def test_a_head_over_the_limit_is_431_whatever_the_read_size(settings: Settings, header: int,
                                                            piece: int | None) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: %s\r\n\r\n" % (b"a" * header)
    reads: list[int] = []
    messages, answer = asyncio.run(_serve_one(request, -(-len(request) // piece) if piece else 1, settings, reads))
    if piece is None:
        assert reads == [len(request)], f"the head was not read in one piece: {reads}"
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_header_fields_too_large"
    assert messages == []  # the application never saw the request


@pytest.mark.parametrize("pieces", [1, 5])
def test_a_head_of_exactly_the_limit_passes_and_one_byte_more_is_431(pieces: int) -> None:
    settings = Settings(max_header_kb=2)
    messages, answer = asyncio.run(_serve_one(_head_of(2048, b"xyz"), pieces, settings))
    assert answer.startswith(b"HTTP/1.1 200") and [m["body"] for m in messages] == [b"xyz"], answer[:200]
    messages, answer = asyncio.run(_serve_one(_head_of(2049, b"xyz"), pieces, settings))
    assert answer.startswith(b"HTTP/1.1 431") and messages == [], answer[:200]


def test_the_body_in_the_heads_read_does_not_count_towards_the_head() -> None:
    reads: list[int] = []
    messages, answer = asyncio.run(_serve_one(_head_of(2000, BODY), 1, Settings(max_header_kb=2), reads))
    assert answer.endswith(b"\r\n\r\n602112") and reads[0] > 2048
    assert b"".join(m["body"] for m in messages) == BODY


async def _later_slow_head(idle_s: float, settings: Settings) -> tuple[bytes, float]:
    """One request answered on a keep-alive connection, ``idle_s`` of silence, then half of a second request's
    head: (everything received, seconds from that half head to the connection's close)."""
    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

    proto, transport, theirs = await protocol_over_socketpair(app, settings)
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(theirs, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    got = await asyncio.wait_for(loop.sock_recv(theirs, 65536), 5)
    await asyncio.sleep(idle_s)
    await loop.sock_sendall(theirs, b"GET /b HTTP/1.1\r\nHo")
    sent = loop.time()
    while piece := await asyncio.wait_for(loop.sock_recv(theirs, 65536), 10):
        got += piece
    took = loop.time() - sent
    transport.close()
    theirs.close()
    return got, took


def test_a_later_requests_slow_head_gets_408_counted_from_its_first_byte() -> None:
    """The head deadline of each request on a keep-alive connection runs from that request's first byte (the
    connection's one pending check re-arms itself): an idle gap longer than the timeout between two requests is
    no 408 (uvicorn's keep-alive governs it), and the second head, stalled, gets its 408 after the timeout."""
    settings = Settings(header_timeout_s=0.4, body_timeout_s=5)
    got, took = asyncio.run(_later_slow_head(0.7, settings))
    assert got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1 408") == 1, got
    assert b"request head not received within 0.4s" in got
    assert 0.39 <= took < 3.0, took  # a timer never fires early; 3 s: margin for a loaded machine
