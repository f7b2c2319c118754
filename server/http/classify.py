"""``POST /classify``: the route, and the same answers before FastAPI for a fraction of the CPU.

FastAPI's way to an endpoint (its server-error, telemetry and body-limit layers, exception middleware,
exit stack, router, route match, request-response wrapper, query validation through pydantic, endpoint
call, response object) cost about a sixth of the event loop's CPU per ``/classify`` request at the
near-free model of ``irpe bench serve --frontend``. :class:`~.app.IrpeApp` sends a ``POST /classify``
whose query string this module reads exactly as FastAPI would (``top_k`` a plain positive integer, each
parameter at most once) through our own middleware (:class:`~.tracing.TraceMiddleware`,
:class:`~.middleware.ObserveMiddleware`: API key, host allowlist, request id, trace context, metrics, JSON
500) straight to :class:`ClassifyEndpoint`. Anything else (``top_k=0`` or ``abc``, a repeated parameter,
another method or path) takes FastAPI's way unchanged, with its usual 422/404/405. Both ways run
:func:`classify_body`.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from ..batch_queue import Result
from ..errors import APIError
from ..hosting.host import ModelVersion
from ..pipeline.service import Service
from ..pipeline.topk import top_k
from .body import read_images
from .errors import error_response, error_responses

log = logging.getLogger("irpe.server")
router = APIRouter()

_CLASSIFY_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "array", "items": {"type": "string", "format": "binary"}}}}},
    "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
    "image/png": {"schema": {"type": "string", "format": "binary"}}}}}


class Prediction(BaseModel):
    index: int
    label: str
    probability: float


class ClassifyResponse(BaseModel):
    model: str
    version: str
    predictions: list[list[Prediction]]
    timing_ms: dict[str, float]
    batch_size: int


def _timing(decode_s: float, results: list[Result], started: float) -> dict[str, float]:
    return {"decode": round(decode_s * 1e3, 3),
            "queue": round(max(r.queue_s for r in results) * 1e3, 3),
            "inference": round(max(r.inference_s for r in results) * 1e3, 3),
            "total": round((time.perf_counter() - started) * 1e3, 3)}


@router.post("/classify", response_model=None, openapi_extra=_CLASSIFY_BODY,
             responses={200: {"model": ClassifyResponse},
                        **error_responses(400, 401, 404, 413, 415, 422, 500, 503, 504)}, tags=["classify"])
async def classify(request: Request, top_k_: int = Query(5, alias="top_k", ge=1, description="classes per image"),
                   model: str | None = Query(None, description="model name (default: the default model)"),
                   version: str | None = Query(None, description="model version (default: the newest loaded)"),
                   ) -> Response:
    """Classify one or several images (multipart field ``file``, repeatable, or a raw image body)."""
    body = await classify_body(request, request.app.state.irpe, top_k_, model, version)
    return Response(body, media_type="application/json")


async def classify_body(request: Request, service: Service, k: int, model: str | None,
                        version: str | None) -> bytes:
    """The JSON answer of ``POST /classify?top_k=k&model=&version=`` (APIError for every 4xx/5xx answer);
    shared by the route and the ASGI fast path in front of FastAPI (:class:`ClassifyEndpoint`)."""
    started = time.perf_counter()
    with service.use(model, version) as model_version:
        return await _classify(request, service, model_version, k, started)


async def _classify(request: Request, service: Service, model_version: ModelVersion, k: int, started: float) -> bytes:
    artifact = model_version.artifact
    assert artifact is not None
    if k > artifact.num_classes:
        raise APIError(422, "validation_error", f"query.top_k: must be between 1 and {artifact.num_classes}")
    settings = service.settings
    blobs = await read_images(request, settings.max_body_bytes, settings.max_images)
    service.admit(len(blobs))

    async def work() -> tuple[list[np.ndarray], float, list[Result]]:
        """Decode, then queue for inference."""
        arrays, decode_s = await service.preprocess(blobs, artifact, deadline=started + settings.timeout_s)
        return arrays, decode_s, await service.infer(arrays, model_version)

    try:
        _, decode_s, results = await service.with_deadline(work(), started)
    finally:
        service.release(len(blobs))
    if not all(np.isfinite(r.logits).all() for r in results):
        log.error("model %s produced non-finite logits on /classify", model_version.name)
        raise APIError(500, "non_finite_output", "the model produced NaN/Inf logits for this image")
    preds = [top_k(r.logits, k, artifact.labels) for r in results]
    version = str(model_version.version)
    return orjson.dumps({"model": model_version.name, "version": version, "predictions": preds,  # ~10x json's speed
                         "timing_ms": _timing(decode_s, results, started),
                         "batch_size": max(r.batch_size for r in results)})


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
    ``irpe.classify``) with :func:`classify_body`; its errors as FastAPI's APIError handler gives them."""

    def __init__(self, service: Service):
        self.service = service
        self.route = next(r for r in router.routes if getattr(r, "path", "") == "/classify")  # metrics, spans

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        scope["route"] = self.route
        try:
            body = await classify_body(Request(scope, receive), self.service, *scope["irpe.classify"])
        except APIError as e:  # the response FastAPI's APIError handler gives
            await error_response(e.status, e.code, e.message, e.headers, "/classify")(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
