"""The request pipeline, the same in every process layout: admit, look up, preprocess, infer, deadline.

:class:`Service` is what every front end (HTTP, the engine link) calls. It holds the settings, the metrics,
the decode pool and pixel budget, the admission count, readiness, and one :class:`~..hosting.host.ModelHost`:
a :class:`~..hosting.local.LocalHost` (engines in this process) or a :class:`~..hosting.remote.RemoteHost`
(a ``--frontends`` front end: inference in the engine process). No protocol is known here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from irpe.artifact import ModelArtifact

from ..batching import BatcherStoppedError, QueueFullError, Result
from ..config import Settings
from ..errors import APIError
from ..hosting.host import NOT_STARTED, ModelHost, ModelVersion
from ..memory import fix_mmap_threshold
from ..metrics import Metrics
from .decode import INLINE_PIXELS, PixelBudget, inline_pixels, prepare
from .sysshm import SharedMemoryRegistry

log = logging.getLogger("irpe.server")
_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+


class InlineTurn:
    """Pixels decoded on the event loop in one loop iteration: at most ``cap``; the rest go to the pool."""

    def __init__(self, cap: int):
        self.cap, self.spent = cap, 0

    def take(self, pixels: int) -> bool:
        if self.spent + pixels > self.cap:
            return False
        if not self.spent:  # runs in the next loop iteration
            asyncio.get_running_loop().call_soon(self._reset)
        self.spent += pixels
        return True

    def _reset(self) -> None:
        self.spent = 0


@dataclass
class Service:
    """Shared by every request of a process (see the module docstring)."""

    settings: Settings
    host: ModelHost
    metrics: Metrics = field(default_factory=Metrics)
    decode_threads: int = 0  # the decode pool's size (0: --decode-threads resolved for this host)
    pool: ThreadPoolExecutor | None = None
    ready: bool = False
    failure: str = ""
    budget: PixelBudget | None = None
    admitted: int = 0  # images of /classify requests being decoded or queued (event-loop owned)
    allowed_hosts: frozenset[str] = frozenset()
    inline_decode: bool = False  # small baseline JPEGs decode on the event loop (auto --decode-threads)
    waiting: str = ""  # why not ready without a failure (the default model is unloaded)
    shm: SharedMemoryRegistry = field(init=False)  # client system shared memory (every front end's)
    turn: InlineTurn = field(default_factory=lambda: InlineTurn(2 * INLINE_PIXELS))
    _images: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False)  # labeled image counters

    def __post_init__(self) -> None:
        self.allowed_hosts = self.settings.host_allowlist()
        s = self.settings
        self.shm = SharedMemoryRegistry(s.allow_client_shm, s.max_shm_regions, int(s.max_shm_region_mb * 2**20),
                                        name_prefix=s.shm_name_prefix)
        self.host.subscribe(lambda leaving: self.refresh())

    @property
    def started(self) -> bool:
        return self.host.started

    def load(self) -> None:
        """Start the host (it fails fast when the default model cannot be served: missing files, checksum,
        GPU fallback, ...) and the decode pool."""
        s = self.settings
        fix_mmap_threshold()
        self.host.start()
        self.pool = ThreadPoolExecutor(self.decode_threads or s.resolved_decode_threads(),
                                       thread_name_prefix="irpe-decode")
        self.inline_decode = s.decode_threads == 0
        self.budget = PixelBudget(s.resolved_max_decode_pixels())

    def warm(self) -> None:
        """Warm the host up; ready when the default model is."""
        try:
            self.host.warm()
        finally:
            self.refresh()
        if not self.ready:
            self.failure = self.failure or self.host.startup_failure()
            log.error("the default model %s is not ready; the server stays unready", self.host.default_name())
            return
        log.info("ready: %s", self.host.describe())

    def refresh(self) -> None:
        """Ready while the default model has a READY version (after every change of the host)."""
        mv = self.host.newest(self.host.default_name()) if self.host.started else None
        self.ready = mv is not None
        self.waiting = "" if mv else f"default model {self.host.default_name()!r} is not loaded"
        self.metrics.ready.set(1 if self.ready else 0)

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload`` (blocking: run it in a thread)."""
        try:
            self.host.control(name, load)
        finally:
            self.refresh()

    def shutdown(self) -> None:
        """Drain the host (queued images still run), then stop the decode pool."""
        self.ready = False
        self.host.shutdown(self.settings.timeout_s)
        self.shm.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    @contextmanager
    def use(self, name: str | None = None, version: str | None = None) -> Iterator[ModelVersion]:
        """The model version a request runs on, held until the request is answered (404 for an unknown
        model or version; 503 while the server is still warming up)."""
        self.check_workers()
        if not self.started:
            self.require_ready()
        with self.host.acquire(name, version) as mv:
            yield mv

    def model(self, name: str, version: str | None = None) -> ModelVersion:
        """The served version a metadata request names (no version: the newest): 404 for a model the
        repository does not hold, even while warming up; 503 while warming up."""
        if self.started:
            return self.host.lookup(name, version)
        if not self.host.knows(name):
            self.host.lookup(name, version)  # the 404 that names what is served
        raise APIError(503, "not_ready", self.failure or NOT_STARTED, {"Retry-After": "1"})

    def check_workers(self) -> None:
        """A ready server whose inference cannot go on (a dead inference thread of the default model, a gone
        engine process) turns unready."""
        fatal = self.host.fatal() if self.ready else ""
        if fatal:
            self.ready = False
            self.failure = fatal
            self.metrics.ready.set(0)
            log.error("%s; /readyz now answers 503", fatal)

    def require_ready(self) -> None:
        """503 with Retry-After until warm-up is done."""
        self.check_workers()
        if not self.ready:
            raise APIError(503, "not_ready", self.failure or NOT_STARTED, {"Retry-After": "1"})

    def _default_art(self) -> ModelArtifact:
        self.require_ready()
        mv = self.host.newest(self.host.default_name())
        if mv is None or mv.art is None:
            raise APIError(503, "not_ready", self.waiting or NOT_STARTED, {"Retry-After": "1"})
        return mv.art

    def admit(self, n: int) -> None:
        """Count ``n`` images as admitted before any is decoded: 503 with Retry-After when the images
        being decoded or queued would pass --max-queue (a many-image request is refused, not decoded)."""
        if n > self.settings.max_queue:
            raise APIError(413, "too_many_files", f"{n} images in one request; the queue holds "
                           f"{self.settings.max_queue} (--max-queue)")
        if self.admitted + n > self.settings.max_queue:
            retry = max(1, self.admitted // 64)
            raise APIError(503, "queue_full", f"server busy: {self.admitted} image(s) being decoded or queued, "
                           f"limit {self.settings.max_queue} (--max-queue); retry in {retry}s",
                           {"Retry-After": str(retry)})
        self.admitted += n

    def release(self, n: int) -> None:
        """Undo :meth:`admit` once the images are answered (or failed)."""
        self.admitted = max(0, self.admitted - n)

    async def preprocess(self, blobs: list[bytes], art: ModelArtifact | None = None,
                         deadline: float | None = None) -> tuple[list[np.ndarray], float]:
        """Decode + preprocess every blob in the pool; the first failure fails all (the rest are not started).

        Fair share: one request has at most half the decode threads busy at once, so a many-image
        request does not hold the whole pool; every decode holds its pixels from the shared budget.
        ``art``: the model whose preprocessing applies (default: the default model's)."""
        art = art or self._default_art()
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        s = self.settings
        if len(blobs) == 1:  # the common case: no semaphore, no task, at most one executor hop
            if pixels := self._inline(blobs[0]):
                x, seconds = self._prepare_inline(blobs[0], art, pixels, deadline)
            else:
                x, seconds = await loop.run_in_executor(self.pool, _timed_prepare, blobs[0], art, s, self.budget,
                                                        deadline)
            self.metrics.decode.observe(seconds)
            return [x], time.perf_counter() - start
        share = asyncio.Semaphore(max(1, getattr(self.pool, "_max_workers", 2) // 2))  # not usable_cpus(): file reads

        async def one(blob: bytes) -> tuple[np.ndarray, float]:
            await asyncio.sleep(0)  # other requests get the loop between two images
            if pixels := self._inline(blob):
                return self._prepare_inline(blob, art, pixels, deadline)
            async with share:
                return await loop.run_in_executor(self.pool, _timed_prepare, blob, art, s, self.budget, deadline)

        tasks = [asyncio.ensure_future(one(b)) for b in blobs]
        try:
            done = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        for _, seconds in done:
            self.metrics.decode.observe(seconds)
        return [x for x, _ in done], time.perf_counter() - start

    def _inline(self, blob: bytes) -> int:
        """The pixels of ``blob`` when it decodes here on the event loop (:func:`.decode.inline_pixels`),
        taken from this loop iteration's share and from the pixel budget; 0: the decode pool."""
        pixels = inline_pixels(blob) if self.inline_decode else 0
        if not pixels or not self.turn.take(pixels):
            return 0
        return pixels if self.budget is None or self.budget.take_now(pixels) else 0

    def _prepare_inline(self, blob: bytes, art: ModelArtifact, pixels: int,
                        deadline: float | None) -> tuple[np.ndarray, float]:
        try:
            return _timed_prepare(blob, art, self.settings, None, deadline)
        finally:
            if self.budget is not None:
                self.budget.give(pixels)

    async def infer(self, arrays: list[np.ndarray], mv: ModelVersion, started: float | None = None) -> list[Result]:
        """Queue arrays for the batcher of ``mv`` (only ever that version's); 503 with Retry-After when the
        queue is full or the version was retired meanwhile. ``started``: 504 once --timeout-s has passed since
        then (the batcher's own timer: no asyncio.timeout per request)."""
        if mv.batcher is None:
            raise APIError(503, "not_ready", f"model '{mv.name}' version {mv.version} is not loaded",
                           {"Retry-After": "1"})
        try:
            results = await mv.batcher.submit(arrays, None if started is None else self._remaining(started))
        except QueueFullError as e:
            raise APIError(503, "queue_full", str(e), {"Retry-After": str(e.retry_after)}) from None
        except BatcherStoppedError as e:
            raise APIError(503, "shutting_down", str(e), {"Retry-After": "1"}) from None
        except asyncio.TimeoutError:
            raise self._timed_out() from None
        self.metrics.images.inc(len(results))
        key = (mv.name, mv.version)
        if (series := self._images.get(key)) is None:  # labels() locks and validates: look it up once
            series = self._images[key] = self.host.labeled.images.labels(mv.name, str(mv.version))
        series.inc(len(results))
        return results

    async def with_deadline(self, coro: object, started: float) -> object:
        """Await ``coro`` within the request deadline (--timeout-s from ``started``); 504 after."""
        remaining = self._remaining(started)
        try:
            if _TIMEOUT is None:  # Python 3.10
                return await asyncio.wait_for(coro, remaining)  # type: ignore[arg-type]
            async with _TIMEOUT(remaining):  # in this task: no task per request, as wait_for makes
                return await coro  # type: ignore[misc]
        except asyncio.TimeoutError:
            raise self._timed_out() from None

    def _remaining(self, started: float) -> float:
        return max(self.settings.timeout_s - (time.perf_counter() - started), 0.001)

    def _timed_out(self) -> APIError:
        return APIError(504, "timeout", f"request not answered within {self.settings.timeout_s:g}s (--timeout-s)")


def _timed_prepare(data: bytes, art: ModelArtifact, s: Settings, budget: PixelBudget | None,
                   deadline: float | None) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    if deadline is not None and start > deadline:  # the request gave up while this waited for a thread
        raise APIError(504, "timeout", f"request not answered within {s.timeout_s:g}s (--timeout-s)")
    x = prepare(data, art.preprocess, s.max_pixels, jpeg_draft=s.jpeg_draft, budget=budget, deadline=deadline,
                max_scans=s.max_jpeg_scans)
    return x, time.perf_counter() - start


def local_service(settings: Settings, metrics: Metrics | None = None) -> Service:
    """A Service over a :class:`~..hosting.local.LocalHost` (one process, or the engine process)."""
    from ..hosting.local import LocalHost

    metrics = metrics or Metrics()
    return Service(settings, LocalHost(settings, metrics), metrics)
