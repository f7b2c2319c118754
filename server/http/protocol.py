"""uvicorn's httptools protocol with the limits it lacks: header size, header and body time, connections.

httptools accumulates a header value across reads with no size limit (a 128 MB header costs ~20 s of the
event loop and +200 MB before any route or key check). This subclass counts the bytes of the request head
as they arrive and answers 431 past ``max_header_bytes``: the raw bytes of a head still incomplete after a
read, and, for a head that completes within a read (however large that read), its request line and headers
as parsed (``method SP url SP HTTP/x.y CRLF``, ``name: value CRLF`` each, the blank line), checked before
the application sees the request. A head not complete within ``header_timeout_s``
(slowloris, or a connection that never speaks) gets 408, a body not complete within ``body_timeout_s``
gets 408 (if no answer started) and the connection is closed either way; connections over
``max_connections`` get 503 and are closed at once. Each check is a counter per request or a deadline; a
connection has at most one timer pending, which re-arms itself to the current deadline.

A POST to an inference route (``.../infer``, ``/classify``: the routes that read their whole body once the key
is checked) whose declared Content-Length is at most ``whole_body_bytes`` (and within ``--max-body-mb``) is
collected whole before the application is woken: one ASGI message holding the received chunks joined once
(a body that came in one read is passed on as it is). uvicorn's own path pauses reading past 64 KB until the
application asks again, so a 600 KB tensor took several pause/resume round trips through the event loop and
was copied three times (into a bytearray, out as bytes, joined by the reader). Other routes, and bodies of
unknown or larger size, keep that path; a request answered before its body is in (401, 404) drops what was
collected, as uvicorn drops a body after the answer.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import Settings
from .transport import OneWriteTransport

log = logging.getLogger("irpe.server")
WHOLE_BODY_ROUTES = ("/infer", "/classify")  # POST routes that read their whole body (module docstring)


@dataclass(frozen=True)
class Limits:
    """Connection-level limits (from :class:`Settings`)."""

    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 256
    whole_body_bytes: int = 8 * 1024 * 1024  # collected before the app is woken (see the module docstring)

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(settings.max_header_kb * 1024, settings.header_timeout_s, settings.body_timeout_s,
                   settings.max_connections, min(8 * 1024 * 1024, settings.max_body_bytes))


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": reason.lower().replace(" ", "_"), "message": message}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol + :class:`Limits` (see the module docstring)."""

    def __init__(self, *args: Any, limits: Limits | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.limits = limits or Limits()
        self._head_bytes = 0  # raw bytes of the head so far (reads while it is incomplete)
        self._in_head = True
        self._refused = False  # answered 431 and closing: the parser's remaining callbacks are ignored
        self._deadline: tuple[float, str] | None = None  # (loop time, "head"/"body") of the wait under way
        self._timer: asyncio.TimerHandle | None = None  # the check at _timer_at (at most one per connection)
        self._timer_at = 0.0
        self._chunks: list[bytes] | None = None  # the body being collected whole, or None: uvicorn's path
        self._peer: dict[str, Any] | None = None  # this connection's addresses (and its client's uid, once known)

    def _arm(self, seconds: float, what: str) -> None:
        """Start the wait for the request's ``what`` (its deadline ``seconds`` from now). The event loop's timer
        is not moved on every request: one check per connection is pending, at or before the deadline, and it
        re-arms itself for a later deadline (a timer costs about as much as the rest of the limits together)."""
        at = self.loop.time() + seconds
        self._deadline = (at, what)
        if self._timer is None or at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(at, self._check)
            self._timer_at = at

    def _disarm(self) -> None:
        self._deadline = None

    def _check(self) -> None:
        """The pending check: the wait under way expires if its deadline is this check's, else the check moves to
        its deadline (none: no check until the next wait)."""
        self._timer = None
        if self._deadline is None:
            return
        at, what = self._deadline
        if at <= self._timer_at:
            self._expired(what)
        else:
            self._timer = self.loop.call_at(at, self._check)
            self._timer_at = at

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._refused = True
        if not self.transport.is_closing():
            self.transport.write(_raw_response(status, reason, message))
            self.transport.close()

    def _expired(self, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.info("closing a connection from %s: request %s not received in time", self.client, what)
        cycle = self.cycle
        if what == "head" or cycle is None or not cycle.response_started:
            limit = self.limits.header_timeout_s if what == "head" else self.limits.body_timeout_s
            option = "--header-timeout-s" if what == "head" else "--body-timeout-s"
            self._refuse(408, "Request Timeout", f"request {what} not received within {limit:g}s ({option})")
        else:
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = OneWriteTransport(transport, self.loop)  # type: ignore[assignment]
        if len(self.connections) > self.limits.max_connections:
            log.warning("refusing a connection: %d open (--max-connections)", len(self.connections) - 1)
            self._refuse(503, "Service Unavailable", f"too many open connections (limit "
                         f"{self.limits.max_connections}, --max-connections); retry later")
            return
        self._arm(self.limits.header_timeout_s, "head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse_head()

    def _refuse_head(self) -> None:
        """431 and close: the request head is over ``max_header_bytes``."""
        if self._refused:
            return
        log.info("refusing a request head over %d bytes from %s", self.limits.max_header_bytes, self.client)
        self._refuse(431, "Request Header Fields Too Large", f"request line and headers exceed "
                     f"{self.limits.max_header_bytes} bytes (--max-header-kb)")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # the connection's own addresses, for client shared memory (http/shm_access.py, which keeps the peer's uid
        # here for the connection's life): uvicorn's proxy-headers middleware may rewrite "client" from a header
        if self._refused:
            return
        if self._peer is None:
            self._peer = {"socket": (self.client, self.server)}
        self.scope["irpe.peer"] = self._peer  # type: ignore[typeddict-unknown-key]
        if self._deadline is None:
            self._arm(self.limits.header_timeout_s, "head")

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        # the head as parsed: "METHOD URL HTTP/x.y" CRLF (2 spaces, 8, 2), "name: value" CRLF each, the blank line
        size = len(self.parser.get_method()) + len(self.url) + 14 + sum(len(n) + len(v) for n, v in self.headers)
        if size + 4 * len(self.headers) > self.limits.max_header_bytes:
            self._refuse_head()
            return
        self._in_head = False
        self._head_bytes = 0
        self._arm(self.limits.body_timeout_s, "body")
        super().on_headers_complete()
        self._chunks = [] if self._collect_whole() else None

    def _collect_whole(self) -> bool:
        """Whether this request's body is collected whole (see the module docstring)."""
        scope = self.scope
        if self.cycle is None or scope.get("method") != "POST" or not scope["path"].endswith(WHOLE_BODY_ROUTES):
            return False
        declared = [v for k, v in self.headers if k == b"content-length"]
        return len(declared) == 1 and declared[0].isdigit() and 0 < int(declared[0]) <= self.limits.whole_body_bytes

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        if self._chunks is None or self.cycle is None or self.cycle.response_complete:
            super().on_body(body)
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        self._in_head = True
        chunks, self._chunks = self._chunks, None
        if chunks and self.cycle is not None and not self.cycle.response_complete:
            # bytes: uvicorn's receive() passes bytes(body) on, which for bytes is the object itself
            self.cycle.body = chunks[0] if len(chunks) == 1 else b"".join(chunks)  # type: ignore[assignment]
        super().on_message_complete()


def protocol_factory(settings: Settings) -> Any:
    """What uvicorn's ``http=`` option takes: the bounded protocol bound to ``settings``' limits (picklable)."""
    return functools.partial(BoundedHttpToolsProtocol, limits=Limits.from_settings(settings))


def uvicorn_config_kwargs(settings: Settings) -> dict[str, object]:
    """Options shared by the single-process and multi-worker paths."""
    return {"host": settings.host, "port": settings.port, "log_level": settings.log_level,
            "access_log": settings.log_level == "debug",
            "timeout_graceful_shutdown": int(settings.timeout_s) + 5, "http": protocol_factory(settings)}
