"""A response's head and body in one socket write.

uvicorn writes the status line and headers (``http.response.start``) and then the body, each with its own
``transport.write``: two ``send`` system calls and two TCP segments per answer, and the client wakes twice.
:class:`OneWriteTransport` holds a complete response head (``HTTP/1.1 ...\\r\\n\\r\\n``) until the next write
on the connection, which it joins (a small body) or precedes, or until the event loop's next turn
(``call_soon``), so a head is never held longer than the current callback: a streamed response's head still
leaves before its first chunk is produced. The order of bytes on the connection is unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

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

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()
