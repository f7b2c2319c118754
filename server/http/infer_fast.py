"""``POST /v2/models/{name}[/versions/{version}]/infer`` before FastAPI: the same answers for less CPU.

The Open Inference Protocol's infer is what Triton clients and ``perf_analyzer`` send, one small request at a
time; FastAPI's layers (server-error, telemetry and body-limit middleware, exit stack, router, route match,
request-response wrapper, response object) cost more than the parsing, and so did our own middleware stacked
as ASGI apps (a ``send`` wrapper per layer, a header scan per header read, Starlette's request object).
:class:`~.app.IrpeApp` sends a ``POST`` whose path is exactly an infer route to :class:`InferEndpoint`, which
does in one coroutine what :class:`~.tracing.TraceMiddleware` and :class:`~.middleware.ObserveMiddleware` do
around FastAPI's route, with their own functions (request id and trace context, Host allowlist and API key,
metrics, access log line, span, 499/500), reading the headers it needs in one pass; both ways run
:func:`~.kserve.answer`, so the answers, errors and headers are the same. Path parameters are matched as
Starlette matches ``{name}`` (one non-empty segment of the decoded path).
"""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.requests import Request

from ..errors import APIError
from ..pipeline.service import Service
from .errors import error_response
from .kserve import Answer, InferHeaders, answer, router
from .middleware import ObserveMiddleware, failed, send_json
from .tracing import finish_trace, start_trace

Scope = dict[str, Any]
_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
# the headers read, by name: the first of each as Starlette's Headers.get gives it, the last of the trace
# headers as TraceMiddleware reads them
_HEADERS = {b"host": 0, b"authorization": 1, b"content-length": 2, b"content-encoding": 3,
            b"inference-header-content-length": 4, b"accept-encoding": 5, b"traceparent": 6, b"tracestate": 7,
            b"x-request-id": 8}
_FIRST_WINS = 6  # indices below: the first header of the name counts
_MEDIA = (b"application/json", b"application/octet-stream")


def infer_params(scope: Scope) -> tuple[str, str | None] | None:
    """(model, version) of a ``POST`` to an infer route; ``None`` for every other request."""
    if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v2/models/"):
        return None
    m = _PATH.fullmatch(scope["path"])
    return (m.group(1), m.group(2)) if m else None


def read_headers(headers: Any) -> list[bytes | None]:
    """The values of the :data:`_HEADERS` of a request's raw ASGI headers, None where absent."""
    found: list[bytes | None] = [None] * len(_HEADERS)
    for name, value in headers:
        if (i := _HEADERS.get(name)) is not None and (i >= _FIRST_WINS or found[i] is None):
            found[i] = value
    return found


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class InferEndpoint:
    """Pure-ASGI app answering an infer request (parameters from :func:`infer_params`, in the scope under
    ``irpe.infer``): trace, refusals, :func:`~.kserve.answer`, metrics and access log (module docstring); its
    errors as FastAPI's APIError handler gives them."""

    def __init__(self, service: Service, observe: ObserveMiddleware, tracer: Any = None):
        self.service = service
        self.observe = observe  # its refusals and metrics series (the one around FastAPI's routes)
        self.tracer = tracer
        paths = {r.path: r for r in router.routes if "POST" in getattr(r, "methods", ())}
        self.routes = (paths["/v2/models/{name}/infer"], paths["/v2/models/{name}/versions/{version}/infer"])

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        start = time.perf_counter()
        h = read_headers(scope["headers"])
        trace = start_trace(self.tracer, scope, _text(h[6]), _text(h[7]), _text(h[8]))
        sent = 0  # the status of the answer started (0: none yet)
        try:
            refused = self.observe.refusal(scope, h[0], h[1])
            if refused is not None:  # before the route is known, as around FastAPI: counted as "unmatched"
                sent = refused.status
                await send_json(send, *refused, extra=trace.extra)
                status = sent
            else:
                name, version = scope["irpe.infer"]
                scope["route"] = self.routes[version is not None]  # metrics label and span name, as FastAPI's
                try:
                    try:
                        answered = await answer(self.service, name, version, receive, InferHeaders(
                            _text(h[2]) or "", _text(h[3]) or "", _text(h[4]), _text(h[5])), trace.request_id,
                            lambda: Request(scope, receive))
                    except APIError as e:
                        response = error_response(e.status, e.code, e.message, e.headers, scope["path"])
                        response.raw_headers += trace.extra
                        sent = e.status
                        await response(scope, receive, send)
                    else:
                        sent = 200
                        await _send(send, answered, trace.extra)
                    status = sent
                except Exception as e:  # noqa: BLE001 (failed() logs it)
                    status = await failed(scope, _Extra(send, trace.extra), e, sent)
                    if not sent and status == 500:
                        sent = 500  # failed() answered
            self.observe.record(scope, status, start)
        finally:
            finish_trace(scope, trace, sent or 500, start)


async def _send(send: Any, answered: Answer, extra: list[tuple[bytes, bytes]]) -> None:
    """A 200 with the headers the route's ``Response`` gives it, and the trace's."""
    body = answered.body
    raw = []
    if answered.json_len is not None:
        raw.append((b"inference-header-content-length", b"%d" % answered.json_len))
    if answered.encoding:
        raw.append((b"content-encoding", answered.encoding.encode("latin-1")))
    raw += ((b"content-length", b"%d" % len(body)), (b"content-type", _MEDIA[answered.json_len is not None]),
            *extra)
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class _Extra:
    """A ``send`` adding the trace's headers to the answer's (for :func:`~.middleware.failed`'s 500)."""

    def __init__(self, send: Any, extra: list[tuple[bytes, bytes]]):
        self.send = send
        self.extra = extra

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *self.extra]}
        await self.send(message)
