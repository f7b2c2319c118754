"""A response's head and body in one socket write.

uvicorn writes the status line and headers (``http.response.start``) and then the body, each with its own
``transport.write``: two ``send`` system calls and two TCP segments per answer, and the client wakes twice.
:class:`OneWriteTransport` holds a complete response head (``HTTP/1.1 ...\\r\\n\\r\\n``) until the next write
on the connection, which it joins (a small body) or precedes, or until the event loop's next turn
(``call_soon``), so a head is never held longer than the current callback: a streamed response's head still
leaves before its first chunk is produced. The order of bytes on the connection is unchanged.

:func:`write_answer` writes a whole answer (status, headers and body known at once) where the ASGI ``send`` is
uvicorn's own: the bytes and the connection's state that its two ``send`` calls would give, with the checks
those calls make, in one function and one write (two ``send`` coroutines, their messages, the held head and
its flush callback cost about 15 us per answer). Where anything differs from the plain case (another
``send``, an answer already started, writing paused, a closing or ``HEAD`` request, uvicorn's access log,
a header that is not plain), it writes nothing and the caller sends the two messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

JOIN_LIMIT = 64 * 1024  # bodies up to this size are copied behind the head; larger ones follow it


class OneWriteTransport:
    """Wraps a transport; every other attribute is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._head = b""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._head:
            head, self._head = self._head, b""
            if len(data) <= JOIN_LIMIT:
                self._transport.write(head + bytes(data))
                return
            self._transport.write(head)
        elif data[:9] == b"HTTP/1.1 " and data[-4:] == b"\r\n\r\n":
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now."""
        if self._head:
            head, self._head = self._head, b""
            if not self._transport.is_closing():
                self._transport.write(head)

    def write_now(self, data: bytes) -> None:
        """Write ``data`` at once, after a held head (never held itself)."""
        self.flush()
        self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()


def write_answer(send: Any, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bool:
    """Write a complete answer in one go where ``send`` is uvicorn's (module docstring); False: nothing written.

    Args:
        send: the request's ASGI ``send``.
        status: the status code.
        headers: lower-case raw headers, one ``content-length`` of ``len(body)``, no ``connection`` or
            ``transfer-encoding``.
        body: the whole body.

    Returns:
        True when the answer is written and the request's cycle complete; False when the caller is to send
        ``http.response.start`` and ``http.response.body`` itself.
    """
    cycle = getattr(send, "__self__", None)
    if (type(cycle) is not RequestResponseCycle or cycle.response_started or cycle.disconnected
            or cycle.flow.write_paused or not cycle.keep_alive or cycle.access_log
            or type(cycle.transport) is not OneWriteTransport or cycle.scope["method"] == "HEAD"):
        return False
    raw = [*cycle.default_headers, *headers]
    names = [name for name, _ in raw]
    listed = b"\n%b\n" % b"\n\n".join(names)  # each name between its own "\n"s (in no valid name: HEADER_RE)
    if (HEADER_RE.search(b"".join(names)) or HEADER_VALUE_RE.search(b"\t".join([value for _, value in raw]))
            or listed != listed.lower() or b"\nconnection\n" in listed or b"\ntransfer-encoding\n" in listed
            or listed.count(b"\ncontent-length\n") != 1 or (b"content-length", b"%d" % len(body)) not in raw):
        return False  # uvicorn's send raises for a bad name or value; the rest is not the plain case
    out = [STATUS_LINE[status]]
    for name, value in raw:
        out += (name, b": ", value, b"\r\n")
    out += (b"\r\n", body)
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.chunked_encoding = False
    cycle.transport.write_now(b"".join(out))
    cycle.response_complete = True
    cycle.message_event.set()
    cycle.on_response()
    return True
