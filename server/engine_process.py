"""The engine process of ``irpe serve --frontends N``: one model, one batcher, one device context.

Front-end processes connect over a Unix socket, say where their shared-memory image slots are
(:mod:`.shm`), then send ``{"id", "slots"}`` frames; each becomes one :meth:`Batcher.submit` of the slot
views (the batcher stacks them straight from shared memory) and is answered with the logits as raw bytes,
or an error code (``queue_full`` with its Retry-After, ``shutting_down``, ``not_ready``, ``timeout``,
``internal``). Status frames (``op: status``) tell every front end when warm-up is done or failed.
On SIGTERM the socket closes and the batcher drains what is queued before the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import weakref
from collections.abc import Collection
from dataclasses import asdict
from typing import Any

import numpy as np

from irpe.artifact import ArtifactError

from .batching import BatcherStoppedError, QueueFullError, Result
from .config import Settings
from .engine import EngineError
from .errors import APIError
from .memory import tune_gc
from .shm import attach, pack, read_frame
from .state import ServerState

log = logging.getLogger("irpe.server")


GRACE_S = 0.2  # a version leaving the front ends' routing tables: time for requests already sent to arrive
ACK_TIMEOUT_S = 5.0  # the longest a repository change waits for every front end to apply it


def status(state: ServerState, leaving: Collection[object] = ()) -> dict[str, Any]:
    """What a front end needs to know about the engine: readiness, failure, engine facts; with a model
    repository, the versions to route to (``leaving``: versions about to be retired, left out) and the
    repository index."""
    info = asdict(state.engine.info) if state.engine is not None else None
    head = {"op": "status", "ready": state.ready, "failure": state.failure, "info": info}
    if state.repo is not None and state.started:
        head["versions"] = served(state, leaving)
        head["index"] = state.repo.index()
    return head


def served(state: ServerState, leaving: Collection[object] = ()) -> list[list[Any]]:
    """[name, version, path, signature] of every READY version not in ``leaving``."""
    assert state.repo is not None
    return [[mv.name, mv.version, str(mv.path), [list(f) for f in mv.signature]]
            for mv in state.repo.versions() if mv not in leaving]


async def answer(state: ServerState, array: np.ndarray, head: dict[str, Any]) -> bytes:
    """Run one front-end request through the batcher; the reply frame."""
    rid = head["id"]
    try:
        if "model" in head:  # a model repository: that model version's batcher
            results = await _routed(state, array, head)
        else:
            if not state.ready or state.batcher is None:
                return pack({"id": rid, "err": "not_ready", "msg": state.failure or "engine is warming up"})
            views = [array[i] for i in head["slots"]]
            left = float(head.get("timeout", state.settings.timeout_s))
            results = await state.batcher.submit(views, timeout=max(left, 0.001))
    except APIError as e:  # unknown model or version (404), a version that is not available (503)
        code = "model_not_found" if e.status == 404 else "not_ready"
        return pack({"id": rid, "err": code, "msg": e.message})
    except QueueFullError as e:
        return pack({"id": rid, "err": "queue_full", "msg": str(e), "retry": e.retry_after})
    except BatcherStoppedError as e:
        return pack({"id": rid, "err": "shutting_down", "msg": str(e)})
    except asyncio.TimeoutError:
        return pack({"id": rid, "err": "timeout", "msg": "engine deadline passed"})
    except Exception as e:  # an inference failure: the front end answers 500, the engine keeps serving
        return pack({"id": rid, "err": "internal", "msg": f"{type(e).__name__}: {e}"[:500]})
    logits = np.stack([r.logits for r in results]).astype(np.float32, copy=False)
    return pack({"id": rid, "q": [r.queue_s for r in results], "i": [r.inference_s for r in results],
                 "b": [r.batch_size for r in results], "n": int(logits.shape[1])}, logits.tobytes())


async def _routed(state: ServerState, array: np.ndarray, head: dict[str, Any]) -> list[Result]:
    """Run a front end's request on the model version its frame names (held until answered)."""
    if state.repo is None or not state.started:
        raise APIError(503, "not_ready", state.failure or "engine is warming up")
    with state.repo.acquire(head["model"], head.get("version")) as mv:
        assert mv.batcher is not None
        left = float(head.get("timeout", state.settings.timeout_s))
        return await mv.batcher.submit([array[i] for i in head["slots"]], timeout=max(left, 0.001))


