"""Triton-style inference statistics, counted by the batcher (``GET /v2/models/{m}/stats``).

Counters and nanosecond durations follow Triton's ``ModelStatistics``: per request ``success``/``fail``
(submit to answer) and ``queue`` (enqueue to the start of its batch); per batch ``compute_input``
(stacking the images), ``compute_infer`` (the engine) and ``compute_output`` (handing rows back),
also broken down by batch size. Thread-safe: the inference threads and the event loop both write.
"""

from __future__ import annotations

import threading
import time
from typing import Any

_PHASES = ("compute_input", "compute_infer", "compute_output")


def _duration(count: int = 0, ns: int = 0) -> dict[str, int]:
    return {"count": count, "ns": ns}


class ModelStats:
    """Counters for one model version."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, list[int]] = {k: [0, 0] for k in ("success", "fail", "queue", *_PHASES)}
        self._by_batch: dict[int, dict[str, list[int]]] = {}
        self.inference_count = 0  # images
        self.execution_count = 0  # engine calls
        self.last_inference_ms = 0

    def request(self, ok: bool, seconds: float) -> None:
        """One request answered (``ok``) or failed, ``seconds`` after it was submitted."""
        with self._lock:
            self._add(self._totals["success" if ok else "fail"], 1, seconds)

    def batch(self, size: int, queue_s: list[float], phases: tuple[float, float, float]) -> None:
        """One engine call of ``size`` images: their queue waits, and the three phase durations."""
        with self._lock:
            self._add(self._totals["queue"], len(queue_s), sum(queue_s))
            per = self._by_batch.setdefault(size, {k: [0, 0] for k in _PHASES})
            for name, seconds in zip(_PHASES, phases, strict=True):
                self._add(self._totals[name], size, seconds * size)  # per image, each charged the batch time
                self._add(per[name], 1, seconds)
            self.inference_count += size
            self.execution_count += 1
            self.last_inference_ms = int(time.time() * 1000)

    @staticmethod
    def _add(slot: list[int], count: int, seconds: float) -> None:
        slot[0] += count
        slot[1] += int(seconds * 1e9)

    def to_triton(self, name: str, version: str = "1") -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list."""
        with self._lock:
            infer = {k: _duration(*v) for k, v in self._totals.items()}
            infer["cache_hit"], infer["cache_miss"] = _duration(), _duration()
            batches = [{"batch_size": size, **{k: _duration(*v) for k, v in per.items()}}
                       for size, per in sorted(self._by_batch.items())]
            return {"name": name, "version": version, "last_inference": self.last_inference_ms,
                    "inference_count": self.inference_count, "execution_count": self.execution_count,
                    "inference_stats": infer, "batch_stats": batches, "memory_usage": []}
