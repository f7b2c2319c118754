"""``POST /classify`` answered before FastAPI: the same answers for a fraction of the CPU.

FastAPI's way to an endpoint (its server-error, telemetry and body-limit layers, exception middleware,
exit stack, router, route match, request-response wrapper, query validation through pydantic, endpoint
call, response object) cost about a sixth of the event loop's CPU per ``/classify`` request at the
near-free model of ``irpe bench serve --frontend``. :class:`~.app.IrpeApp` sends a ``POST /classify``
whose query string this module reads exactly as FastAPI would (``top_k`` a plain positive integer, each
parameter at most once) through our own middleware (:class:`~.tracing.TraceMiddleware`,
:class:`~.middleware.ObserveMiddleware`: API key, host allowlist, request id, trace context, metrics, JSON
500) straight to :class:`ClassifyEndpoint`. Anything else (``top_k=0`` or ``abc``, a repeated parameter,
another method or path) takes FastAPI's way unchanged, with its usual 422/404/405. Both ways run
:func:`.routes.classify_body`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request

from .errors import APIError, error_response
from .routes import classify_body
from .state import ServerState

Scope = dict[str, Any]
_TOP_K = re.compile(r"[1-9][0-9]{0,8}")
_KNOWN = ("top_k", "model", "version")
_JSON = [(b"content-type", b"application/json")]


def classify_params(query_string: bytes) -> tuple[int, str | None, str | None] | None:
    """(top_k, model, version) of a query string FastAPI would accept as is; ``None``: let FastAPI answer."""
    if not query_string:
        return 5, None, None
    params: dict[str, str] = {}
    for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if key in params:  # repeated: FastAPI's choice among the values is its business
            return None
        params[key] = value
    top_k = params.get("top_k", "5")
    if not _TOP_K.fullmatch(top_k):
        return None
    return int(top_k), params.get("model"), params.get("version")


def fast_params(scope: Scope) -> tuple[int, str | None, str | None] | None:
    """The parameters of a ``POST /classify`` the fast path answers; ``None`` for every other request."""
    if scope["type"] != "http" or scope["path"] != "/classify" or scope["method"] != "POST":
        return None
    return classify_params(scope.get("query_string", b""))


class ClassifyEndpoint:
    """Pure-ASGI app answering ``POST /classify`` (parameters from :func:`fast_params`, in the scope under
    ``irpe.classify``) with :func:`.routes.classify_body`; its errors as FastAPI's APIError handler gives them."""

    def __init__(self, state: ServerState, route: Any):
        self.state = state
        self.route = route  # the FastAPI route, so metrics and spans label the request as before

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        scope["route"] = self.route
        try:
            body = await classify_body(Request(scope, receive), self.state, *scope["irpe.classify"])
        except APIError as e:  # the response FastAPI's APIError handler gives
            await error_response(e.status, e.code, e.message, e.headers, "/classify")(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