class EngineServer:
    """The Unix-socket server around a loaded :class:`ServerState`."""

    def __init__(self, state: ServerState, path: str):
        self.state, self.path = state, path
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._sent: list | None = None  # the versions last broadcast
        self._leaving: weakref.WeakSet = weakref.WeakSet()  # versions being retired: no longer announced
        self._seq = 0  # status frames broadcast
        self._acked: dict[asyncio.StreamWriter, int] = {}  # the last status each front-end link applied
        self._ack = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One front end: hello (its slots), then requests until it hangs up."""
        hello = await read_frame(reader)
        if hello is None:
            writer.close()
            return
        shm, array = attach(hello[0])
        writer.write(pack(status(self.state)))
        self.writers.add(writer)
        log.info("front end pid %s connected (%d slots)", hello[0].get("pid"), array.shape[0])
        try:
            while (frame := await read_frame(reader)) is not None:
                if frame[0].get("op") == "stats":  # /v2 statistics: this batcher counts every front end's work
                    rid = frame[0].get("rid")
                    head = {"op": "reply", "rid": rid} if rid is not None else {"op": "stats"}
                    writer.write(pack({**head, "stats": self._stats(frame[0])}))
                    continue
                if frame[0].get("op") == "ack":  # a front end has applied status ``seq``
                    self._acked[writer] = int(frame[0]["seq"])
                    self._ack.set()
                    continue
                work = self._control(frame[0], writer) if frame[0].get("op") == "control" else \
                    self._reply(array, frame[0], writer)
                task = asyncio.ensure_future(work)
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        except asyncio.CancelledError:  # the loop is closing after the drain
            pass
        finally:
            self.writers.discard(writer)
            self._acked.pop(writer, None)
            writer.close()
            del array
            with contextlib.suppress(BufferError):  # views still queued keep the mapping until collected
                shm.close()

    async def _reply(self, array: np.ndarray, head: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        frame = await answer(self.state, array, head)
        if not writer.is_closing():
            writer.write(frame)

    def _stats(self, head: dict[str, Any]) -> dict[str, Any] | None:
        """The statistics of the engine's batcher, or of the repository version the frame names."""
        batcher = self.state.batcher
        if "model" in head and self.state.repo is not None:
            try:
                batcher = self.state.repo.lookup(head["model"], head.get("version")).batcher
            except APIError:
                batcher = None
        return batcher.stats.to_triton("") if batcher else None

    async def _control(self, head: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """A front end's repository load/unload (``op: control``): run it here, tell every front end the
        new set of versions, then answer the one that asked."""
        reply: dict[str, Any] = {"op": "reply", "rid": head["rid"]}
        try:
            await asyncio.to_thread(self.state.control, head["name"], bool(head["load"]))
        except APIError as e:
            reply.update(status=e.status, code=e.code, msg=e.message, headers=e.headers)
        except Exception as e:  # a failure outside the repository's own handling: 500, the engine keeps serving
            log.exception("repository control of %s failed", head.get("name"))
            reply.update(status=500, code="internal", msg=f"{type(e).__name__}: {e}"[:500])
        await self.told()
        if not writer.is_closing():
            writer.write(pack(reply))

    def broadcast(self) -> int:
        """Send the current status to every connected front end (event loop); its sequence number."""
        self._seq += 1
        head = {**status(self.state, self._leaving), "seq": self._seq}
        self._sent = head.get("versions")
        frame = pack(head)
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

    def before_retire(self, mv: object) -> None:
        """Repository hook (control or poll thread): every front end stops routing to ``mv`` before the
        engine stops taking requests for it; requests already sent still arrive and finish on it."""
        assert self.loop is not None
        self._leaving.add(mv)
        asyncio.run_coroutine_threadsafe(self.told(), self.loop).result(ACK_TIMEOUT_S + 1)
        time.sleep(GRACE_S)

    async def watch(self) -> None:
        """``--model-control poll``: tell the front ends when a poll changed the served versions."""
        while True:
            await asyncio.sleep(0.2)
            if self.state.repo is not None and self.state.started and served(self.state, self._leaving) != self._sent:
                self.broadcast()

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT, warming up meanwhile; then drain."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.loop = loop
        server = await asyncio.start_unix_server(self.handle, self.path)
        await asyncio.to_thread(self.state.warm)
        self.broadcast()
        if self.state.repo is not None:
            self.state.repo.on_retire = self.before_retire
            watcher = asyncio.ensure_future(self.watch())
        await stop.wait()
        log.info("engine: stopping; draining %d queued image(s)", self.state.batcher.depth if self.state.batcher else 0)
        server.close()
        if self.state.repo is not None:
            watcher.cancel()
            self.state.repo.on_retire = None
        await asyncio.to_thread(self.state.shutdown)  # queued images still run and are answered
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=5)
        for w in list(self.writers):
            with contextlib.suppress(Exception):
                await w.drain()


def engine_main(settings: Settings, path: str) -> None:
    """Process entry point (spawned by :func:`~.frontends.serve_frontends`); exits 3 when the model
    cannot be loaded."""
    from .frontends import child_setup

    child_setup("irpe-engine", settings)
    started = time.perf_counter()
    state = ServerState(settings)
    try:
        state.load()
    except (ArtifactError, EngineError) as e:
        log.error("engine: cannot load the model: %s", e)
        raise SystemExit(3) from None
    log.info("engine: model loaded in %.2fs; socket %s", time.perf_counter() - started, path)
    tune_gc()
    asyncio.run(EngineServer(state, path).run())
