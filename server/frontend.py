"""The servers of one front-end process (one process, or each of ``--frontends``): uvicorn for HTTP and,
with ``--grpc-port``, the gRPC server (:mod:`.grpc`) on the same event loop over the same
:class:`~.pipeline.service.Service`. The gRPC front end is imported only then (it needs the ``grpc`` extra,
whose protobuf messages clash with the kserve package's in one process)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from .config import Settings
from .pipeline.service import Service
from .pipeline.sysshm import SharedMemoryRegistry
from .runtime import announce, announce_grpc

log = logging.getLogger("irpe.server")


class FrontEndServer(uvicorn.Server):
    """uvicorn.Server that also runs the gRPC server while it serves; ``announce``: print the bound addresses
    once started (one process; the ``--frontends`` and ``--workers`` supervisor announces for its processes).
    ``shm``: the client shared memory registry the HTTP app holds, shared with the gRPC server. ``on_listening``:
    called once both listeners are up (a ``--workers`` process tells the supervisor)."""

    def __init__(self, config: uvicorn.Config, service: Service, shm: SharedMemoryRegistry, announce: bool = True,
                 reuse_port: bool = False, on_listening: Callable[[], object] | None = None):
        super().__init__(config)
        self.on_listening = on_listening
        self.service = service
        self.shm = shm
        self.announce = announce
        self.reuse_port = reuse_port
        self.grpc: Any = None
        self.failure = ""
        self._gate = threading.Lock()
        self._warmed = self._bound = False
        if announce:  # one process: "ready:" once the model is warm and the port bound, never after a failed bind
            service.ready_gate = self._warm_done

    def _warm_done(self) -> bool:
        """The service's warm-up is through: whether it logs "ready:" now (else :meth:`startup` does)."""
        with self._gate:
            self._warmed = True
            return self._bound

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        if self.announce and self.servers:
            announce(self.servers[0].sockets[0].getsockname())
        port = self.service.settings.grpc_port
        if port >= 0:
            from .grpc.server import start_grpc

            try:
                self.grpc, bound = await start_grpc(self.service, self.shm, port, self.reuse_port)
            except RuntimeError as e:
                self.failure = f"{e} (is the port in use? pick another --grpc-port)"
                log.error("%s", self.failure)
                self.should_exit = True
                return
            if self.announce:
                announce_grpc(self.service.settings.host, bound)
        if self.on_listening is not None:
            self.on_listening()
        with self._gate:
            self._bound, warmed = True, self._warmed
        if warmed and self.service.ready and self.announce:
            log.info("ready: %s", self.service.host.describe())

    async def shutdown(self, sockets: list | None = None) -> None:
        await self.drain()
        if self.grpc is not None:  # running RPCs finish within the deadline, as HTTP requests do
            from .grpc.server import stop_grpc

            await stop_grpc(self.grpc, self.service.settings.timeout_s)
            self.grpc = None
        await super().shutdown(sockets)

    async def drain(self) -> None:
        """``--drain-s``: /readyz answers 503 for that long while both listeners still accept and serve, so a
        load balancer's health check takes this server out before it stops listening; a second signal ends
        the wait."""
        seconds = self.service.settings.drain_s
        if seconds <= 0 or not self.service.routable:
            return
        self.service.begin_drain()
        log.info("draining: /readyz answers 503 for %.1f s; requests are still served", seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.force_exit and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(0.1, left))


def loaded_server(settings: Settings, **options: Any) -> FrontEndServer:
    """A whole server of one process (one process, or a ``--workers`` process): the app with its model loaded
    before uvicorn starts, so a bad model is one line naming the fix.

    Args:
        settings: the server's settings.
        **options: :class:`FrontEndServer`'s keyword options.

    Returns:
        The server, not yet running.

    Raises:
        SystemExit: the model could not be loaded.
    """
    from irpe.artifact import ArtifactError

    from .engines import EngineError
    from .http.app import create_app
    from .http.protocol import uvicorn_config_kwargs
    from .memory import tune_gc

    app = create_app(settings)
    try:
        app.state.irpe.load()
    except (ArtifactError, EngineError) as e:
        raise SystemExit(f"irpe serve: error: cannot load the model: {e}") from None
    tune_gc()
    config = uvicorn.Config(app, **uvicorn_config_kwargs(settings))  # type: ignore[arg-type]
    return FrontEndServer(config, app.state.irpe, app.state.shm, **options)
