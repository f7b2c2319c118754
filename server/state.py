"""What a running app holds: settings, the model, the engine, the batcher, the decode pool, metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from starlette.requests import Request

from irpe.artifact import ModelArtifact, load_artifact

from .batching import Batcher, BatcherStoppedError, QueueFullError, Result
from .config import Settings
from .decode import PixelBudget, prepare
from .engine import Engine, load_engine, warm_up
from .errors import APIError
from .memory import fix_mmap_threshold
from .metrics import Metrics

log = logging.getLogger("irpe.server")


@dataclass
class ServerState:
    """Shared by every route through ``app.state.irpe``."""

    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    art: ModelArtifact | None = None
    engine: Engine | None = None
    batcher: Batcher | None = None
    pool: ThreadPoolExecutor | None = None
    ready: bool = False
    failure: str = ""
    budget: PixelBudget | None = None
    admitted: int = 0  # images of /classify requests being decoded or queued (event-loop owned)
    allowed_hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.allowed_hosts = self.settings.host_allowlist()

    def load(self) -> None:
        """Read model.json and build the engine (fails fast: missing files, GPU fallback, ...)."""
        s = self.settings
        fix_mmap_threshold()
        self.art = load_artifact(Path(s.artifact_dir))
        self.engine = load_engine(s.artifact_dir, self.art, backend=s.backend, device=s.device,
                                  threads=s.resolved_threads(), max_batch=s.resolved_max_batch(),
                                  precision=s.precision, streams=s.resolved_inference_threads())
        info = self.engine.info
        log.info("model %s: backend %s (%s) on %s, providers in use %s, batch sizes %s, %d inference thread(s) "
                 "x %d intra-op thread(s)", self.art.name, info.backend, info.precision, info.device, info.providers,
                 info.batch_sizes, s.resolved_inference_threads(), s.resolved_threads())
        self.pool = ThreadPoolExecutor(s.resolved_decode_threads(), thread_name_prefix="irpe-decode")
        self.budget = PixelBudget(s.resolved_max_decode_pixels())
        self.batcher = Batcher(self.engine.run, sizes=info.batch_sizes, max_wait_ms=s.max_wait_ms,
                               max_queue=s.max_queue, metrics=self.metrics,
                               workers=s.resolved_inference_threads())

    def warm(self) -> None:
        """Run every batch size once, then start the batcher and report ready."""
        assert self.engine is not None and self.art is not None and self.batcher is not None
        try:
            took = warm_up(self.engine, self.art)
        except Exception as e:
            self.failure = f"warm-up failed: {e}"
            log.exception("warm-up failed; the server stays unready")
            return
        self.batcher.start()
        self.ready = True
        self.metrics.ready.set(1)
        log.info("warm-up of batch sizes %s took %.2fs; ready", self.engine.info.batch_sizes, took)

    def shutdown(self) -> None:
        """Drain the batcher (queued images still run), then stop the decode pool."""
        self.ready = False
        if self.batcher is not None:
            self.batcher.stop(drain=True, timeout=self.settings.timeout_s)
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def check_workers(self) -> None:
        """A ready server whose inference thread died (an error outside the engine call) turns unready."""
        if self.batcher is None or self.batcher.stopping:  # threads that end on stop() did not die
            return
        threads = getattr(self.batcher, "_threads", [])
        if self.ready and any(t.ident is not None and not t.is_alive() for t in threads):
            self.ready = False
            self.failure = "an inference worker thread stopped (see the server log); restart the server"
            self.metrics.ready.set(0)
            log.error("inference worker thread died; /readyz now answers 503")

    def require_ready(self) -> tuple[ModelArtifact, Batcher]:
        """(model, batcher), or 503 with Retry-After until warm-up is done."""
        self.check_workers()
        if not self.ready or self.art is None or self.batcher is None:
            detail = self.failure or "model is loading / warming up"
            raise APIError(503, "not_ready", detail, {"Retry-After": "1"})
        return self.art, self.batcher

    def admit(self, n: int) -> None:
        """Count ``n`` images as admitted before any is decoded: 503 with Retry-After when the images
        being decoded or queued would pass --max-queue (a many-image request is refused, not decoded)."""
        self.require_ready()
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

    async def preprocess(self, blobs: list[bytes], deadline: float | None = None) -> tuple[list[np.ndarray], float]:
        """Decode + preprocess every blob in the pool; the first failure fails all (the rest are not started).

        Fair share: one request has at most half the decode threads busy at once, so a many-image
        request does not hold the whole pool; every decode holds its pixels from the shared budget."""
        art, _ = self.require_ready()
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        s = self.settings
        if len(blobs) == 1:  # the common case: no semaphore, no task, one executor hop
            x, seconds = await loop.run_in_executor(self.pool, _timed_prepare, blobs[0], art, s, self.budget, deadline)
            self.metrics.decode.observe(seconds)
            return [x], time.perf_counter() - start
        share = asyncio.Semaphore(max(1, getattr(self.pool, "_max_workers", 2) // 2))  # not usable_cpus(): file reads

        async def one(blob: bytes) -> tuple[np.ndarray, float]:
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

    async def infer(self, arrays: list[np.ndarray]) -> list[Result]:
        """Queue arrays for the batcher; 503 with Retry-After when the queue is full."""
        _, batcher = self.require_ready()
        try:
            results = await batcher.submit(arrays)
        except QueueFullError as e:
            raise APIError(503, "queue_full", str(e), {"Retry-After": str(e.retry_after)}) from None
        except BatcherStoppedError as e:
            raise APIError(503, "shutting_down", str(e), {"Retry-After": "1"}) from None
        self.metrics.images.inc(len(results))
        return results

    async def with_deadline(self, coro: object, started: float) -> object:
        """Await ``coro`` within the request deadline (--timeout-s from ``started``); 504 after."""
        remaining = self.settings.timeout_s - (time.perf_counter() - started)
        try:
            return await asyncio.wait_for(coro, max(remaining, 0.001))  # type: ignore[arg-type]
        except asyncio.TimeoutError:
            raise APIError(504, "timeout", f"request not answered within {self.settings.timeout_s:g}s "
                           "(--timeout-s)") from None


def _timed_prepare(data: bytes, art: ModelArtifact, s: Settings, budget: PixelBudget | None,
                   deadline: float | None) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    if deadline is not None and start > deadline:  # the request gave up while this waited for a thread
        raise APIError(504, "timeout", f"request not answered within {s.timeout_s:g}s (--timeout-s)")
    x = prepare(data, art.preprocess, s.max_pixels, jpeg_draft=s.jpeg_draft, budget=budget, deadline=deadline,
                max_scans=s.max_jpeg_scans)
    return x, time.perf_counter() - start


def get_state(request: Request) -> ServerState:
    """The ServerState of the app serving ``request``."""
    return request.app.state.irpe
