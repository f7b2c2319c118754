"""Request ids, W3C trace context and OpenTelemetry spans for every HTTP request (pure ASGI middleware).

- ``X-Request-Id``: taken from the request when it is a short printable token, else a new one; echoed on
  the response, put in ``request.state.request_id`` (the /v2 ``id`` when the client sent none) and in the
  access log line (logger ``irpe.access``, INFO; :mod:`.accesslog`).
- ``traceparent``: a valid incoming W3C header makes this request's span a child of the caller's; the
  response carries ``traceparent`` with the same trace id and this server's span id (a ``tracestate``
  valid by W3C's grammar and limits is passed through; another is dropped). Without one, a new trace starts.
- The access line escapes the path (control characters, quotes, non-ASCII) and caps it at 200 characters.
- With ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set and the ``[otel]``
  extra installed, each request is a SERVER span exported by OpenTelemetry's OTLP/HTTP exporter (batched;
  ``OTEL_SERVICE_NAME`` defaults to ``irpe-deploy``). Without the extra, a warning names the fix.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, NamedTuple

from ..pipeline.oip import random_id
from .accesslog import log_access

log = logging.getLogger("irpe.server")

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
_TRACESTATE_KEY = r"(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})"
_TRACESTATE_MEMBER = re.compile(_TRACESTATE_KEY + r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
MAX_TRACESTATE = 512  # W3C: at most 512 characters and 32 list members are propagated
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
MAX_LOGGED = 200  # characters of a client's string (a path) in a log line
Scope = dict[str, Any]


class TraceParent(NamedTuple):
    """A parsed W3C ``traceparent`` (lower-case hex)."""

    trace_id: str
    span_id: str
    flags: str = "01"

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The caller's trace context, or None when absent or invalid (then a new trace starts)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip())
    if not m:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    return TraceParent(trace_id, span_id, flags)


def valid_tracestate(value: str | None) -> str | None:
    """``tracestate`` as W3C Trace Context defines it (at most 512 characters and 32 members, each
    ``key=value`` in its grammar), or None: an invalid one is dropped, not passed on."""
    if not value or len(value) > MAX_TRACESTATE:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > 32 or not all(_TRACESTATE_MEMBER.fullmatch(m) for m in members):
        return None
    return ",".join(members)


def printable(text: str, limit: int = MAX_LOGGED) -> str:
    """A client's string as a log line may carry it: control characters, quotes, backslashes and non-ASCII
    escaped (no forged line), at most ``limit`` characters of it."""
    if len(text) <= limit and text.isascii() and text.isprintable() and "\\" not in text and '"' not in text:
        return text  # printable ASCII without a backslash or quote: nothing to escape
    out = text[:limit].encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return out if len(text) <= limit else f"{out}...({len(text)} chars)"


def request_id_from(value: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a short printable token, else a new random one."""
    value = (value or "").strip()
    return value if _REQUEST_ID.match(value) else random_id(128)


def otlp_tracer() -> Any:
    """An OpenTelemetry tracer exporting over OTLP/HTTP when an endpoint is configured, else None."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed; no spans are "
                    "exported (pip install '.[otel]' from the irpe-deploy checkout's root)")
        return None
    import irpe

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "irpe-deploy"),
                                "service.version": irpe.__version__})
    provider = TracerProvider(resource=resource)  # shuts down (flushing spans) at interpreter exit
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("exporting request spans over OTLP/HTTP")
    return provider.get_tracer("irpe.server")


def _start_span(tracer: Any, name: str, parent: TraceParent | None, attributes: dict[str, Any]) -> Any:
    from opentelemetry import trace

    context = None
    if parent is not None:
        remote = trace.SpanContext(int(parent.trace_id, 16), int(parent.span_id, 16), is_remote=True,
                                   trace_flags=trace.TraceFlags(int(parent.flags, 16)))
        context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    return tracer.start_span(name, context=context, kind=trace.SpanKind.SERVER, attributes=attributes)


class Trace(NamedTuple):
    """One request's trace: its request id, the trace context it answers with, the answer's headers that carry
    both (and a valid ``tracestate``), and its OTLP span (None without a tracer)."""

    request_id: str
    mine: TraceParent
    extra: list[tuple[bytes, bytes]]
    span: Any


def trace_headers(scope: Scope) -> tuple[str | None, str | None, str | None]:
    """The ``traceparent``, ``tracestate`` and ``X-Request-Id`` headers of a request (the last of each)."""
    headers = {k: v for k, v in scope.get("headers", ()) if k in (b"traceparent", b"tracestate", b"x-request-id")}
    return tuple(v.decode("latin-1") if (v := headers.get(k)) is not None else None  # type: ignore[return-value]
                 for k in (b"traceparent", b"tracestate", b"x-request-id"))


def start_trace(tracer: Any, scope: Scope, traceparent: str | None, tracestate: str | None,
                request_id: str | None) -> Trace:
    """A request's :class:`Trace` (its request id also in ``scope["state"]``), a span started when traced.

    Args:
        tracer: the OpenTelemetry tracer, or None.
        scope: the request's ASGI scope.
        traceparent: its ``traceparent`` header (None: absent).
        tracestate: its ``tracestate`` header.
        request_id: its ``X-Request-Id`` header.

    Returns:
        The trace.
    """
    parent = parse_traceparent(traceparent)
    request_id = request_id_from(request_id)
    scope.setdefault("state", {})["request_id"] = request_id
    span = None
    if tracer is not None:
        method = scope["method"] if scope["method"] in _METHODS else "HTTP"  # the route is added once known
        span = _start_span(tracer, method, parent, {"http.request.method": method, "url.path":
                           scope["path"][:MAX_LOGGED], "irpe.request_id": request_id})
        ctx = span.get_span_context()
        mine = TraceParent(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", f"{int(ctx.trace_flags):02x}")
    elif parent is None:
        mine = TraceParent(random_id(128), random_id(64))
    else:
        mine = TraceParent(parent.trace_id, random_id(64), parent.flags)
    extra = [(b"x-request-id", request_id.encode()), (b"traceparent", mine.header().encode())]
    if parent is not None and (state := valid_tracestate(tracestate)):
        extra.append((b"tracestate", state.encode("latin-1")))
    return Trace(request_id, mine, extra, span)


def finish_trace(scope: Scope, trace: Trace, status: int, start: float) -> None:
    """The access log line of a request answered with ``status`` (started at ``start``, ``time.perf_counter``),
    and its span ended with the route, status and outcome."""
    ms = (time.perf_counter() - start) * 1e3
    client = scope.get("client") or ("-", 0)
    log_access(client[0], printable(scope["method"], 16), printable(scope["path"]), status, ms, trace.request_id,
               trace.mine.trace_id)
    span = trace.span
    if span is not None:
        from opentelemetry.trace import Status, StatusCode

        route = getattr(scope.get("route"), "path", None)
        if route:
            span.update_name(f"{scope['method']} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class TraceMiddleware:
    """Outermost middleware: request id, trace context, access log line and (optionally) an OTLP span."""

    def __init__(self, app: Any, tracer: Any = None):
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        trace = start_trace(self.tracer, scope, *trace_headers(scope))
        extra = trace.extra
        status = [0]

        async def traced_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, traced_send)
        finally:
            finish_trace(scope, trace, status[0] or 500, start)
