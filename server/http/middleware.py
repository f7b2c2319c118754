"""One pure-ASGI middleware: optional API key, request metrics, and JSON 500 for anything unexpected."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.requests import ClientDisconnect

from ..auth import bearer_matches
from ..pipeline.service import Service
from .control import is_admin_path
from .errors import error_body_for
from .tracing import printable

log = logging.getLogger("irpe.server")

HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
Scope = dict[str, Any]


async def send_json(send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    """Send a complete JSON response on a raw ASGI ``send``."""
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})


def authorized(scope: Scope, key: str) -> bool:
    """True when no key is set or the request carries it (``Authorization: Bearer <key>``)."""
    return not key or _authorized(scope, key)


def host_name(scope: Scope) -> str:
    """The ``Host`` header without its port, lower case ("" when absent)."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):
                return host[:host.find("]") + 1] if "]" in host else host
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return ""


def _authorized(scope: Scope, key: str) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bearer_matches(value.decode("latin-1"), key)
    return False


def _route_label(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path:
        return str(path)
    return "/static" if scope.get("path", "").startswith("/static/") else "unmatched"


class ObserveMiddleware:
    """Wraps the app: 401 without the key (health routes exempt), counts and times every request."""

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
        status = [500]
        key = self.service.settings.api_key
        allowed = self.allowed_hosts
        if allowed and host_name(scope) not in allowed:
            status[0] = 421
            await send_json(send, 421, error_body_for(
                scope["path"], "misdirected_request", f"Host {host_name(scope)!r} is not served here "
                "(--allowed-hosts; a loopback server without a key answers only localhost / 127.0.0.1 / [::1])"))
        elif key and scope["path"] not in HEALTH_PATHS and not _authorized(scope, key) and not self._admin(scope):
            status[0] = 401
            await send_json(send, 401, error_body_for(scope["path"], "unauthorized", "missing or wrong API key; "
                            "send 'Authorization: Bearer <key>'"), {"WWW-Authenticate": "Bearer"})
        else:
            await self._call(scope, receive, send, status)
        key = (_route_label(scope), scope["method"], status[0])
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

    async def _call(self, scope: Scope, receive: Any, send: Any, status: list[int]) -> None:
        started = False

        async def observe(message: dict[str, Any]) -> None:
            """Record the status as the response starts."""
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe)
        except ClientDisconnect:  # the client left mid-upload: nobody to answer, nothing to log loudly
            status[0] = 499
            log.info("client disconnected during %s %s", printable(scope["method"], 16), printable(scope["path"]))
        except Exception:
            log.exception("unhandled error on %s %s", printable(scope["method"], 16), printable(scope["path"]))
            status[0] = 500
            if not started:
                await send_json(send, 500, error_body_for(scope["path"], "internal_error", "unexpected server "
                                "error; it has been logged"))
