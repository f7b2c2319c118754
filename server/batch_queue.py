"""The surface the request pipeline sees of a model version's queue for the engine (:class:`BatchQueue`), its
errors and its results: :class:`~.batching.Batcher` implements it in this process, :class:`~.ipc.link.RemoteBatcher`
in the engine process of ``--frontends``."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from .stats import ModelStats


class QueueFullError(Exception):
    """The queue cannot take the images now; ``retry_after`` is a hint in seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"inference queue is full; retry in {retry_after}s")
        self.retry_after = retry_after


class BatcherStoppedError(Exception):
    """The batcher is shutting down and takes no new work."""


@dataclass
class Result:
    """One image's output row and where its time went."""

    logits: np.ndarray
    queue_s: float
    inference_s: float
    batch_size: int


class BatchQueue(ABC):
    """Where a model version's images wait for the engine: what the request pipeline and the hosts use
    (:class:`~.batching.Batcher` here, :class:`~.ipc.link.RemoteBatcher` across processes)."""

    max_queue: int
    stats: ModelStats

    @property
    @abstractmethod
    def depth(self) -> int:
        """Images waiting for inference."""

    @property
    @abstractmethod
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""

    @abstractmethod
    def alive(self) -> bool:
        """False once the queue can no longer answer (an inference thread died, the engine process left)."""

    @abstractmethod
    def start(self) -> None:
        """Start answering (before the first :meth:`submit`)."""

    @abstractmethod
    async def submit(self, images: list[np.ndarray], timeout: float | None = None) -> list[Result]:
        """Queue ``images`` for inference.

        Args:
            images: preprocessed float32 [3, H, W] arrays, one per image.
            timeout: seconds the request may still wait (None: no deadline).

        Returns:
            One result per image, in order.

        Raises:
            QueueFullError: the queue is full (503 with Retry-After).
            BatcherStoppedError: the queue stopped (503).
        """

    @abstractmethod
    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Stop taking work.

        Args:
            drain: run what is queued (else it fails).
            timeout: seconds to wait for it.
        """


def settle(future: asyncio.Future, value: object, error: BaseException | None) -> None:
    """Resolve a future unless it is already done (call it on the future's own loop).

    Args:
        future: the future.
        value: its result.
        error: its exception instead (None: the result).
    """
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
