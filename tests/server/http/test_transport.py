"""server/http/transport.py over a real socket pair and event loop: a response head goes out with its body in
one write, a lone head still leaves on the loop's next turn, and the bytes keep their order."""

from __future__ import annotations

import asyncio
import socket

from irpe.server.http.transport import JOIN_LIMIT, OneWriteTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class Counting(asyncio.Protocol):
    pass


async def _pair() -> tuple[asyncio.Transport, socket.socket, list[bytes]]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(Counting, ours)
    writes: list[bytes] = []
    real_write = transport.write

    def write(data: bytes) -> None:  # the real write, counted
        writes.append(bytes(data))
        real_write(data)

    transport.write = write  # type: ignore[method-assign]
    theirs.setblocking(False)
    return transport, theirs, writes


async def _read(sock: socket.socket, n: int) -> bytes:
    loop, out = asyncio.get_running_loop(), b""
    while len(out) < n:
        out += await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 5)
    return out


def test_head_and_small_body_are_one_write() -> None:
    async def main() -> tuple[list[bytes], bytes]:
        transport, peer, writes = await _pair()
        t = OneWriteTransport(transport, asyncio.get_running_loop())
        t.write(HEAD)
        t.write(b"hello")
        got = await _read(peer, len(HEAD) + 5)
        t.close()
        return writes, got

    writes, got = asyncio.run(main())
    assert writes == [HEAD + b"hello"] and got == HEAD + b"hello"


def test_a_lone_head_leaves_on_the_next_turn_and_order_is_kept() -> None:
    async def main() -> tuple[list[bytes], bytes, bytes]:
        transport, peer, writes = await _pair()
        t = OneWriteTransport(transport, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        first = await _read(peer, 25)  # nothing else written: the loop's next turn sends it
        big = b"x" * (JOIN_LIMIT + 1)
        t.write(HEAD)
        t.write(big)  # too large to copy: the head, then the body, in order
        rest = await _read(peer, len(HEAD) + len(big))
        t.write(HEAD)
        t.close()  # closing sends a held head first
        tail = await _read(peer, len(HEAD))
        return writes, first + rest, tail

    writes, got, tail = asyncio.run(main())
    assert got == b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + b"x" * (JOIN_LIMIT + 1)
    assert writes[:3] == [b"HTTP/1.1 100 Continue\r\n\r\n", HEAD, b"x" * (JOIN_LIMIT + 1)] and tail == HEAD


def test_other_writes_pass_through_at_once() -> None:
    async def main() -> list[bytes]:
        transport, peer, writes = await _pair()
        t = OneWriteTransport(transport, asyncio.get_running_loop())
        t.write(b"chunk")
        assert writes == [b"chunk"]  # not held: not a response head
        await _read(peer, 5)
        t.close()
        return writes

    assert asyncio.run(main()) == [b"chunk"]


def test_the_server_protocol_writes_through_it_and_answers_in_one_write() -> None:
    """irpe serve's HTTP protocol (protocol_factory) puts OneWriteTransport on each connection: a real ASGI
    answer over a real socket arrives whole, and the connection's writes are one per answer."""
    from tests.server.helpers import protocol_over_socketpair

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
            await send({"type": "http.response.body", "body": b"hello"})

    async def main() -> tuple[bool, list[bytes], bytes]:
        proto, transport, theirs = await protocol_over_socketpair(app)
        loop = asyncio.get_running_loop()
        wrapped = isinstance(proto.transport, OneWriteTransport)
        writes: list[bytes] = []
        real_write = transport.write
        transport.write = lambda data: (writes.append(bytes(data)), real_write(data))[1]  # type: ignore[method-assign]
        await loop.sock_sendall(theirs, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"hello"):
            got += await asyncio.wait_for(loop.sock_recv(theirs, 65536), 5)
        transport.close()
        theirs.close()
        return wrapped, writes, got

    wrapped, writes, got = asyncio.run(main())
    assert wrapped and got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"\r\n\r\nhello")
    assert len(writes) == 1 and writes[0] == got  # head and body in one write
