"""The request pipeline, the same in every process layout: admit, look up, preprocess, infer, deadline.

:class:`Service` is what every front end (HTTP, the engine link) calls. It holds the settings, the metrics,
the decode pool and pixel budget, the admission count, readiness (:class:`Readiness`), and one
:class:`~..hosting.host.ModelHost`: a :class:`~..hosting.local.LocalHost` (engines in this process) or a
:class:`~..hosting.remote.RemoteHost` (a ``--frontends`` front end: inference in the engine process). No
protocol is known here: the host allowlist lives in :mod:`..http.middleware`, client shared memory with the
front ends that register it (the HTTP app's, :func:`..http.shm_access.client_memory`, handed to the gRPC server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

import numpy as np

from irpe.artifact import ModelArtifact

from ..batch_queue import BatcherStoppedError, QueueFullError, Result
from ..config import Settings
from ..errors import APIError, not_ready, timed_out
from ..hosting.host import NOT_STARTED, ModelHost, ModelVersion
from ..memory import fix_mmap_threshold
from ..metrics import Metrics
from .decode import INLINE_PIXELS, InlineTurn, PixelBudget, inline_pixels, prepare_timed

log = logging.getLogger("irpe.server")
_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+
T = TypeVar("T")


class Readiness(Enum):
    """Where the server stands; :attr:`Service.reason` says why it is not READY."""

    STARTING = "starting"  # the default model is loading or warming up
    READY = "ready"  # the default model has a READY version
    UNLOADED = "unloaded"  # started, but the default model has no READY version (model control unloaded it)
    FAILED = "failed"  # warm-up failed, or inference cannot go on (an inference thread died, the engine left)
    STOPPING = "stopping"  # shutting down: the host drains


@dataclass
class Service:
    """Shared by every request of a process (see the module docstring)."""

    settings: Settings
    host: ModelHost
    metrics: Metrics = field(default_factory=Metrics)
    decode_threads: int = 0  # the decode pool's size (0: --decode-threads resolved for this host)
    pool: ThreadPoolExecutor | None = None
    readiness: Readiness = Readiness.STARTING
    reason: str = ""  # why not READY: the failure (FAILED) or the unloaded default model (UNLOADED)
    draining: bool = False  # stopping with --drain-s: /readyz answers 503 while requests are still served
    budget: PixelBudget | None = None
    admitted: int = 0  # images of /classify requests being decoded or queued (event-loop owned)
    inline_decode: bool = False  # small baseline JPEGs decode on the event loop (auto --decode-threads)
    turn: InlineTurn = field(default_factory=lambda: InlineTurn(2 * INLINE_PIXELS))
    _images: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False)  # labeled image counters
    ready_gate: Any = None  # () -> whether warm() logs "ready:" now (else the gate does, later); frontend.py

    def __post_init__(self) -> None:
        self.host.subscribe(lambda leaving: self.refresh())

    @property
    def started(self) -> bool:
        """Whether the host has started (its models are loaded, maybe not warm yet)."""
        return self.host.started

    @property
    def ready(self) -> bool:
        """Whether requests for the default model are served now."""
        return self.readiness is Readiness.READY

    @property
    def routable(self) -> bool:
        """Whether a load balancer should send new requests here (/readyz): ready and not draining."""
        return self.readiness is Readiness.READY and not self.draining

    def begin_drain(self) -> None:
        """Stopping with ``--drain-s``: /readyz turns 503 while requests are still accepted and served."""
        self.draining = True
        self.metrics.ready.set(0)

    @property
    def failure(self) -> str:
        """Why the server failed (FAILED), or ""."""
        return self.reason if self.readiness is Readiness.FAILED else ""

    def _become(self, readiness: Readiness, reason: str = "") -> None:
        self.readiness = readiness
        self.reason = reason

    def load(self) -> None:
        """Start the host (it fails fast when the default model cannot be served: missing files, checksum,
        GPU fallback, ...) and the decode pool."""
        settings = self.settings
        fix_mmap_threshold()
        self.host.start()
        self.pool = ThreadPoolExecutor(self.decode_threads or settings.resolved_decode_threads(),
                                       thread_name_prefix="irpe-decode")
        self.inline_decode = settings.decode_threads == 0
        self.budget = PixelBudget(settings.resolved_max_decode_pixels())

    def warm(self) -> None:
        """Warm the host up; ready when the default model is."""
        try:
            self.host.warm()
        finally:
            self.refresh()
        if not self.ready:
            self._become(Readiness.FAILED, self.failure or self.host.startup_failure())
            log.error("the default model %s is not ready; the server stays unready", self.host.default_name())
            return
        if self.ready_gate is None or self.ready_gate():
            log.info("ready: %s", self.host.describe())

    def refresh(self) -> None:
        """Ready while the default model has a READY version (after every change of the host); a failure
        stays until the default model serves again."""
        newest = self.host.newest(self.host.default_name()) if self.host.started else None
        if newest is not None:
            self._become(Readiness.READY)
        elif self.readiness is not Readiness.FAILED:
            self._become(Readiness.UNLOADED, f"default model {self.host.default_name()!r} is not loaded")
        self.metrics.ready.set(1 if self.routable else 0)

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload`` (blocking: run it in a thread).

        Args:
            name: the model.
            load: load it (else unload it).

        Raises:
            APIError: what the host refuses (unknown model, model control off, a failed load).
        """
        try:
            self.host.control(name, load)
        finally:
            self.refresh()

    def shutdown(self) -> None:
        """Drain the host (queued images still run), then stop the decode pool."""
        if self.ready:
            self._become(Readiness.STOPPING)
        self.host.shutdown(self.settings.timeout_s)
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    @contextmanager
    def use(self, name: str | None = None, version: str | None = None) -> Iterator[ModelVersion]:
        """The model version a request runs on, held until the request is answered.

        Args:
            name: the model (None: the default model).
            version: the version (None: the newest READY one).

        Yields:
            The version, held for the block.

        Raises:
            APIError: 404 for an unknown model or version; 503 while the server is still warming up.
        """
        self.check_workers()
        if not self.started:
            self.require_ready()
        with self.host.acquire(name, version) as model_version:
            ongoing = self.metrics.ongoing
            ongoing.inc()
            try:
                yield model_version
            finally:
                ongoing.dec()

    def model(self, name: str, version: str | None = None) -> ModelVersion:
        """The served version a metadata request names.

        Args:
            name: the model.
            version: the version (None: the newest).

        Returns:
            The version.

        Raises:
            APIError: 404 for a model the repository does not hold, even while warming up; 503 while warming up.
        """
        if self.started:
            return self.host.lookup(name, version)
        if not self.host.knows(name):
            self.host.lookup(name, version)  # the 404 that names what is served
        raise not_ready(self.failure or NOT_STARTED)

    def check_workers(self) -> None:
        """A ready server whose inference cannot go on (a dead inference thread of the default model, a gone
        engine process) turns unready."""
        fatal = self.host.fatal() if self.ready else ""
        if fatal:
            self._become(Readiness.FAILED, fatal)
            self.metrics.ready.set(0)
            log.error("%s; /readyz now answers 503", fatal)

    def require_ready(self) -> None:
        """503 with Retry-After until warm-up is done."""
        self.check_workers()
        if not self.ready:
            raise not_ready(self.failure or NOT_STARTED)

    def _default_artifact(self) -> ModelArtifact:
        self.require_ready()
        newest = self.host.newest(self.host.default_name())
        if newest is None or newest.artifact is None:
            unloaded = self.reason if self.readiness is Readiness.UNLOADED else ""
            raise not_ready(unloaded or NOT_STARTED)
        return newest.artifact

    def admit(self, images: int) -> None:
        """Count a request's images as admitted before any is decoded (a many-image request is refused, not
        decoded).

        Args:
            images: how many the request carries.

        Raises:
            APIError: 413 for more than --max-queue images; 503 with Retry-After when the images being decoded
                or queued would pass --max-queue.
        """
        if images > self.settings.max_queue:
            raise APIError(413, "too_many_files", f"{images} images in one request; the queue holds "
                           f"{self.settings.max_queue} (--max-queue)")
        if self.admitted + images > self.settings.max_queue:
            retry = max(1, self.admitted // 64)
            raise APIError(503, "queue_full", f"server busy: {self.admitted} image(s) being decoded or queued, "
                           f"limit {self.settings.max_queue} (--max-queue); retry in {retry}s",
                           {"Retry-After": str(retry)})
        self.admitted += images

    def release(self, images: int) -> None:
        """Undo :meth:`admit` once the images are answered (or failed)."""
        self.admitted = max(0, self.admitted - images)

    async def preprocess(self, blobs: list[bytes], artifact: ModelArtifact | None = None,
                         deadline: float | None = None) -> tuple[list[np.ndarray], float]:
        """Decode + preprocess every blob in the pool; the first failure fails all (the rest are not started).

        Fair share: one request has at most half the decode threads busy at once, so a many-image
        request does not hold the whole pool; every decode holds its pixels from the shared budget.

        Args:
            blobs: the encoded images.
            artifact: the model whose preprocessing applies (default: the default model's).
            deadline: the ``time.perf_counter()`` after which a decode not yet started is a 504.

        Returns:
            The model inputs, one per blob, and the seconds it all took.

        Raises:
            APIError: 4xx for an image that cannot be decoded, 503 before the default model serves, 504 past
                ``deadline``.
        """
        artifact = artifact or self._default_artifact()
        start = time.perf_counter()
        if len(blobs) == 1:  # the common case: no semaphore, no task, at most one executor hop
            timed = [await self._prepare_one(blobs[0], artifact, deadline)]
        else:
            timed = await self._prepare_many(blobs, artifact, deadline)
        for _, seconds in timed:
            self.metrics.decode.observe(seconds)
        return [array for array, _ in timed], time.perf_counter() - start

    async def _prepare_one(self, blob: bytes, artifact: ModelArtifact, deadline: float | None,
                           share: asyncio.Semaphore | None = None) -> tuple[np.ndarray, float]:
        """One image, decoded here on the event loop (:meth:`_inline`) or in the pool (within ``share``)."""
        if pixels := self._inline(blob):
            return self._prepare_inline(blob, artifact, pixels, deadline)
        async with share if share is not None else contextlib.nullcontext():
            return await asyncio.get_running_loop().run_in_executor(
                self.pool, prepare_timed, blob, artifact, self.settings, self.budget, deadline)

    async def _prepare_many(self, blobs: list[bytes], artifact: ModelArtifact,
                            deadline: float | None) -> list[tuple[np.ndarray, float]]:
        """Every image of a many-image request, at most half the pool's threads at once."""
        share = asyncio.Semaphore(max(1, getattr(self.pool, "_max_workers", 2) // 2))  # not usable_cpus(): file reads

        async def one(blob: bytes) -> tuple[np.ndarray, float]:
            await asyncio.sleep(0)  # other requests get the loop between two images
            return await self._prepare_one(blob, artifact, deadline, share)

        tasks = [asyncio.ensure_future(one(blob)) for blob in blobs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    def _inline(self, blob: bytes) -> int:
        """The pixels of ``blob`` when it decodes here on the event loop (:func:`.decode.inline_pixels`),
        taken from this loop iteration's share and from the pixel budget; 0: the decode pool."""
        pixels = inline_pixels(blob) if self.inline_decode else 0
        if not pixels or not self.turn.take(pixels):
            return 0
        return pixels if self.budget is None or self.budget.take_now(pixels) else 0

    def _prepare_inline(self, blob: bytes, artifact: ModelArtifact, pixels: int,
                        deadline: float | None) -> tuple[np.ndarray, float]:
        try:
            return prepare_timed(blob, artifact, self.settings, None, deadline)
        finally:
            if self.budget is not None:
                self.budget.give(pixels)

    async def infer(self, arrays: list[np.ndarray], model_version: ModelVersion,
                    started: float | None = None) -> list[Result]:
        """Queue arrays for the batcher of ``model_version`` (only ever that version's).

        Args:
            arrays: the preprocessed images.
            model_version: the version the request holds (:meth:`use`).
            started: when the request started: 504 once --timeout-s has passed since then (the batcher's own
                timer: no asyncio.timeout per request); None: no deadline here.

        Returns:
            One result per array.

        Raises:
            APIError: 503 with Retry-After when the queue is full, the server is stopping or the version was
                retired meanwhile; 504 past the deadline.
        """
        if model_version.batcher is None:
            raise not_ready(f"model '{model_version.name}' version {model_version.version} is not loaded")
        timeout = None if started is None else self._remaining(started)
        try:
            results = await model_version.batcher.submit(arrays, timeout)
        except QueueFullError as e:
            raise APIError(503, "queue_full", str(e), {"Retry-After": str(e.retry_after)}) from None
        except BatcherStoppedError as e:
            raise APIError(503, "shutting_down", str(e), {"Retry-After": "1"}) from None
        except asyncio.TimeoutError:
            raise timed_out(self.settings.timeout_s) from None
        self._count_images(model_version, len(results))
        return results

    def _count_images(self, model_version: ModelVersion, count: int) -> None:
        self.metrics.images.inc(count)
        key = (model_version.name, model_version.version)
        if (series := self._images.get(key)) is None:  # labels() locks and validates: look it up once
            labeled = self.host.labeled.images
            series = self._images[key] = labeled.labels(model_version.name, str(model_version.version))
        series.inc(count)

    async def with_deadline(self, work: Awaitable[T], started: float) -> T:
        """Await ``work`` within the request deadline.

        Args:
            work: what the request waits for.
            started: when the request started (``time.perf_counter()``); --timeout-s counts from then.

        Returns:
            What ``work`` returns.

        Raises:
            APIError: 504 once the deadline passes.
        """
        remaining = self._remaining(started)
        try:
            if _TIMEOUT is None:  # Python 3.10
                return await asyncio.wait_for(work, remaining)
            async with _TIMEOUT(remaining):  # in this task: no task per request, as wait_for makes
                return await work
        except asyncio.TimeoutError:
            raise timed_out(self.settings.timeout_s) from None

    def _remaining(self, started: float) -> float:
        return max(self.settings.timeout_s - (time.perf_counter() - started), 0.001)


def local_service(settings: Settings, metrics: Metrics | None = None) -> Service:
    """A Service over a :class:`~..hosting.local.LocalHost` (one process, or the engine process).

    Args:
        settings: the server's settings.
        metrics: the process's metrics (default: new ones).

    Returns:
        The service, not yet loaded (:meth:`Service.load`).
    """
    from ..hosting.local import LocalHost

    metrics = metrics or Metrics()
    return Service(settings, LocalHost(settings, metrics), metrics)
