"""``POST /classify`` answered in front of FastAPI's router: the same answers for a fraction of the CPU.

FastAPI's path to an endpoint (exception middleware, exit stack, router, route match, request-response
wrapper, query validation through pydantic, endpoint call, response object) costs about a sixth of the
event loop's CPU per ``/classify`` request at the near-free model of ``irpe bench serve --frontend``.
This pure-ASGI middleware sits inside :class:`~.middleware.ObserveMiddleware` and
:class:`~.tracing.TraceMiddleware` (so API key, host allowlist, request id, trace context, metrics and the
JSON 500 still apply) and answers ``POST /classify`` itself when the query string is one it can read
exactly as FastAPI would: ``top_k`` a plain positive integer, ``model`` and ``version`` at most once each.
Anything else (``top_k=0`` or ``abc``, a repeated parameter, another method or path) goes to FastAPI
unchanged, which gives the usual 422/404/405. Both paths run :func:`.routes.classify_body`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request

from .errors import APIError, error_body_for
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


class ClassifyFastPath:
    """Pure-ASGI middleware: ``POST /classify`` straight to :func:`.routes.classify_body`."""

    def __init__(self, app: Any, state: ServerState, route: Any):
        self.app = app
        self.state = state
        self.route = route  # the FastAPI route, so metrics and spans label the request as before

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/classify" or scope["method"] != "POST" or \
                (params := classify_params(scope.get("query_string", b""))) is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        try:
            body = await classify_body(Request(scope, receive), self.state, *params)
        except APIError as e:
            await self._error(send, e)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _error(send: Any, e: APIError) -> None:
        """The error answer FastAPI's APIError handler gives (same body, status and headers)."""
        import orjson

        body = orjson.dumps(error_body_for("/classify", e.code, e.message))
        headers = [(b"content-length", b"%d" % len(body)), *_JSON]
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in e.headers.items()]
        await send({"type": "http.response.start", "status": e.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
