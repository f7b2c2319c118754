"""A front-end process's view of the engine process: a batcher whose queue is in another process.

:class:`RemoteBatcher` has the :class:`~.batching.Batcher` surface the routes use (``submit``, ``depth``,
``stats``, ``stop``): images are copied into shared-memory slots (:mod:`.shm`) and only slot numbers
cross the socket; a reader thread resolves each request's future when the engine answers and frees its
slots. The engine's errors keep their HTTP meaning (queue_full -> 503 + Retry-After from the engine's
queue, shutting_down -> 503, timeout -> 504). If the engine process goes away, every waiting request gets
503 and :class:`FrontendState` turns unready (/readyz 503). ``/metrics`` reads every process's values
(prometheus_client's multiprocess mode, one directory shared by the whole process tree).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ArtifactError, load_artifact

from .batching import BatcherStoppedError, QueueFullError, Result, settle
from .decode import PixelBudget
from .engine import EngineInfo
from .errors import APIError
from .memory import fix_mmap_threshold
from .metrics import Metrics
from .repo_layout import is_plain_artifact
from .shm import SlotPool, pack, recv_frame
from .state import ServerState
from .stats import ModelStats

log = logging.getLogger("irpe.server")
SLOTS = 64  # images a front end can have handed to the engine at once (more: 503 queue_full); 38 MB at 224 px


class EngineGoneError(BatcherStoppedError):
    """The engine process closed the connection (crashed or stopped)."""


class RemoteBatcher:
    """Submit images to the engine process through shared memory (see the module docstring)."""

    def __init__(self, path: str, pool: SlotPool, timeout_s: float):
        self.path, self.pool, self.timeout_s = path, pool, timeout_s
        self.stats = EngineStats(self)
        self.ready = False
        self.gone = False
        self.failure = ""
        self.info: dict[str, Any] | None = None
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future, list[int]]] = {}
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._send = threading.Lock()
        self._status = threading.Condition()
        self._reader: threading.Thread | None = None
        self.on_repo: Any = None  # model repository: called (reader thread) with each status naming versions
        self.last_repo: dict[str, Any] | None = None
        self._replies: dict[int, dict[str, Any] | None] = {}

    @property
    def depth(self) -> int:
        """Images this front end has handed to the engine and not yet got back."""
        return self.pool.slots - self.pool.free

    def connect(self, timeout: float = 300.0) -> None:
        """Connect (the engine may still be loading: no socket yet), send the slot description, start the
        reader. A socket that refuses for seconds means the engine is gone."""
        deadline = time.monotonic() + timeout
        refused_until = time.monotonic() + 5.0  # the engine binds, then listens: a refusal is brief
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
                break
            except (FileNotFoundError, ConnectionRefusedError) as e:  # not bound yet / bound, not listening yet
                sock.close()
                if time.monotonic() > (deadline if isinstance(e, FileNotFoundError) else refused_until):
                    self.gone = isinstance(e, ConnectionRefusedError)
                    raise
                time.sleep(0.05)
            except OSError:
                sock.close()
                self.gone = True
                raise
        sock.sendall(pack({"op": "hello", "pid": os.getpid(), **self.pool.describe()}))
        self._sock = sock
        self._reader = threading.Thread(target=self._read, name="irpe-engine-link", daemon=True)
        self._reader.start()

    def wait_status(self, timeout: float | None = None) -> bool:
        """Block until the engine is ready, failed or gone; True when ready."""
        with self._status:
            self._status.wait_for(lambda: self.ready or self.failure or self.gone, timeout)
        return self.ready

    async def submit(self, images: list[np.ndarray], route: dict[str, str] | None = None) -> list[Result]:
        """Queue ``images`` in the engine (all or none) and wait for their results (``route``: the model and
        version of a repository, :mod:`.remote_repo`)."""
        if self.gone or self._sock is None:
            raise EngineGoneError("the engine process is not running")
        slots = self.pool.put(images)
        if slots is None:
            raise QueueFullError(1)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        rid = next(self._ids)
        self._pending[rid] = (loop, future, slots)
        submitted = time.perf_counter()
        ok = False
        try:
            with self._send:
                self._sock.sendall(pack({"id": rid, "slots": slots, "timeout": self.timeout_s, **(route or {})}))
        except OSError:
            self._finish(rid)
            raise EngineGoneError("the engine process is not running") from None
        try:
            head, data = await future
            results = _results(head, data)
            ok = True
            return results
        finally:
            self.stats.request(ok, time.perf_counter() - submitted)

    def _finish(self, rid: int) -> tuple[asyncio.AbstractEventLoop, asyncio.Future] | None:
        entry = self._pending.pop(rid, None)
        if entry is None:
            return None
        self.pool.release(entry[2])
        return entry[0], entry[1]

    def _read(self) -> None:
        """Reader thread: status frames and answers, until the engine hangs up."""
        assert self._sock is not None
        try:
            while (frame := recv_frame(self._sock)) is not None:
                head, data = frame
                if head.get("op") == "status":
                    self._on_status(head)
                elif head.get("op") == "stats":
                    self.stats.answered(head)
                elif head.get("op") == "reply":
                    with self._status:
                        self._replies[head["rid"]] = head
                        self._status.notify_all()
                elif (entry := self._finish(head["id"])) is not None:
                    entry[0].call_soon_threadsafe(settle, entry[1], (head, data), None)
        except OSError:
            pass
        self._on_gone()

    def _on_status(self, head: dict[str, Any]) -> None:
        with self._status:
            self.ready, self.failure, self.info = bool(head["ready"]), head.get("failure") or "", head.get("info")
            if "versions" in head:
                self.last_repo = head
            self._status.notify_all()
        if "versions" in head and self.on_repo is not None:
            self.on_repo(head)
        if "seq" in head:  # applied: the engine may now answer the load / retire the old version
            try:
                with self._send:
                    self._sock.sendall(pack({"op": "ack", "seq": head["seq"]}))  # type: ignore[union-attr]
            except OSError:
                pass

    def request(self, head: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send a control frame and wait (blocking) for the engine's ``op: reply`` to it."""
        if self.gone or self._sock is None:
            raise EngineGoneError("the engine process is not running")
        rid = next(self._ids)
        with self._status:
            self._replies[rid] = None
        try:
            with self._send:
                self._sock.sendall(pack({**head, "rid": rid}))
            with self._status:
                self._status.wait_for(lambda: self._replies[rid] is not None or self.gone, timeout)
                reply = self._replies[rid]
        finally:
            with self._status:
                self._replies.pop(rid, None)
        if reply is None:
            raise EngineGoneError("the engine process did not answer the repository request")
        return reply

    def _on_gone(self) -> None:
        with self._status:
            self.gone, self.ready = True, False
            self._status.notify_all()
        for rid in list(self._pending):
            entry = self._finish(rid)
            if entry is not None:
                error = EngineGoneError("the engine process stopped before answering")
                try:
                    entry[0].call_soon_threadsafe(settle, entry[1], None, error)
                except RuntimeError:  # the loop closed
                    pass

    def start(self) -> None:
        """Nothing to start: the engine runs the batches."""

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Wait (with ``drain``) until every handed-over image is answered, then hang up."""
        deadline = time.monotonic() + timeout
        while drain and self._pending and not self.gone and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._reader is not None:
            self._reader.join(5)


class EngineStats(ModelStats):
    """/v2 statistics of every front end together: the engine process's batcher counts what all of them
    handed over (requests from hand-off to answer, queue, batches); this front end's own counters are the
    answer when the engine does not reply within ``STATS_TIMEOUT_S``."""

    STATS_TIMEOUT_S = 2.0

    def __init__(self, link: RemoteBatcher):
        super().__init__()
        self.link = link
        self._reply: dict[str, Any] | None = None
        self._replied = threading.Condition()

    def answered(self, head: dict[str, Any]) -> None:
        """Reader thread: the engine's answer to :meth:`to_triton`'s question."""
        with self._replied:
            self._reply = head.get("stats") or {}  # {}: the engine has no batcher yet
            self._replied.notify_all()

    def to_triton(self, name: str, version: str = "1") -> dict[str, Any]:
        """The engine's statistics (one round trip over the engine socket), else this front end's."""
        if self.link._sock is not None and not self.link.gone:
            with self._replied:
                self._reply = None
                try:
                    with self.link._send:
                        self.link._sock.sendall(pack({"op": "stats"}))
                except OSError:
                    return super().to_triton(name, version)
                self._replied.wait_for(lambda: self._reply is not None, self.STATS_TIMEOUT_S)
                if self._reply:
                    return {**self._reply, "name": name, "version": version}
        return super().to_triton(name, version)


def _results(head: dict[str, Any], data: bytes) -> list[Result]:
    """Results from an answer frame, or the error it carries (as the in-process batcher raises it)."""
    err = head.get("err")
    if err == "queue_full":
        raise QueueFullError(int(head.get("retry", 1)))
    if err == "shutting_down":
        raise BatcherStoppedError(head.get("msg", "server is shutting down"))
    if err == "not_ready":
        raise APIError(503, "not_ready", head.get("msg", "engine is warming up"), {"Retry-After": "1"})
    if err == "timeout":
        raise APIError(504, "timeout", "request not answered in time by the engine (--timeout-s)")
    if err == "model_not_found":
        raise APIError(404, "model_not_found", head.get("msg", "unknown model"))
    if err:
        raise RuntimeError(f"engine: {head.get('msg', err)}")
    logits = np.frombuffer(data, dtype=np.float32).reshape(len(head["b"]), head["n"])
    return [Result(logits[k], head["q"][k], head["i"][k], head["b"][k]) for k in range(len(head["b"]))]


class MultiprocessMetrics(Metrics):
    """Metrics whose values live in ``PROMETHEUS_MULTIPROC_DIR``; ``render()`` adds up every process."""

    def render(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)


@dataclass
class _RemoteEngine:
    info: EngineInfo


@dataclass
class FrontendState(ServerState):
    """ServerState of a front-end process: decodes here, infers in the engine process at ``engine_path``."""

    engine_path: str = ""
    remote: RemoteBatcher | None = None

    def load(self) -> None:
        """Read model.json, start the decode pool and create the shared-memory slots (no engine here).
        Once only: the app's lifespan calls it again while ``engine`` is still None."""
        if self.remote is not None:
            return
        s = self.settings
        fix_mmap_threshold()
        # auto: small baseline JPEGs decode on the event loop (the front-end processes are the parallelism),
        # anything bigger or slower in one thread, so it does not stall the other requests of this process
        self.pool = ThreadPoolExecutor(s.decode_threads or 1, thread_name_prefix="irpe-decode")
        self.inline_decode = s.decode_threads == 0
        self.budget = PixelBudget(s.resolved_max_decode_pixels())
        slots = min(s.max_queue, max(SLOTS, 2 * s.resolved_max_batch()))
        if not is_plain_artifact(Path(s.artifact_dir)):
            self._load_repository(slots)
            return
        self.art = load_artifact(Path(s.artifact_dir))
        crop = self.art.preprocess.crop
        self.remote = RemoteBatcher(self.engine_path, SlotPool(slots, (3, crop, crop)), s.timeout_s)
        self.batcher = self.remote  # type: ignore[assignment]

    def _load_repository(self, slots: int) -> None:
        """A model repository: route by model and version (:mod:`.remote_repo`)."""
        from .remote_repo import RemoteRepository

        repo = RemoteRepository(Path(self.settings.artifact_dir), self.settings, self.metrics, self.engine_path,
                                slots)
        repo.open(warm=False)
        mine = [m for m in repo.records.get(repo.default_name(), {}).values() if m.art is not None]
        if not mine:
            raise ArtifactError(f"the default model {repo.default_name()!r} has no readable version")
        mv = max(mine, key=lambda m: m.version)
        self.repo, self.art, self.batcher = repo, mv.art, mv.batcher
        self.remote = repo.remotes[mv.art.preprocess.crop]  # type: ignore[union-attr]

    def warm(self) -> None:
        """Connect to the engine process and wait until it is warmed up (or failed)."""
        assert self.remote is not None
        links = list(self.repo.remotes.values()) if self.repo is not None else [self.remote]  # type: ignore
        try:
            for link in links:
                link.connect()
        except OSError as e:
            self.failure = f"cannot reach the engine process ({e})"
            log.error("%s", self.failure)
            return
        if all(link.wait_status() for link in links) and self.remote.info:
            self.engine = _RemoteEngine(EngineInfo(**self.remote.info))  # type: ignore[assignment]
            self.ready = True
            self.metrics.ready.set(1)
            log.info("front end pid %d ready", os.getpid())
            if self.repo is not None:
                self._start_routes()
        else:
            self.failure = self.remote.failure or "the engine process stopped"

    def _start_routes(self) -> None:
        assert self.repo is not None
        self.repo.warm_all()
        for vs in self.repo.records.values():
            for mv in vs.values():
                mv.engine = self.engine
        self.started = True
        self.repo.live(self.engine, self.sync_default)  # type: ignore[attr-defined]
        self.sync_default()

    def control(self, name: str, load: bool) -> None:
        """Repository load/unload: forwarded to the engine process (:meth:`RemoteRepository.control`)."""
        assert self.repo is not None
        try:
            self.repo.control(name, load)  # type: ignore[attr-defined]
        finally:
            self.sync_default()

    def check_workers(self) -> None:
        """Unready once the engine process is gone."""
        if self.remote is not None and self.remote.gone and not self.failure:
            self.ready = False
            self.failure = "the engine process stopped (see the server log); the server is exiting"
            self.metrics.ready.set(0)
            log.error("engine process gone; /readyz now answers 503")

    def shutdown(self) -> None:
        """Wait for the engine's answers to what was handed over, then release the slots."""
        self.ready = False
        links = list(self.repo.remotes.values()) if self.repo is not None else [self.remote]  # type: ignore
        for link in links:
            if link is not None:
                link.stop(drain=True, timeout=self.settings.timeout_s)
                link.pool.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
