"""What a running app holds: settings, the model, the engine, the batcher, the decode pool, metrics."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from starlette.requests import Request

from irpe.artifact import ArtifactError, ModelArtifact

from .batching import Batcher, BatcherStoppedError, QueueFullError, Result
from .config import Settings
from .decode import PixelBudget, prepare, small_baseline_jpeg
from .engine import Engine
from .errors import APIError
from .memory import fix_mmap_threshold
from .metrics import Metrics
from .repository import ModelVersion, Repository

log = logging.getLogger("irpe.server")
_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+


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
    repo: Repository | None = None  # the models (None in a --frontends front end: one remote model)
    started: bool = False  # the startup warm-up is over (routes answer 503 before)
    inline_decode: bool = False  # small baseline JPEGs decode on the event loop (auto --decode-threads)
    waiting: str = ""  # why not ready without a failure (the default model is unloaded)
    _poller: threading.Thread | None = None
    _stop_poll: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.allowed_hosts = self.settings.host_allowlist()

    def load(self) -> None:
        """Scan the repository (or the one artifact directory), read every model.json and build the engines
        (fails fast when the default model cannot be loaded: missing files, checksum, GPU fallback, ...)."""
        s = self.settings
        fix_mmap_threshold()
        self.repo = Repository(Path(s.artifact_dir), s, self.metrics)
        self.repo.open(warm=False)
        name = self.repo.default_name()
        tried = self.repo.records.get(name, {})
        failed = [mv.reason for mv in tried.values() if mv.state == "UNAVAILABLE"]
        if not tried or failed and not any(mv.engine for mv in tried.values()):
            raise ArtifactError(failed[0] if failed else f"default model {name!r} is not in {s.artifact_dir} "
                                f"(models: {sorted(self.repo.dirs)}); fix --default-model")
        mv = max((m for m in tried.values() if m.engine is not None), key=lambda m: m.version)
        self.art, self.engine, self.batcher = mv.art, mv.engine, mv.batcher
        self.pool = ThreadPoolExecutor(s.resolved_decode_threads(), thread_name_prefix="irpe-decode")
        self.inline_decode = s.decode_threads == 0
        self.budget = PixelBudget(s.resolved_max_decode_pixels())

    def warm(self) -> None:
        """Warm every loaded version (every batch size once), start the batchers; ready when the default
        model is. With ``--model-control poll``, start watching the repository."""
        assert self.repo is not None
        try:
            self.repo.warm_all()
        finally:
            self.started = True
            self.sync_default()
        if not self.ready:
            name = self.repo.default_name()
            reasons = [mv.reason for mv in self.repo.records.get(name, {}).values() if mv.reason]
            self.failure = reasons[0] if reasons else "warm-up failed"
            log.error("the default model %s is not ready; the server stays unready", name)
            return
        log.info("ready: %s", self.repo.describe())
        if self.settings.model_control == "poll":
            self._poller = threading.Thread(target=self._poll, name="irpe-repository-poll", daemon=True)
            self._poller.start()

    def sync_default(self) -> None:
        """Point ``art``/``engine``/``batcher``/``ready`` at the default model's newest READY version."""
        assert self.repo is not None
        mv = self.repo.newest(self.repo.default_name())
        if mv is not None:
            self.art, self.engine, self.batcher = mv.art, mv.engine, mv.batcher
        self.ready = mv is not None
        self.waiting = "" if mv else f"default model {self.repo.default_name()!r} is not loaded"
        self.metrics.ready.set(1 if self.ready else 0)

    def _poll(self) -> None:
        assert self.repo is not None
        while not self._stop_poll.wait(self.settings.poll_interval_s):
            try:
                self.repo.poll()
            except Exception:  # a repository that cannot be read now: try again next time
                log.exception("polling the model repository failed")
            self.sync_default()

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload`` (blocking: run it in a thread)."""
        assert self.repo is not None
        mode = self.settings.model_control
        known = name in self.repo.dirs or name in self.repo.records
        if not known and not (load and mode == "explicit"):
            raise APIError(404, "model_not_found", f"Request for unknown model: '{name}' is not in the model "
                           f"repository {self.settings.artifact_dir} (models: {sorted(self.repo.dirs)})")
        if mode != "explicit":
            if load and self.repo.newest(name) is not None:
                return  # already loaded: a no-op, as before
            what = "load" if load else "unload"
            raise APIError(400, "unsupported", f"explicit model {what} is not allowed with --model-control "
                           f"{mode}; restart with --model-control explicit")
        try:
            self.repo.load(name) if load else self.repo.unload(name)
        except KeyError:
            raise APIError(404, "model_not_found", f"failed to load '{name}': no such model in the repository "
                           f"{self.settings.artifact_dir} (models: {sorted(self.repo.dirs)})") from None
        except ArtifactError as e:
            raise APIError(400, "load_failed", str(e)) from None
        finally:
            self.sync_default()

    def shutdown(self) -> None:
        """Drain the batchers (queued images still run), then stop the decode pool."""
        self.ready = False
        self._stop_poll.set()
        if self._poller is not None:
            self._poller.join(self.settings.timeout_s)
        if self.repo is not None:
            self.repo.shutdown(self.settings.timeout_s)
        elif self.batcher is not None:
            self.batcher.stop(drain=True, timeout=self.settings.timeout_s)
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    @contextmanager
    def use(self, name: str | None = None, version: str | None = None) -> Iterator[ModelVersion]:
        """The model version a request runs on, held until the request is answered (404 for an unknown
        model or version; 503 while the server is still warming up)."""
        if self.repo is None or not self.started:
            art, batcher = self.require_ready()
            if name not in (None, "", art.name) or version not in (None, "", "1"):
                raise APIError(404, "model_not_found", f"Request for unknown model: '{name}' version "
                               f"{version or '1'} is not found (this server serves {art.name!r} version 1)")
            yield ModelVersion(art.name, 1, Path(self.settings.artifact_dir), art, self.engine, batcher, "READY")
            return
        self.check_workers()
        with self.repo.acquire(name, version) as mv:
            self.repo.check_alive(mv)
            yield mv

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
        if self.repo is None:
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

    async def preprocess(self, blobs: list[bytes], deadline: float | None = None,
                         art: ModelArtifact | None = None) -> tuple[list[np.ndarray], float]:
        """Decode + preprocess every blob in the pool; the first failure fails all (the rest are not started).

        Fair share: one request has at most half the decode threads busy at once, so a many-image
        request does not hold the whole pool; every decode holds its pixels from the shared budget.
        ``art``: the model whose preprocessing applies (default: the default model)."""
        art = art or self.require_ready()[0]
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        s = self.settings
        if len(blobs) == 1:  # the common case: no semaphore, no task, at most one executor hop
            if self.inline_decode and small_baseline_jpeg(blobs[0]):  # no budget: one bounded decode at a time
                x, seconds = _timed_prepare(blobs[0], art, s, None, deadline)
            else:
                x, seconds = await loop.run_in_executor(self.pool, _timed_prepare, blobs[0], art, s, self.budget,
                                                        deadline)
            self.metrics.decode.observe(seconds)
            return [x], time.perf_counter() - start
        share = asyncio.Semaphore(max(1, getattr(self.pool, "_max_workers", 2) // 2))  # not usable_cpus(): file reads

        async def one(blob: bytes) -> tuple[np.ndarray, float]:
            if self.inline_decode and small_baseline_jpeg(blob):
                await asyncio.sleep(0)  # other requests get the loop between two images
                return _timed_prepare(blob, art, s, None, deadline)
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

    async def infer(self, arrays: list[np.ndarray], mv: ModelVersion | None = None) -> list[Result]:
        """Queue arrays for the batcher of ``mv`` (default: the default model's); 503 with Retry-After when
        the queue is full."""
        batcher = mv.batcher if mv is not None and mv.batcher is not None else self.require_ready()[1]
        try:
            results = await batcher.submit(arrays)
        except QueueFullError as e:
            raise APIError(503, "queue_full", str(e), {"Retry-After": str(e.retry_after)}) from None
        except BatcherStoppedError as e:
            raise APIError(503, "shutting_down", str(e), {"Retry-After": "1"}) from None
        self.metrics.images.inc(len(results))
        if self.repo is not None and mv is not None:
            self.repo.labeled.images.labels(mv.name, str(mv.version)).inc(len(results))
        return results

    async def with_deadline(self, coro: object, started: float) -> object:
        """Await ``coro`` within the request deadline (--timeout-s from ``started``); 504 after."""
        remaining = max(self.settings.timeout_s - (time.perf_counter() - started), 0.001)
        try:
            if _TIMEOUT is None:  # Python 3.10
                return await asyncio.wait_for(coro, remaining)  # type: ignore[arg-type]
            async with _TIMEOUT(remaining):  # in this task: no task per request, as wait_for makes
                return await coro  # type: ignore[misc]
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
