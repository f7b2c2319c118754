"""What a :class:`~.local.LocalHost` runs on: fair inference slots, each version's batcher, the poll thread.

All batchers share one :class:`InferenceSlots`: at most ``--inference-threads`` engine calls run at once,
granted first come first served, so a model whose queue is always full takes turns with a quiet one
instead of starving it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import numpy as np

from ..batching import Batcher
from ..config import Settings
from ..engines import Engine
from ..metrics import Metrics
from ..worker_stats import shared_stats
from .version import ModelVersion

log = logging.getLogger("irpe.server")


class InferenceSlots:
    """At most ``count`` engine calls at once across every model, granted in arrival order (fair share)."""

    def __init__(self, count: int):
        """Every slot free.

        Args:
            count: the most engine calls that run at once (``--inference-threads``).
        """
        self._free = count
        self._line: collections.deque[object] = collections.deque()
        self._cond = threading.Condition()

    def wrap(self, run: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        """``run`` that waits its turn for a slot.

        Args:
            run: an engine call, images -> logits.

        Returns:
            The same call, made once a slot is free and every earlier caller has had one.
        """
        def gated(images: np.ndarray) -> np.ndarray:
            with self._cond:
                if self._free > 0 and not self._line:  # nobody before us: no ticket, no wait, nobody to wake
                    self._free -= 1
                else:
                    self._queue_for_slot()
            try:
                return run(images)
            finally:
                with self._cond:
                    self._free += 1
                    if self._line:
                        self._cond.notify_all()
        return gated

    def _queue_for_slot(self) -> None:
        """Wait (lock held) for a free slot and this caller's turn in the line; take the slot."""
        ticket = object()
        self._line.append(ticket)
        self._cond.wait_for(lambda: self._free > 0 and self._line[0] is ticket)
        self._line.popleft()
        self._free -= 1
        self._cond.notify_all()  # the next in line may have a slot too


def make_batcher(engine: Engine, settings: Settings, slots: InferenceSlots, metrics: Metrics, *,
                 max_queue: int, stats_key: tuple[str, int] | None = None) -> Batcher:
    """The batcher of one version, not yet started.

    Args:
        engine: the version's engine (``run``, and ``run_solo`` where it has one).
        settings: the server's settings (batch wait, queue bound, inference threads).
        slots: the slots every engine call waits its turn for.
        metrics: where the batcher's series go.
        max_queue: the model's own queue bound (config.json; 0: ``--max-queue``).
        stats_key: (model, version), for statistics summed over ``--workers N``'s processes
            (:mod:`..worker_stats`); None, or outside ``--workers N``: this process's own.

    Returns:
        A :class:`~..batching.Batcher` over the engine's batch sizes.
    """
    solo = getattr(engine, "run_solo", None)
    batcher = Batcher(slots.wrap(engine.run), sizes=engine.info.batch_sizes, max_wait_ms=settings.max_wait_ms,
                      max_queue=max_queue or settings.max_queue, metrics=metrics,
                      workers=settings.resolved_inference_threads(), solo=solo and slots.wrap(solo))
    if stats_key is not None and (shared := shared_stats(*stats_key, batcher.sizes)) is not None:
        batcher.stats = shared
    return batcher


def log_engine(model_version: ModelVersion, settings: Settings) -> None:
    """Log the startup line of one version: what runs it and how.

    Args:
        model_version: a version whose engine is built.
        settings: the server's settings (thread counts).
    """
    info = model_version.info
    assert info is not None
    log.info("model %s version %d: backend %s (%s) on %s, providers in use %s%s, batch sizes %s, %d inference "
             "thread(s) x %d intra-op thread(s)", model_version.name, model_version.version, info.backend,
             info.precision, info.device, info.providers, f", custom ops {info.custom_ops}" if info.custom_ops else "",
             info.batch_sizes, settings.resolved_inference_threads(), settings.resolved_threads())


class RepositoryPoller:
    """``--model-control poll``: rescan the repository every ``--poll-interval`` seconds on a thread of its own."""

    def __init__(self, poll: Callable[[], None], interval_s: float):
        """Not started yet.

        Args:
            poll: one rescan (:meth:`~.local.LocalHost.poll`).
            interval_s: seconds between rescans.
        """
        self._poll = poll
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the poll thread (a daemon)."""
        self._thread = threading.Thread(target=self._run, name="irpe-repository-poll", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop polling; wait for a rescan under way to end.

        Args:
            timeout: the most seconds to wait for it.
        """
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._poll()
            except Exception:  # a repository that cannot be read now: try again next time
                log.exception("polling the model repository failed")
