"""Dynamic batching: images from many requests go to the engine together, on one dedicated thread.

Requests (on the event loop) append images to a bounded queue and await futures. A free inference thread
never holds a lone request while the engine is idle: when no other thread is running a batch it takes
what is queued at once. Only while another batch is in flight does it wait, until ``max_batch`` images
are queued, the oldest has waited ``max_wait_ms`` or the engine becomes idle; on an engine faster than
:data:`SIDE_BY_SIDE_MIN_S` per image it waits for more than two full batches' images queued and running
instead of ``max_batch``. It takes the largest
warmed-up batch size that fits, runs the engine and hands each row back to the loop. A batch taken with the
engine idle and nothing else queued runs on every core (``solo``) where the engine takes at least
:data:`SIDE_BY_SIDE_MIN_S` per image; on a faster one the event loop keeps the other cores. Images whose
request already gave up (deadline, disconnect) are skipped. ``stop(drain=True)`` finishes what is queued.
Counters for ``/v2/models/{m}/stats`` are kept in ``stats`` (:class:`~.stats.ModelStats`).

:class:`Batcher` implements :class:`~.batch_queue.BatchQueue`, the surface the request pipeline sees, in this
process.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .batch_queue import BatcherStoppedError, BatchQueue, QueueFullError, Result, settle
from .metrics import Metrics
from .stats import BatchPhases, ModelStats
from .tensors import stack

log = logging.getLogger("irpe.server")
_REQUESTS = itertools.count(1)
ENGINE_CALL_WAIT_S = 60.0  # past the drain timeout, how long stop() waits for engine calls already running
# A second batch starts beside a running one once max_batch images are queued where the engine takes at least this
# long per image; on a faster engine, once more than two full batches' images are queued and running: below it, the
# event loop that reads and answers every request needs the core more than a second engine call does, or a lone
# batch's run on every core (docs/design/greedy-batching.md).
SIDE_BY_SIDE_MIN_S = 0.001


@dataclass
class _Item:
    image: np.ndarray
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)
    request: int = 0  # which submit (request) the image belongs to
    first: bool = False  # the request's first image: Triton counts requests, not images


def _fail_reason(error: BaseException) -> str:
    """Triton's failure reason for a request that ended with ``error``."""
    if isinstance(error, (asyncio.CancelledError, asyncio.TimeoutError)):
        return "CANCELED"
    return "OTHER" if isinstance(error, BatcherStoppedError) else "BACKEND"


def _expire(items: list[_Item]) -> None:
    """A submit's timeout: its first unanswered image fails the wait with TimeoutError."""
    for item in items:
        if not item.future.done():
            item.future.set_exception(asyncio.TimeoutError())
            return


def _resolve_all(pairs: list[tuple[asyncio.Future, Result | None]], error: BaseException | None) -> None:
    for future, value in pairs:
        settle(future, value, error)


