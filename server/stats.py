"""Triton-style inference statistics, counted by the batcher (``GET /v2/models/{m}/stats``).

Counters and nanosecond durations follow Triton's ``ModelStatistics``: per request (a 2-image request counts
once, as in Triton) ``success``/``fail`` (submit to answer), ``queue`` (enqueue to the start of its batch),
``compute_input`` (stacking the images), ``compute_infer`` (the engine) and ``compute_output`` (handing rows
back), each request charged its batch's time; per execution the same phases by batch size; ``inference_count``
counts images and ``execution_count`` engine calls. ``response_stats`` is empty, as Triton's for a model that
is not decoupled. Thread-safe: the inference threads and the event loop both write.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

PHASES = ("compute_input", "compute_infer", "compute_output")
FAIL_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")  # Triton's nv_inference_request_failure reasons


@dataclass(frozen=True)
class BatchPhases:
    """Where one engine call's time went, in seconds (Triton's compute phases)."""

    stack_s: float  # stacking the images (compute_input)
    infer_s: float  # the engine (compute_infer)
    output_s: float  # handing the rows back (compute_output)


def duration(count: int = 0, ns: int = 0) -> dict[str, int]:
    """A Triton ``StatisticDuration``: a count and its total nanoseconds."""
    return {"count": count, "ns": ns}


class ModelStats:
    """Counters for one model version."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, list[int]] = {k: [0, 0] for k in ("success", "fail", "queue", *PHASES)}
        self._by_batch: dict[int, dict[str, list[int]]] = {}
        self.inference_count = 0  # images
        self.execution_count = 0  # engine calls
        self.last_inference_ms = 0
        self._reasons = dict.fromkeys(FAIL_REASONS, 0)

    def request(self, ok: bool, seconds: float, reason: str = "OTHER") -> None:
        """Count one request.

        Args:
            ok: whether it was answered (else it failed).
            seconds: from its submit to its answer.
            reason: Triton's failure reason (``REJECTED``, ``CANCELED``, ``BACKEND``, ``OTHER``).
        """
        with self._lock:
            self._add(self._totals["success" if ok else "fail"], 1, seconds)
            if not ok:
                self._reasons[reason if reason in self._reasons else "OTHER"] += 1

    def batch(self, *, size: int, queue_s: list[float], requests: int, phases: BatchPhases) -> None:
        """Count one engine call. As in Triton, a request counts once (in the batch that starts it) and each
        request is charged the batch's time (a request split over batches: each of them).

        Args:
            size: the images in the call.
            queue_s: the waits of the requests that start in it.
            requests: the requests its images come from.
            phases: where the call's time went.
        """
        with self._lock:
            self._add(self._totals["queue"], len(queue_s), sum(queue_s))
            per = self._by_batch.setdefault(size, {k: [0, 0] for k in PHASES})
            for name, seconds in zip(PHASES, (phases.stack_s, phases.infer_s, phases.output_s), strict=True):
                self._add(self._totals[name], len(queue_s), seconds * requests)
                self._add(per[name], 1, seconds)
            self.inference_count += size
            self.execution_count += 1
            self.last_inference_ms = int(time.time() * 1000)

    @staticmethod
    def _add(slot: list[int], count: int, seconds: float) -> None:
        slot[0] += count
        slot[1] += int(seconds * 1e9)

    def to_triton(self, name: str, version: str = "1", reasons: bool = False) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list.

        Args:
            name: the model.
            version: the version.
            reasons: add ``fail_reasons``, failures by Triton's metric reason (``nv_inference_request_failure``).

        Returns:
            The entry.
        """
        with self._lock:
            infer = {k: duration(*v) for k, v in self._totals.items()}
            infer["cache_hit"] = duration()
            infer["cache_miss"] = duration()
            batches = [{"batch_size": size, **{k: duration(*v) for k, v in per.items()}}
                       for size, per in sorted(self._by_batch.items())]
            out = {"name": name, "version": version, "last_inference": self.last_inference_ms,
                   "inference_count": self.inference_count, "execution_count": self.execution_count,
                   "inference_stats": infer, "response_stats": {}, "batch_stats": batches, "memory_usage": []}
            if reasons:
                out["fail_reasons"] = dict(self._reasons)
            return out
