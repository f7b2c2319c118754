"""``POST /v2/models/{name}[/versions/{version}]/infer`` before FastAPI: the same answers for less CPU.

The Open Inference Protocol's infer is what Triton clients and ``perf_analyzer`` send, one small request at a
time; FastAPI's layers (server-error, telemetry and body-limit middleware, exit stack, router, route match,
request-response wrapper, response object) cost more than the parsing. :class:`~.app.IrpeApp` sends a
``POST`` whose path is exactly an infer route through our own middleware (:class:`~.tracing.TraceMiddleware`,
:class:`~.middleware.ObserveMiddleware`) to :class:`InferEndpoint`; both ways run
:func:`~.kserve.infer_answer`, so the answers, errors and headers are the same. Path parameters are matched
as Starlette matches ``{name}`` (one non-empty segment of the decoded path).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from ..errors import APIError
from ..pipeline.service import Service
from .errors import error_response
from .kserve import infer_answer, router

Scope = dict[str, Any]
_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")


def infer_params(scope: Scope) -> tuple[str, str | None] | None:
    """(model, version) of a ``POST`` to an infer route; ``None`` for every other request."""
    if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v2/models/"):
        return None
    m = _PATH.fullmatch(scope["path"])
    return (m.group(1), m.group(2)) if m else None


class InferEndpoint:
    """Pure-ASGI app answering an infer request (parameters from :func:`infer_params`, in the scope under
    ``irpe.infer``) with :func:`~.kserve.infer_answer`; its errors as FastAPI's APIError handler gives them."""

    def __init__(self, service: Service):
        self.service = service
        paths = {r.path: r for r in router.routes if "POST" in getattr(r, "methods", ())}
        self.routes = (paths["/v2/models/{name}/infer"], paths["/v2/models/{name}/versions/{version}/infer"])

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        name, version = scope["irpe.infer"]
        scope["route"] = self.routes[version is not None]  # metrics label and span name, as FastAPI's
        try:
            body, headers, media = await infer_answer(Request(scope, receive), self.service, name, version)
        except APIError as e:
            await error_response(e.status, e.code, e.message, e.headers, scope["path"])(scope, receive, send)
            return
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw += [(b"content-length", b"%d" % len(body)), (b"content-type", media.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": body})