class Batcher(BatchQueue):
    """Bounded queue + ``workers`` inference threads around ``run(images) -> logits``.

    On a CPU, several workers each running a single-threaded session beat one worker with intra-op
    threads when decoding competes for the cores (no barrier between threads to stall on).
    """

    _deaths: ClassVar[int] = 0  # inference threads of any batcher in this process that ended while not stopping

    def __init__(self, run: Callable[[np.ndarray], np.ndarray], *, sizes: list[int], max_wait_ms: float,
                 max_queue: int, metrics: Metrics | None = None, workers: int = 1,
                 solo: Callable[[np.ndarray], np.ndarray] | None = None):
        self._run = run
        self._solo = solo  # a batch taken while the engine is idle and nothing else waits, on a slow engine: every core
        self.sizes = sorted(sizes)
        self.max_batch = self.sizes[-1]
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self._queue: collections.deque[_Item] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = 0  # batches in flight
        self._in_engine = 0  # images in those batches
        self._idle = 0  # inference threads waiting for a queued image
        self._filling = 0  # inference threads waiting to fill a batch while another one runs
        self._per_image_s = 0.0
        self.stats = ModelStats()
        self._dead = False  # set by an inference thread that ends while not stopping
        self._threads = [threading.Thread(target=self._thread, name=f"irpe-inference-{i}", daemon=True)
                         for i in range(max(1, workers))]

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called (the inference threads then end by design)."""
        return self._stopping

    @property
    def depth(self) -> int:
        """Images waiting now."""
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Requests none of whose images has started (Triton's pending request count)."""
        with self._cond:
            return sum(1 for i in self._queue if i.first and not i.future.done())

    def alive(self) -> bool:
        """False when an inference thread died (an error outside the engine call) while not stopping. A flag the
        thread sets as it ends: every request asks, and walking the threads' ``is_alive`` cost a lock each."""
        return self._stopping or not self._dead

    @staticmethod
    def any_thread_died() -> bool:
        """Whether an inference thread of any batcher in this process ended while not stopping (a cheap check
        before asking each batcher's :meth:`alive`)."""
        return Batcher._deaths > 0

    def start(self) -> None:
        """Start the inference thread(s)."""
        for t in self._threads:
            t.start()

    async def submit(self, images: list[np.ndarray], timeout: float | None = None) -> list[Result]:
        """Queue ``images`` (all or none) and wait for their results; cancel to give up. ``timeout``:
        ``asyncio.TimeoutError`` after that many seconds (the images are then skipped, as on cancel)."""
        loop = asyncio.get_running_loop()
        submitted = time.perf_counter()
        request = next(_REQUESTS)
        items = [_Item(x, loop.create_future(), loop, request=request) for x in images]
        items[0].first = True
        with self._cond:
            if self._stopping:
                raise BatcherStoppedError("server is shutting down")
            if len(self._queue) + len(items) > self.max_queue:
                self.stats.request(False, 0.0, "REJECTED")
                raise QueueFullError(self._retry_after())
            self._queue.extend(items)
            self.metrics.queue_depth.set(len(self._queue))
            if (self._idle and (not self._busy or self._slow_engine())) or \
                    ((self._idle or self._filling) and self._side_by_side()):
                self._cond.notify()  # one thread that acts on it: waking more costs GIL hand-offs per request
        timer = loop.call_later(timeout, _expire, items) if timeout is not None else None  # no wait_for task
        reason = ""
        try:
            if len(items) == 1:  # the common case: no gathering future
                return [await items[0].future]
            return list(await asyncio.gather(*(i.future for i in items)))
        except BaseException as e:
            reason = _fail_reason(e)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self.stats.request(not reason, time.perf_counter() - submitted, reason)
            for i in items:
                i.future.cancel()  # no-op when done; marks abandoned items so the thread skips them

    def _slow_engine(self) -> bool:
        """Whether the engine's recent time per image is at least :data:`SIDE_BY_SIDE_MIN_S` (or not yet known)."""
        return not self._per_image_s or self._per_image_s >= SIDE_BY_SIDE_MIN_S

    def _side_by_side(self) -> bool:
        """Whether a batch may start beside one that runs (lock held): ``max_batch`` images are queued, and the
        engine is slow (:meth:`_slow_engine`) or more than two full batches' images are queued or running. Two
        batches that hold every request leave the event loop idle until both end; on a fast engine the second
        one waits, and the loop answers the first while it runs."""
        queued = len(self._queue)
        if queued < self.max_batch:
            return False
        return self._slow_engine() or queued + self._in_engine > 2 * self.max_batch

    def _retry_after(self) -> int:
        return max(1, int(np.ceil(len(self._queue) * max(self._per_image_s, 0.001))))

    def _take(self, finished: int = 0) -> tuple[list[_Item], bool] | None:
        """Block until a batch is due: (the batch, whether it runs on every core: taken with the engine idle and
        nothing else queued, on a slow engine (:meth:`_slow_engine`)); None once stopping and empty (other
        workers may race us). ``finished``: the images of this thread's previous batch, now done (0: none); it
        is counted off here, in the same lock hold as the next take, and wakes nobody: this thread takes what is
        queued itself (see :meth:`_loop`)."""
        with self._cond:
            if finished:
                self._busy -= 1
                self._in_engine -= finished
            while True:
                while not self._queue:
                    if self._stopping:
                        return None
                    self._idle += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._idle -= 1
                self._wait_to_fill()
                while self._queue and self._queue[0].future.done():
                    self._queue.popleft()
                if self._queue:
                    break
            n = max(size for size in self.sizes if size <= len(self._queue))
            batch = [self._queue.popleft() for _ in range(n)]
            self.metrics.queue_depth.set(len(self._queue))
            # a fast engine's lone batch keeps its own core: the event loop, which reads and answers every
            # request, needs the other one more than the batch does (docs/design/greedy-batching.md)
            every_core = not self._busy and not self._queue and self._slow_engine()
            self._busy += 1
            self._in_engine += n
            return batch, every_core

    def _wait_to_fill(self) -> None:
        """Wait (lock held) while another batch runs, until max_batch images are queued (on an engine whose
        batches run side by side: :meth:`_side_by_side`), the oldest waited max_wait or the engine is idle; with
        the engine idle, return at once. A batch that ends does not wake this wait: its thread takes what is
        queued itself."""
        while self._queue and not self._stopping and self._busy and not self._side_by_side():
            remaining = self._queue[0].enqueued + self.max_wait - time.perf_counter()
            if remaining <= 0:
                return
            self._filling += 1  # a submit wakes this thread only once max_batch images are queued
            try:
                self._cond.wait(remaining)
            finally:
                self._filling -= 1

    def _thread(self) -> None:
        try:
            self._loop()
        finally:
            if not self._stopping:
                self._dead = True
                Batcher._deaths += 1

    def _loop(self) -> None:
        """Take and run batches until stopped. A thread whose batch ends takes the next one itself, without
        waking a thread that waits to fill: it is the one already running (its caches warm, holding the GIL),
        and the engine is not left idle, as it takes at once what is queued when no other batch runs. Waking
        the waiting threads there cost a wake-up and a GIL hand-off per batch for a thread that mostly found
        the images taken (docs/design/greedy-batching.md)."""
        finished = 0
        while (taken := self._take(finished)) is not None:
            batch, every_core = taken
            try:
                live = [i for i in batch if not i.future.done()]
                if live:
                    self._infer(live, self._solo if every_core and self._solo is not None else self._run)
            except BaseException:  # this thread ends: the others take over what is queued
                with self._cond:
                    self._busy -= 1
                    self._in_engine -= len(batch)
                    self._cond.notify_all()
                raise
            finished = len(batch)

    def _infer(self, batch: list[_Item], run: Callable[[np.ndarray], np.ndarray]) -> None:
        start = time.perf_counter()
        try:
            x = stack([i.image for i in batch])  # one image: a view, no copy
            stacked = time.perf_counter()
            out = run(x)
            error: BaseException | None = None
        except Exception as e:  # delivered to every request in the batch; the thread keeps going
            log.exception("inference failed for a batch of %d", len(batch))
            out = None
            error = e
            stacked = start
        took = time.perf_counter() - start
        self._per_image_s = 0.8 * self._per_image_s + 0.2 * took / len(batch) if self._per_image_s else \
            took / len(batch)
        m = self.metrics
        m.batch_size.observe(len(batch))
        m.inference.observe(took)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Result | None]]] = {}
        for k, item in enumerate(batch):
            m.queue_wait.observe(start - item.enqueued)
            res = None if out is None else Result(out[k], start - item.enqueued, took, len(batch))
            by_loop.setdefault(item.loop, []).append((item.future, res))
        for loop, pairs in by_loop.items():  # one wake-up per event loop and batch, not per image
            try:
                loop.call_soon_threadsafe(_resolve_all, pairs, error)
            except RuntimeError:  # the loop closed (shutdown past its drain timeout): nobody left to answer
                log.warning("dropped %d result(s): their event loop is closed", len(pairs))
        if error is None:
            done = time.perf_counter()
            firsts = [start - i.enqueued for i in batch if i.first]
            phases = BatchPhases(stack_s=stacked - start, infer_s=start + took - stacked,
                                 output_s=done - start - took)
            self.stats.batch(size=len(batch), queue_s=firsts, requests=len({i.request for i in batch}),
                             phases=phases)

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Stop taking work; with ``drain`` the queued images are still run, else they fail. Images still
        queued after ``timeout`` fail too; then every batch already in the engine is waited for (up to
        :data:`ENGINE_CALL_WAIT_S`): a process that exits while an engine call runs has ONNX Runtime's threads
        torn down under it (``terminate called without an active exception``, exit code 1 or SIGABRT)."""
        with self._cond:
            self._stopping = True
            if not drain:
                self._fail_queued()
            self._cond.notify_all()
        end = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, end - time.monotonic()))
        if not any(t.is_alive() for t in self._threads):
            return
        with self._cond:
            self._fail_queued()
        end = time.monotonic() + ENGINE_CALL_WAIT_S
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            log.warning("an inference thread is still in an engine call %gs after the drain timeout",
                        ENGINE_CALL_WAIT_S)

    def _fail_queued(self) -> None:
        """Fail every queued image (lock held): the server is shutting down."""
        for item in self._queue:
            if not item.loop.is_closed():
                item.loop.call_soon_threadsafe(settle, item.future, None,
                                               BatcherStoppedError("server is shutting down"))
        self._queue.clear()
