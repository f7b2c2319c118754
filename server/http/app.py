"""The FastAPI application: ``create_app(settings)``.

The model is loaded in the lifespan unless the launcher loaded it first (:mod:`..launch`: a bad artifact or
a GPU that fell back to CPU stops startup); the warm-up of every batch size runs in the background so
/healthz answers at once and /readyz turns 200 when it is done. On SIGTERM /readyz answers 503 for
``--drain-s`` while requests are still served (:mod:`..frontend`), then uvicorn stops accepting, waits
for in-flight requests, then the lifespan drains the batchers. Imports nothing from torch or the
export/training code.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

import irpe
from irpe.artifact import ArtifactError

from ..config import Settings
from ..engines import EngineError
from ..pipeline.service import Service, local_service
from ..pipeline.sysshm import SharedMemoryRegistry
from ..runtime import configure_logging
from . import classify, infer_fast, kserve, routes, triton_ext
from .apidocs import install_api_docs
from .errors import drop_default_validation_error, install_error_handlers
from .middleware import ObserveMiddleware
from .tracing import TraceMiddleware, otlp_tracer

log = logging.getLogger("irpe.server")


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    service: Service = app.state.irpe
    try:
        if service.pool is None:  # the launcher loads before uvicorn starts; workers and tests load here
            await asyncio.to_thread(service.load)
    except (ArtifactError, EngineError) as e:
        log.error("cannot load the model: %s", e)
        raise
    warm = asyncio.create_task(asyncio.to_thread(service.warm))
    try:
        yield
    finally:
        await warm
        await asyncio.to_thread(service.shutdown)
        app.state.shm.close()
        log.info("batcher drained; bye")


class IrpeApp(FastAPI):
    """FastAPI, with the common ``POST /classify`` sent through our middleware to its endpoint directly
    (:mod:`.classify`) and ``POST /v2/models/{m}/infer`` to an endpoint doing the middleware's work itself
    (:mod:`.infer_fast`); every other request takes FastAPI's way."""

    classify_stack: Any = None
    infer_stack: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.classify_stack is not None and (params := classify.fast_params(scope)) is not None:
            scope["app"] = self
            scope["irpe.classify"] = params
            await self.classify_stack(scope, receive, send)
            return
        if self.infer_stack is not None and (names := infer_fast.infer_params(scope)) is not None:
            scope["app"] = self
            scope["irpe.infer"] = names
            await self.infer_stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, service: Service | None = None) -> IrpeApp:
    """Build the app, with its client shared memory registry (``app.state.shm``).

    Args:
        settings: the server's settings (default: from ``IRPE_*`` environment variables).
        service: another Service (a front end of ``--frontends`` over a RemoteHost); default: one over a
            LocalHost.

    Returns:
        The app (its service loads in the lifespan unless loaded before).
    """
    settings = settings or Settings.from_env()
    app = IrpeApp(title="irpe-deploy", version=irpe.__version__, lifespan=_lifespan, docs_url=None, redoc_url=None,
                  description="Image classification with iRPE vision transformers. POST an image to "
                  "/classify; KServe v2 / Triton clients use /v2.")
    service = service or local_service(settings)
    app.state.irpe = service
    app.state.shm = SharedMemoryRegistry.from_settings(settings)  # client shared memory, HTTP's and gRPC's
    install_error_handlers(app)
    app.include_router(classify.router)
    app.include_router(routes.router)
    app.include_router(kserve.router)
    app.include_router(triton_ext.router)
    tracer = otlp_tracer()
    app.add_middleware(ObserveMiddleware, service=service)
    app.add_middleware(TraceMiddleware, tracer=tracer)  # outermost: request id + trace on every answer
    observe = ObserveMiddleware(classify.ClassifyEndpoint(service), service=service)
    app.classify_stack = TraceMiddleware(observe, tracer=tracer)
    app.infer_stack = infer_fast.InferEndpoint(service, observe, tracer)  # both middlewares' work inside
    app.mount("/static", StaticFiles(directory=routes.STATIC), name="static")
    install_api_docs(app)  # /docs with its assets from this host (no CDN); no /redoc
    _declare_real_errors(app)
    return app


def _declare_real_errors(app: FastAPI) -> None:
    """Errors are ``ErrorResponse`` (declared per route); drop FastAPI's default 422 schema from /openapi.json."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """The generated schema without ``HTTPValidationError`` (cached by FastAPI)."""
        if app.openapi_schema is None:
            app.openapi_schema = drop_default_validation_error(default_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (settings from ``IRPE_*`` variables)."""
    settings = Settings.from_env()
    configure_logging(settings)
    return create_app(settings)
