"""``POST /classify``, ``/v1/models``, health, readiness, metrics and the demo page."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel

from .batching import Result
from .body import read_images
from .errors import APIError, error_responses
from .middleware import authorized
from .repository import ModelVersion
from .state import ServerState, get_state

STATIC = Path(__file__).with_name("static")
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


class HealthStatus(BaseModel):
    status: str
    detail: str | None = None


_HEALTH_503 = {503: {"model": HealthStatus, "description": "not ready / warm-up failed"}}


class ClassifyResponse(BaseModel):
    model: str
    version: str
    predictions: list[list[Prediction]]
    timing_ms: dict[str, float]
    batch_size: int


def top_k(logits: np.ndarray, k: int, labels: list[str]) -> list[dict[str, Any]]:
    """Softmax (float64) and the k most probable classes, best first."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    if k < len(p) > 256:  # the k largest in O(n), then ordered as a stable argsort of -p would order them
        # (for a few hundred classes or fewer the plain argsort below is cheaper than partition + lexsort)
        kth = np.partition(p, len(p) - k)[len(p) - k]
        cand = np.flatnonzero(p >= kth)
        order = cand[np.lexsort((cand, -p[cand]))][:k]
    else:
        order = np.argsort(-p, kind="stable")[:k]
    probs = p.tolist()  # Python floats at once, not one NumPy scalar per class
    return [{"index": i, "label": labels[i], "probability": probs[i]} for i in order.tolist()]


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
    body = await classify_body(request, get_state(request), top_k_, model, version)
    return Response(body, media_type="application/json")


async def classify_body(request: Request, state: ServerState, k: int, model: str | None,
                        version: str | None) -> bytes:
    """The JSON answer of ``POST /classify?top_k=k&model=&version=`` (APIError for every 4xx/5xx answer);
    shared by the route and the ASGI fast path in front of FastAPI (:mod:`.fastpath`)."""
    started = time.perf_counter()
    with state.use(model, version) as mv:
        return await _classify(request, state, mv, k, started)


async def _classify(request: Request, state: ServerState, mv: ModelVersion, k: int, started: float) -> bytes:
    art = mv.art
    assert art is not None
    if k > art.num_classes:
        raise APIError(422, "validation_error", f"query.top_k: must be between 1 and {art.num_classes}")
    s = state.settings
    blobs = await read_images(request, s.max_body_bytes, s.max_images)
    state.admit(len(blobs))

    async def work() -> tuple[list[np.ndarray], float, list[Result]]:
        """Decode, then queue for inference."""
        arrays, decode_s = await state.preprocess(blobs, deadline=started + s.timeout_s, art=art)
        return arrays, decode_s, await state.infer(arrays, mv)

    try:
        _, decode_s, results = await state.with_deadline(work(), started)  # type: ignore[misc]
    finally:
        state.release(len(blobs))
    if not all(np.isfinite(r.logits).all() for r in results):
        log.error("model %s produced non-finite logits on /classify", mv.name)
        raise APIError(500, "non_finite_output", "the model produced NaN/Inf logits for this image")
    preds = [top_k(r.logits, k, art.labels) for r in results]
    return orjson.dumps({"model": mv.name, "version": str(mv.version), "predictions": preds,  # ~10x json's speed
                         "timing_ms": _timing(decode_s, results, started),
                         "batch_size": max(r.batch_size for r in results)})


def model_metadata(state: ServerState, mv: ModelVersion) -> dict[str, Any]:
    """model.json facts plus what is actually running."""
    art = mv.art
    assert art is not None
    info = mv.engine.info if mv.engine else None
    return {"name": mv.name, "version": str(mv.version), "architecture": art.architecture,
            "img_size": art.img_size, "num_classes": art.num_classes, "labels": art.labels,
            "preprocess": art.to_dict()["preprocess"], "opset": art.opset, "versions": art.versions,
            "parity": art.parity, "ready": mv.ready,
            "backend": info.backend if info else None, "device": info.device if info else None,
            "precision": info.precision if info else None, "quantization": art.quantization,
            "fidelity": art.fidelity,
            "providers": info.providers if info else [], "batch_sizes": info.batch_sizes if info else [],
            "max_wait_ms": state.settings.max_wait_ms, "jpeg_draft": state.settings.jpeg_draft}


def served(state: ServerState, failed: bool = False) -> list[ModelVersion]:
    """Every version being served (``failed``: and those whose warm-up failed; a front end of --frontends:
    its one model)."""
    if state.repo is not None and state.started:
        return state.repo.versions(failed)
    if state.art is None:
        return []
    return [ModelVersion(state.art.name, 1, Path(state.settings.artifact_dir), state.art, state.engine,
                         state.batcher, "READY" if state.ready else "LOADING")]


@router.get("/v1/models", tags=["models"], responses=error_responses(401, 500))
async def list_models(request: Request) -> dict[str, Any]:
    """Metadata of every served model version (from model.json) and the engine running it."""
    state = get_state(request)
    return {"models": [model_metadata(state, mv) for mv in served(state, failed=True)]}


@router.get("/v1/models/{name}", tags=["models"], responses=error_responses(401, 404, 500))
async def get_model(request: Request, name: str) -> dict[str, Any]:
    """Metadata of one model's newest version (404 for a name not served)."""
    state = get_state(request)
    mine = [mv for mv in served(state, failed=True) if mv.name == name]
    if not mine:
        raise APIError(404, "model_not_found", f"no model {name!r}; see /v1/models")
    return model_metadata(state, max(mine, key=lambda m: m.version))


@router.get("/healthz", tags=["health"], responses={200: {"model": HealthStatus}, **_HEALTH_503})
async def healthz(request: Request) -> JSONResponse:
    """Liveness: the process answers (fails only if warm-up failed)."""
    state = get_state(request)
    state.check_workers()
    if state.failure:
        return JSONResponse({"status": "failed", "detail": _failure(request, state)}, status_code=503)
    return JSONResponse({"status": "ok"})


def _failure(request: Request, state: ServerState) -> str:
    """The failure text for callers with the key (or when none is set); a pointer to the log otherwise."""
    if authorized(request.scope, state.settings.api_key):
        return state.failure
    return "failed; details in the server log (or send the API key)"


@router.get("/readyz", tags=["health"], responses={200: {"model": HealthStatus}, **_HEALTH_503})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 503 until the model is loaded and every batch size warmed up."""
    state = get_state(request)
    state.check_workers()
    if not state.ready:
        detail = _failure(request, state) if state.failure else (state.waiting or "warming up")
        return JSONResponse({"status": "not_ready", "detail": detail}, status_code=503,
                            headers={"Retry-After": "1"})
    return JSONResponse({"status": "ready"})


@router.get("/metrics", tags=["health"], responses=error_responses(401, 500))
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    from prometheus_client import CONTENT_TYPE_LATEST

    state = get_state(request)
    if state.repo is not None:
        state.metrics.queue_depth.set(state.repo.observe())
    elif state.batcher is not None:
        state.metrics.queue_depth.set(state.batcher.depth)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    """The demo page."""
    return FileResponse(STATIC / "index.html", media_type="text/html")
