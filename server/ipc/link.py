"""A front end's one connection to the engine process of ``--frontends``.

:class:`EngineLink` carries everything: images, copied into shared-memory slots (:mod:`.slots`, one pool per
crop size) of which only the numbers cross the socket; the engine's status pushes (the route table a
:class:`~..hosting.remote.RemoteHost` applies, then acknowledges); and the control and statistics
round trips. A reader thread resolves each request's future when the engine answers and frees its slots.
:class:`RemoteBatcher` is one model version's :class:`~..batch_queue.BatchQueue` over the link. If the engine
process goes away, every waiting request gets 503 and the host turns the server unready.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..batch_queue import BatcherStoppedError, BatchQueue, QueueFullError, Result, settle
from ..hosting.remote import Channel
from ..stats import ModelStats
from . import wire
from .slots import SlotPool

STATS_TIMEOUT_S = 2.0


class EngineGoneError(BatcherStoppedError):
    """The engine process closed the connection (crashed or stopped)."""


class EngineLink(Channel):
    """Images, status and control between this front end and the engine process (module docstring)."""

    def __init__(self, path: str, slots: int, timeout_s: float):
        self.path = path
        self.slot_count = slots
        self.timeout_s = timeout_s
        self.pools: dict[int, SlotPool] = {}  # crop size -> slots
        self.gone = False
        self.status: dict[str, Any] | None = None  # the engine's last status frame
        self.on_status: Callable[[dict[str, Any]], None] | None = None  # the host applies each status
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future, SlotPool, list[int]]] = {}
        self._replies: dict[int, dict[str, Any] | None] = {}
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._send = threading.Lock()
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    @property
    def depth(self) -> int:
        """Images handed to the engine and not yet answered."""
        return sum(p.slots - p.free for p in self.pools.values())

    def connect(self, timeout: float = 300.0) -> None:
        """Connect (the engine may still be loading: no socket yet), say hello, start the reader. A socket
        that refuses for seconds means the engine is gone."""
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
        sock.sendall(wire.pack({"op": wire.HELLO, "pid": os.getpid()}))
        for pool in self.pools.values():
            sock.sendall(wire.pack({"op": wire.ATTACH, **pool.describe()}))
        self._sock = sock
        self._reader = threading.Thread(target=self._read, name="irpe-engine-link", daemon=True)
        self._reader.start()

    def wait_status(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until the engine is ready (and has sent its route table), failed or gone; its status."""
        def settled() -> bool:
            st = self.status or {}
            return self.gone or bool(st.get("failure")) or bool(st.get("ready") and "table" in st)

        with self._cond:
            self._cond.wait_for(settled, timeout)
            return self.status

    def pool(self, crop: int) -> SlotPool:
        """The slots for images of ``crop`` pixels, announced to the engine on first use."""
        with self._send:
            if crop not in self.pools:
                pool = SlotPool(self.slot_count, (3, crop, crop))
                if self._sock is not None:
                    self._sock.sendall(wire.pack({"op": wire.ATTACH, **pool.describe()}))
                self.pools[crop] = pool
            return self.pools[crop]

    async def submit(self, images: list[np.ndarray], crop: int, route: dict[str, str],
                     timeout: float | None = None) -> list[Result]:
        """Hand ``images`` to the engine (all or none) for the model version ``route`` names; their results.
        ``timeout``: what is left of the request's deadline (default: the whole ``--timeout-s``), which the
        engine's batcher enforces (504)."""
        if self.gone or self._sock is None:
            raise EngineGoneError("the engine process is not running")
        pool = self.pool(crop)
        slots = pool.put(images)
        if slots is None:
            raise QueueFullError(1)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        rid = next(self._ids)
        self._pending[rid] = (loop, future, pool, slots)
        try:
            with self._send:
                self._sock.sendall(wire.pack({"id": rid, "shm": pool.name, "slots": slots,
                                              "timeout": self.timeout_s if timeout is None else timeout, **route}))
        except OSError:
            self._finish(rid)
            raise EngineGoneError("the engine process is not running") from None
        head, data = await future
        return wire.answer_results(head, data)

    def request(self, head: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send a control or statistics frame and wait (blocking) for the engine's reply to it."""
        if self.gone or self._sock is None:
            raise EngineGoneError("the engine process is not running")
        rid = next(self._ids)
        with self._cond:
            self._replies[rid] = None
        try:
            with self._send:
                self._sock.sendall(wire.pack({**head, "rid": rid}))
            with self._cond:
                self._cond.wait_for(lambda: self._replies[rid] is not None or self.gone, timeout)
                reply = self._replies[rid]
        finally:
            with self._cond:
                self._replies.pop(rid, None)
        if reply is None:
            raise EngineGoneError("the engine process did not answer the repository request")
        return reply

    def control(self, name: str, load: bool, timeout: float) -> None:
        """A repository load / unload, done by the engine process (blocking); its error, raised here."""
        wire.raise_error(self.request({"op": wire.CONTROL, "name": name, "load": load}, timeout))

    def _finish(self, rid: int) -> tuple[asyncio.AbstractEventLoop, asyncio.Future] | None:
        entry = self._pending.pop(rid, None)
        if entry is None:
            return None
        entry[2].release(entry[3])
        return entry[0], entry[1]

    def _read(self) -> None:
        """Reader thread: status frames, replies and answers, until the engine hangs up."""
        assert self._sock is not None
        try:
            while (frame := wire.recv_frame(self._sock)) is not None:
                head, data = frame
                if head.get("op") == wire.STATUS:
                    self._on_status(head)
                elif head.get("op") == wire.REPLY:
                    with self._cond:
                        self._replies[head["rid"]] = head
                        self._cond.notify_all()
                elif (entry := self._finish(head["id"])) is not None:
                    entry[0].call_soon_threadsafe(settle, entry[1], (head, data), None)
        except OSError:
            pass
        self._on_gone()

    def _on_status(self, head: dict[str, Any]) -> None:
        """Apply a status (the host's route table), then acknowledge it: the engine may now go on."""
        if self.on_status is not None and "table" in head:
            self.on_status(head)
        with self._cond:
            self.status = head
            self._cond.notify_all()
        if "seq" in head:
            try:
                with self._send:
                    self._sock.sendall(wire.pack({"op": wire.ACK, "seq": head["seq"]}))  # type: ignore[union-attr]
            except OSError:
                pass

    def _on_gone(self) -> None:
        with self._cond:
            self.gone = True
            self._cond.notify_all()
        for rid in list(self._pending):
            entry = self._finish(rid)
            if entry is not None:
                error = EngineGoneError("the engine process stopped before answering")
                try:
                    entry[0].call_soon_threadsafe(settle, entry[1], None, error)
                except RuntimeError:  # the loop closed
                    pass

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Wait (with ``drain``) until every handed-over image is answered, hang up, free the slots."""
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
        for pool in self.pools.values():
            pool.close()

    def batcher(self, name: str, version: int, crop: int, max_queue: int) -> RemoteBatcher:
        """The queue of one model version over this link."""
        return RemoteBatcher(self, crop, {"model": name, "version": str(version)}, max_queue)



class RemoteStats(ModelStats):
    """/v2 statistics of one model version, counted by the engine over every front end; this front end's
    own counters when the engine does not answer within ``STATS_TIMEOUT_S``."""

    def __init__(self, link: EngineLink, route: dict[str, str]):
        super().__init__()
        self.link = link
        self.route = route

    def to_triton(self, name: str, version: str = "1", reasons: bool = False) -> dict[str, Any]:
        try:
            reply = self.link.request({"op": wire.STATS, **self.route}, timeout=STATS_TIMEOUT_S)
        except (OSError, EngineGoneError):  # no answer in time, or no engine: this front end's own counters
            reply = {}
        if reply.get("stats"):
            out = {**reply["stats"], "name": name, "version": version}
            if not reasons:
                out.pop("fail_reasons", None)
            return out
        return super().to_triton(name, version, reasons)


class RemoteBatcher(BatchQueue):
    """A :class:`~..batch_queue.BatchQueue` whose queue is the engine process's batcher of one model version."""

    def __init__(self, link: EngineLink, crop: int, route: dict[str, str], max_queue: int):
        self.link = link
        self.crop = crop
        self.route = route
        self.max_queue = max_queue
        self.stats = RemoteStats(link, route)
        self._stopping = False
        self._in_flight = 0  # this version's images sent and not answered (event-loop owned)

    @property
    def depth(self) -> int:
        """Images this front end has handed to the engine for this version and not yet got back."""
        return self._in_flight

    @property
    def stopping(self) -> bool:
        return self._stopping

    def alive(self) -> bool:
        """Always: the engine process's own end is the host's concern (``RemoteHost.fatal``)."""
        return True

    def start(self) -> None:
        """Nothing to start: the engine runs the batches."""

    async def submit(self, images: list[np.ndarray], timeout: float | None = None) -> list[Result]:
        """Run ``images`` on this model version in the engine process; ``timeout``: what is left of the
        request's deadline, sent along for the engine's batcher to enforce (504)."""
        started = time.perf_counter()
        ok = False
        self._in_flight += len(images)
        try:
            results = await self.link.submit(images, self.crop, self.route, timeout)
            ok = True
            return results
        finally:
            self._in_flight -= len(images)
            self.stats.request(ok, time.perf_counter() - started)

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """The link is stopped by the host's shutdown."""
        self._stopping = True
