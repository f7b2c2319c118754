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
