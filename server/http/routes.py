"""``/v1/models``, health, readiness, metrics and the demo page (``POST /classify``: :mod:`.classify`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel

from ..errors import APIError
from ..hosting.host import ModelVersion
from ..metrics import triton_exposition
from ..pipeline import oip
from ..pipeline.service import Readiness, Service
from .errors import error_responses
from .middleware import authorized

STATIC = Path(__file__).with_name("static")
router = APIRouter()

class HealthStatus(BaseModel):
    status: str
    detail: str | None = None


_HEALTH_503 = {503: {"model": HealthStatus, "description": "not ready / warm-up failed"}}


def service_of(request: Request) -> Service:
    """The Service of the app serving ``request``."""
    return request.app.state.irpe


def model_metadata(service: Service, model_version: ModelVersion) -> dict[str, Any]:
    """model.json facts plus what is actually running."""
    artifact = model_version.artifact
    assert artifact is not None
    info = model_version.info
    return {"name": model_version.name, "version": str(model_version.version), "architecture": artifact.architecture,
            "img_size": artifact.img_size, "num_classes": artifact.num_classes, "labels": artifact.labels,
            "preprocess": artifact.to_dict()["preprocess"], "opset": artifact.opset, "versions": artifact.versions,
            "parity": artifact.parity, "ready": model_version.ready,
            "backend": info.backend if info else None, "device": info.device if info else None,
            "precision": info.precision if info else None, "quantization": artifact.quantization,
            "fidelity": artifact.fidelity,
            "providers": info.providers if info else [], "custom_ops": info.custom_ops if info else [],
            "batch_sizes": info.batch_sizes if info else [],
            "max_wait_ms": service.settings.max_wait_ms, "jpeg_draft": service.settings.jpeg_draft}


@router.get("/v1/models", tags=["models"], responses=error_responses(401, 500))
async def list_models(request: Request) -> dict[str, Any]:
    """Metadata of every served model version (from model.json) and the engine running it."""
    service = service_of(request)
    return {"models": [model_metadata(service, model_version) for model_version in service.host.versions(failed=True)]}


@router.get("/v1/models/{name}", tags=["models"], responses=error_responses(401, 404, 500))
async def get_model(request: Request, name: str) -> dict[str, Any]:
    """Metadata of one model's newest version (404 for a name not served)."""
    service = service_of(request)
    mine = [model_version for model_version in service.host.versions(failed=True) if model_version.name == name]
    if not mine:
        raise APIError(404, "model_not_found", f"no model {name!r}; see /v1/models")
    return model_metadata(service, max(mine, key=lambda m: m.version))


@router.get("/healthz", tags=["health"], responses={200: {"model": HealthStatus}, **_HEALTH_503})
async def healthz(request: Request) -> JSONResponse:
    """Liveness: the process answers (fails only if warm-up failed)."""
    service = service_of(request)
    service.check_workers()
    if service.failure:
        return JSONResponse({"status": "failed", "detail": _failure(request, service)}, status_code=503)
    return JSONResponse({"status": "ok"})


def _failure(request: Request, service: Service) -> str:
    """The failure text for callers with the key (or when none is set); a pointer to the log otherwise."""
    if authorized(request.scope, service.settings.api_key):
        return service.failure
    return "failed; details in the server log (or send the API key)"


@router.get("/readyz", tags=["health"], responses={200: {"model": HealthStatus}, **_HEALTH_503})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 503 until the model is loaded and every batch size warmed up, and while draining."""
    service = service_of(request)
    service.check_workers()
    if not service.routable:
        detail = _not_ready_detail(request, service)
        return JSONResponse({"status": "not_ready", "detail": detail}, status_code=503,
                            headers={"Retry-After": "1"})
    return JSONResponse({"status": "ready"})


def _not_ready_detail(request: Request, service: Service) -> str:
    """Why /readyz answers 503, by readiness (a failure's text only for callers with the key)."""
    if service.readiness is Readiness.FAILED:
        return _failure(request, service)
    if service.readiness is Readiness.STOPPING:
        return "shutting down"
    if service.ready and service.draining:
        return "draining"
    return service.reason or "warming up"


@router.get("/metrics", tags=["health"], responses=error_responses(401, 500))
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    from prometheus_client import CONTENT_TYPE_LATEST

    service = service_of(request)
    service.metrics.queue_depth.set(service.host.observe())
    stats = await asyncio.to_thread(oip.metric_stats, service)
    return Response(service.metrics.render() + triton_exposition(stats), media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    """The demo page."""
    return FileResponse(STATIC / "index.html", media_type="text/html")
