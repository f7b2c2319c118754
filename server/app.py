"""The FastAPI application: ``create_app(settings)`` and the uvicorn runner behind ``irpe serve``.

The model is loaded in the lifespan (a bad artifact or a GPU that fell back to CPU stops startup); the
warm-up of every batch size runs in the background so /healthz answers at once and /readyz turns 200
when it is done. On SIGTERM uvicorn stops accepting, waits for in-flight requests, then the lifespan
drains the batcher. Imports nothing from torch or the export/training code.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

import irpe
from irpe.artifact import ArtifactError

from . import kserve, routes
from .config import Settings
from .engine import EngineError
from .errors import drop_default_validation_error, install_error_handlers
from .fastpath import ClassifyEndpoint, fast_params
from .memory import tune_gc
from .middleware import ObserveMiddleware
from .protocol import protocol_factory
from .state import ServerState
from .tracing import TraceMiddleware, otlp_tracer

log = logging.getLogger("irpe.server")


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.irpe
    try:
        if state.engine is None and state.repo is None:  # serve() loads before uvicorn starts; workers load here
            await asyncio.to_thread(state.load)
    except (ArtifactError, EngineError) as e:
        log.error("cannot load the model: %s", e)
        raise
    warm = asyncio.create_task(asyncio.to_thread(state.warm))
    try:
        yield
    finally:
        await warm
        await asyncio.to_thread(state.shutdown)
        log.info("batcher drained; bye")


class IrpeApp(FastAPI):
    """FastAPI, with the common ``POST /classify`` sent through our middleware to the endpoint directly
    (:mod:`.fastpath`); every other request takes FastAPI's way."""

    classify_stack: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.classify_stack is not None and (params := fast_params(scope)) is not None:
            scope["app"], scope["irpe.classify"] = self, params
            await self.classify_stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, state: ServerState | None = None) -> IrpeApp:
    """Build the app for ``settings`` (default: from ``IRPE_*`` environment variables); ``state``: another
    ServerState (a front end of ``--frontends``, :mod:`.remote`)."""
    settings = settings or Settings.from_env()
    app = IrpeApp(title="irpe-deploy", version=irpe.__version__, lifespan=_lifespan,
                  description="Image classification with iRPE vision transformers. POST an image to "
                  "/classify; KServe v2 / Triton clients use /v2.")
    app.state.irpe = state or ServerState(settings)
    install_error_handlers(app)
    app.include_router(routes.router)
    app.include_router(kserve.router)
    tracer = otlp_tracer()
    app.add_middleware(ObserveMiddleware, state=app.state.irpe)
    app.add_middleware(TraceMiddleware, tracer=tracer)  # outermost: request id + trace on every answer
    classify = next(r for r in routes.router.routes if getattr(r, "path", "") == "/classify")
    app.classify_stack = TraceMiddleware(ObserveMiddleware(ClassifyEndpoint(app.state.irpe, classify),
                                                           state=app.state.irpe), tracer=tracer)
    app.mount("/static", StaticFiles(directory=routes.STATIC), name="static")
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
    """Factory for uvicorn worker processes (settings travel as ``IRPE_*`` variables)."""
    settings = Settings.from_env()
    configure_logging(settings)
    return create_app(settings)


def configure_logging(settings: Settings) -> None:
    """Log lines with time and logger name at the configured level."""
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def uvicorn_config_kwargs(settings: Settings) -> dict[str, object]:
    """Options shared by the single-process and multi-worker paths."""
    return {"host": settings.host, "port": settings.port, "log_level": settings.log_level,
            "access_log": settings.log_level == "debug",
            "timeout_graceful_shutdown": int(settings.timeout_s) + 5, "http": protocol_factory(settings)}


def serve(settings: Settings) -> None:
    """Run uvicorn until SIGINT/SIGTERM (graceful: in-flight requests finish, the batcher drains)."""
    import os

    try:
        settings.check_exposure()
    except ValueError as e:
        raise SystemExit(f"irpe serve: error: {e}") from None
    configure_logging(settings)
    frontends = settings.frontends if settings.frontends < -1 else settings.resolved_frontends()
    _check_repository_fits(settings, frontends)
    if frontends:
        from .frontends import serve_frontends  # N HTTP processes + one engine process (issue 13)

        code = serve_frontends(settings, frontends)
        if code:
            raise SystemExit(code)
        return
    if settings.workers > 1:
        os.environ.update(settings.to_env())
        _run_workers(settings)
        return
    app = create_app(settings)
    try:  # before uvicorn, so a bad model is one line naming the fix, not a lifespan traceback
        app.state.irpe.load()
    except (ArtifactError, EngineError) as e:
        raise SystemExit(f"irpe serve: error: cannot load the model: {e}") from None
    tune_gc()
    config = uvicorn.Config(app, **uvicorn_config_kwargs(settings))  # type: ignore[arg-type]
    server = _AnnouncingServer(config)
    server.run()
    if not server.started:
        raise SystemExit(3)


def _check_repository_fits(settings: Settings, frontends: int) -> None:
    """A model repository with several models or model control: refuse --workers (each worker would hold
    its own copy; --frontends shares one engine process and forwards model control to it)."""
    from pathlib import Path

    from .repo_layout import is_plain_artifact, scan

    root = Path(settings.artifact_dir)
    if not root.is_dir():
        return
    names = sorted(scan(root))
    if settings.default_model and settings.default_model not in names:
        raise SystemExit(f"irpe serve: error: --default-model {settings.default_model!r} is not in {root} "
                         f"(models: {names}); fix --default-model")
    if is_plain_artifact(root):
        return
    _check_load_model(settings, names)
    several = len(names) > 1 or settings.model_control != "none"
    if several and settings.workers > 1:
        raise SystemExit("irpe serve: error: --workers loads the repository once per process and model control "
                         "would reach only one; with several models or --model-control use --workers 1")


def _check_load_model(settings: Settings, names: list[str]) -> None:
    """``--load-model``: explicit model control only, names the repository holds, the default among them."""
    if not settings.load_model:
        return
    if settings.model_control != "explicit":
        raise SystemExit("irpe serve: error: --load-model picks the models loaded at startup with --model-control "
                         f"explicit (got {settings.model_control}); add --model-control explicit")
    startup = settings.startup_models() or []
    missing = [n for n in startup if n not in names]
    if missing:
        raise SystemExit(f"irpe serve: error: --load-model {missing[0]!r} is not in {settings.artifact_dir} "
                         f"(models: {names}); fix --load-model")
    if startup and settings.default_model and settings.default_model not in startup:
        raise SystemExit(f"irpe serve: error: --default-model {settings.default_model!r} is not loaded at startup "
                         f"(--load-model {','.join(startup)}); add --load-model {settings.default_model}")


def announce(sock_name: tuple) -> None:
    """One stderr line with the bound address, whatever the log level (``--port 0`` picks a free port)."""
    import sys

    print(f"irpe serve: listening on http://{sock_name[0]}:{sock_name[1]}", file=sys.stderr, flush=True)


def _run_workers(settings: Settings) -> None:
    """``uvicorn.run(..., workers=N)``, binding the socket here so the bound port can be announced."""
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config("irpe.server.app:create_app_from_env", factory=True, workers=settings.workers,
                            **uvicorn_config_kwargs(settings))  # type: ignore[arg-type]
    sock = config.bind_socket()
    announce(sock.getsockname())
    Multiprocess(config, sockets=[sock]).run()


class _AnnouncingServer(uvicorn.Server):
    """uvicorn.Server that announces the bound address once started."""

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            announce(self.servers[0].sockets[0].getsockname())
