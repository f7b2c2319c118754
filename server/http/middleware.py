"""One pure-ASGI middleware: optional API key, request metrics, and JSON 500 for anything unexpected."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from starlette.requests import ClientDisconnect

from ..auth import bearer_matches
from ..pipeline.service import Service
from .control import is_admin_path
from .errors import error_body_for
from .tracing import printable

log = logging.getLogger("irpe.server")

HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
Scope = dict[str, Any]


async def send_json(send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None,
                    extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Send a complete JSON response on a raw ASGI ``send`` (``extra``: raw headers added last)."""
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    hdrs += extra
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})


def authorized(scope: Scope, key: str) -> bool:
    """True when no key is set or the request carries it (``Authorization: Bearer <key>``)."""
    return not key or _authorized(scope, key)


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first ``name`` header of a request (lower-case name), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def host_of(value: bytes | None) -> str:
    """A ``Host`` header's name without its port, lower case ("" for None)."""
    if value is None:
        return ""
    host = value.decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[:host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _authorized(scope: Scope, key: str) -> bool:
    value = header(scope, b"authorization")
    return value is not None and bearer_matches(value.decode("latin-1"), key)


def _route_label(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path:
        return str(path)
    return "/static" if scope.get("path", "").startswith("/static/") else "unmatched"


class Refusal(NamedTuple):
    """An answer given before the app sees the request: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] | None


class ObserveMiddleware:
    """Wraps the app: 421 for a Host not served, 401 without the key (health routes exempt), counts and times
    every request."""

    def __init__(self, app: Any, service: Service):
        self.app = app
        self.service = service
        self.allowed_hosts = service.settings.host_allowlist()  # the Host names served (empty: any)
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        refused = self.refusal(scope, header(scope, b"host") if self.allowed_hosts else None,
                               header(scope, b"authorization") if self.service.settings.api_key else None)
        if refused is not None:
            status = refused.status
            await send_json(send, *refused)
        else:
            status = await self._call(scope, receive, send)
        self.record(scope, status, start)

    def refusal(self, scope: Scope, host: bytes | None, authorization: bytes | None) -> Refusal | None:
        """421 for a Host not served, 401 without the key, else None.

        Args:
            scope: the request's ASGI scope.
            host: its first ``Host`` header (only read when the server has a Host allowlist).
            authorization: its first ``Authorization`` header.

        Returns:
            The refusal, or None to serve the request.
        """
        allowed = self.allowed_hosts
        if allowed and (name := host_of(host)) not in allowed:
            return Refusal(421, error_body_for(
                scope["path"], "misdirected_request", f"Host {name!r} is not served here "
                "(--allowed-hosts; a loopback server without a key answers only localhost / 127.0.0.1 / [::1])"),
                None)
        key = self.service.settings.api_key
        if key and scope["path"] not in HEALTH_PATHS and not (
                authorization is not None and bearer_matches(authorization.decode("latin-1"), key)) \
                and not self._admin(scope):
            return Refusal(401, error_body_for(scope["path"], "unauthorized", "missing or wrong API key; "
                           "send 'Authorization: Bearer <key>'"), {"WWW-Authenticate": "Bearer"})
        return None

    def record(self, scope: Scope, status: int, start: float) -> None:
        """Count the request under (route, method, status) and time it from ``start`` (``time.perf_counter``)."""
        key = (_route_label(scope), scope["method"], status)
        if (series := self._series.get(key)) is None:
            series = self._series[key] = self._children(key)
        series[0].inc()
        series[1].observe(time.perf_counter() - start)

    def _admin(self, scope: Scope) -> bool:
        """A model control or server-settings request with the admin key (it needs no inference key; see
        :mod:`.control`)."""
        admin = self.service.settings.admin_key
        return bool(admin) and is_admin_path(scope["path"]) and _authorized(scope, admin)

    def _children(self, key: tuple[str, str, int]) -> tuple[Any, Any]:
        """The counter and histogram series of (route, method, status), looked up once (``labels()``
        takes a lock and validates the names on every call); bounded by the routes and statuses that exist."""
        if len(self._series) > 4096:  # the route label is the route's template, the method free-form
            self._series.clear()
        m = self.service.metrics
        return m.requests.labels(key[0], key[1], str(key[2])), m.latency.labels(key[0])

    async def _call(self, scope: Scope, receive: Any, send: Any) -> int:
        """Run the app; the status it answered (499 when the client left first, 500 on an error)."""
        sent = 0

        async def observe(message: dict[str, Any]) -> None:
            """Record the status as the response starts."""
            nonlocal sent
            if message["type"] == "http.response.start":
                sent = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe)
        except Exception as e:  # noqa: BLE001 (failed() logs it)
            return await failed(scope, send, e, sent)
        return sent or 500


async def failed(scope: Scope, send: Any, error: Exception, sent: int) -> int:
    """The status a request that raised ``error`` counts as: 499 (logged as info) when the client left
    mid-upload, else 500, logged with its traceback and answered with a JSON 500 unless an answer started
    (``sent``: its status, 0 for none).

    Args:
        scope: the request's ASGI scope.
        send: the ASGI ``send`` to answer on.
        error: what the app raised.
        sent: the status of the answer already started (0: none).

    Returns:
        The status to count (an answer already started keeps its own).
    """
    if isinstance(error, ClientDisconnect):  # the client left: nobody to answer, nothing to log loudly
        log.info("client disconnected during %s %s", printable(scope["method"], 16), printable(scope["path"]))
        return 499
    log.error("unhandled error on %s %s", printable(scope["method"], 16), printable(scope["path"]), exc_info=error)
    if sent:
        return 500
    await send_json(send, 500, error_body_for(scope["path"], "internal_error", "unexpected server error; it has "
                    "been logged"))
    return 500
