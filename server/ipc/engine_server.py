"""The engine process of ``irpe serve --frontends N``: the models, their batchers, one device context.

Front-end processes connect over a Unix socket (:class:`~.link.EngineLink`), attach their shared-memory
slot pools, then send requests naming slots and a model version; each becomes one ``submit`` on that
version's batcher (which stacks straight from shared memory) and is answered with the logits as raw bytes,
or an error (:mod:`.wire`). The route table is pushed to every front end as a status frame when a front
end connects, when warm-up is done and after every change of the host (:class:`~..hosting.local.LocalHost`
listeners); before a version is retired the engine waits (outside the host's control lock) until every front
end has acknowledged the status that leaves it out. On SIGTERM the socket closes and the batchers drain what
is queued before the process exits 0. No FastAPI or Starlette is imported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from dataclasses import asdict
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from irpe.artifact import ArtifactError

from ..config import Settings
from ..engines import EngineError
from ..errors import APIError, not_ready
from ..hosting.host import ModelVersion
from ..memory import tune_gc
from ..pipeline.service import Service, local_service
from ..runtime import child_setup
from . import wire
from .slots import attach

log = logging.getLogger("irpe.server")
GRACE_S = 0.2  # a version leaving the front ends' routing tables: time for requests already sent to arrive
ACK_TIMEOUT_S = 5.0  # the longest a repository change waits for every front end to apply it


def route_table(service: Service) -> dict[str, Any] | None:
    """What a front end routes by (None before the warm-up is over); see :func:`.wire.status_head`."""
    host = service.host
    if not host.started:
        return None
    return {"default": host.default_name(),
            "catalog": {n: [e.policy, e.error, e.max_queue] for n, e in host.catalog().items()},
            "versions": [_version_row(served) for served in host.versions() if served.artifact is not None],
            "index": host.index()}


def _version_row(model_version: ModelVersion) -> list[Any]:
    assert model_version.artifact is not None
    info = asdict(model_version.info) if model_version.info else None
    return [model_version.name, model_version.version, str(model_version.path),
            [list(f) for f in model_version.signature], model_version.artifact.to_dict(), info]


async def answer(service: Service, array: np.ndarray, head: dict[str, Any]) -> bytes:
    """Run one front-end request on the model version its frame names; the answer frame."""
    rid = head["id"]
    host = service.host
    try:
        if not host.started:
            raise not_ready(service.failure or "engine is warming up")
        with host.acquire(head.get("model"), head.get("version")) as model_version:
            if model_version.batcher is None:
                raise APIError(503, "not_ready",
                               f"model '{model_version.name}' version {model_version.version} is not loaded")
            left = float(head.get("timeout", service.settings.timeout_s))
            results = await model_version.batcher.submit([array[i] for i in head["slots"]], timeout=max(left, 0.001))
    except Exception as e:  # every error crosses back as the same exception (an inference failure: 500)
        return wire.pack({"id": rid, **wire.error_head(e)})
    return wire.answer(rid, results)


class EngineServer:
    """The Unix-socket server around a loaded :class:`~..pipeline.service.Service` over a LocalHost."""

    def __init__(self, service: Service, path: str):
        self.service = service
        self.path = path
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._seq = 0  # status frames broadcast
        self._sent: dict[str, Any] | None = None  # the route table last broadcast
        self._acked: dict[asyncio.StreamWriter, int] = {}  # the last status each front-end link applied
        self._ack = asyncio.Event()

    def status(self) -> dict[str, Any]:
        return wire.status_head(self.service.ready, self.service.failure, route_table(self.service))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One front end: hello, then pools, requests and questions until it hangs up."""
        hello = await read_hello(reader)
        if hello is None:
            writer.close()
            return
        pools: dict[str, tuple[shared_memory.SharedMemory, np.ndarray]] = {}
        writer.write(wire.pack(self.status()))
        self.writers.add(writer)
        log.info("front end pid %s connected", hello.get("pid"))
        try:
            while (frame := await wire.read_frame(reader)) is not None:
                self._dispatch(frame[0], pools, writer)
        except asyncio.CancelledError:  # the loop is closing after the drain
            pass
        finally:
            self.writers.discard(writer)
            self._acked.pop(writer, None)
            writer.close()
            for shm, _ in pools.values():
                with contextlib.suppress(FileNotFoundError):  # the front end is gone (a SIGKILL, too): its
                    shm.unlink()  # blocks go with it, not when the whole server exits (a clean exit unlinked them)
                with contextlib.suppress(BufferError):  # views still queued keep the mapping until collected
                    shm.close()

    def _dispatch(self, head: dict[str, Any], pools: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        op = head.get("op")
        if op == wire.ATTACH:
            pools[head["shm"]] = attach(head)
        elif op == wire.STATS:
            writer.write(wire.pack({"op": wire.REPLY, "rid": head.get("rid"), "stats": self._stats(head)}))
        elif op == wire.ACK:  # a front end has applied status ``seq``
            self._acked[writer] = int(head["seq"])
            self._ack.set()
        else:
            work = self._control(head, writer) if op == wire.CONTROL else self._reply(pools[head["shm"]][1], head,
                                                                                      writer)
            task = asyncio.ensure_future(work)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _reply(self, array: np.ndarray, head: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        frame = await answer(self.service, array, head)
        if not writer.is_closing():
            writer.write(frame)

    def _stats(self, head: dict[str, Any]) -> dict[str, Any] | None:
        """The statistics of the version the frame names (its batcher counts every front end's work)."""
        try:
            batcher = self.service.host.lookup(head.get("model"), head.get("version")).batcher
        except APIError:
            batcher = None
        return batcher.stats.to_triton("", reasons=True) if batcher else None

    async def _control(self, head: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """A front end's repository load/unload: run it here (every front end is told through the host's
        listener), then answer the one that asked."""
        reply: dict[str, Any] = {"op": wire.REPLY, "rid": head["rid"]}
        try:
            await asyncio.to_thread(self.service.control, head["name"], bool(head["load"]))
        except APIError as e:
            reply.update(wire.error_head(e))
        except Exception as e:  # a failure outside the repository's own handling: 500, the engine keeps serving
            log.exception("repository control of %s failed", head.get("name"))
            reply.update(wire.error_head(APIError(500, "internal", f"{type(e).__name__}: {e}"[:500])))
        if not writer.is_closing():
            writer.write(wire.pack(reply))

    def broadcast(self) -> int:
        """Send the current status to every connected front end (event loop); its sequence number."""
        self._seq += 1
        head = self.status()
        self._sent = head.get("table")
        frame = wire.pack({**head, "seq": self._seq})
        for w in list(self.writers):
            if not w.is_closing():
                w.write(frame)
        return self._seq

    async def told(self) -> None:
        """Broadcast the status and wait until every front-end link has applied it (or ACK_TIMEOUT_S)."""
        seq = self.broadcast()
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while any(self._acked.get(w, 0) < seq for w in self.writers if not w.is_closing()):
            self._ack.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("a front end did not confirm the repository change within %.0fs", ACK_TIMEOUT_S)
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ack.wait(), left)

    def on_change(self, leaving: list[ModelVersion]) -> None:
        """Host listener (a control or poll thread, never under the host's lock): every front end routes by
        the new table before this returns; with ``leaving``, requests already sent still arrive."""
        assert self.loop is not None
        if not leaving and route_table(self.service) == self._sent:
            return  # nothing a front end routes by has changed (a poll that found nothing new)
        asyncio.run_coroutine_threadsafe(self.told(), self.loop).result(ACK_TIMEOUT_S + 1)
        if leaving:
            time.sleep(GRACE_S)

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT, warming up meanwhile; then drain."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.loop = loop
        server = await asyncio.start_unix_server(self.handle, self.path)
        await asyncio.to_thread(self.service.warm)
        self.broadcast()
        self.service.host.subscribe(self.on_change)
        await stop.wait()
        log.info("engine: stopping; draining %d queued image(s)", self.service.host.observe())
        server.close()
        self.service.host.unsubscribe(self.on_change)
        await asyncio.to_thread(self.service.shutdown)  # queued images still run and are answered
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=5)
        for w in list(self.writers):
            with contextlib.suppress(Exception):
                await w.drain()


async def read_hello(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """A link's first frame (``op: hello``), or None."""
    frame = await wire.read_frame(reader)
    return frame[0] if frame is not None and frame[0].get("op") == wire.HELLO else None


def engine_main(settings: Settings, path: str) -> None:
    """Process entry point (spawned by :class:`~.supervisor.Supervisor`); exits 3 when the model cannot
    be loaded."""
    child_setup("irpe-engine", settings)
    started = time.perf_counter()
    service = local_service(settings)
    try:
        service.load()
    except (ArtifactError, EngineError) as e:  # one line, as the one-process server's
        print(f"irpe serve: error: cannot load the model: {e}", file=sys.stderr, flush=True)
        raise SystemExit(3) from None
    log.info("engine: model loaded in %.2fs; socket %s", time.perf_counter() - started, path)
    tune_gc()
    asyncio.run(EngineServer(service, path).run())
