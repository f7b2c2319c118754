"""Triton's statistics and metrics meaning: a request counts once in queue/compute whatever its image count,
executions and images are counted apart, failures carry Triton's reason, and ``nv_inference_*`` shows the same
numbers with Triton's names, types and labels."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from irpe.server.batch_queue import QueueFullError
from irpe.server.batching import Batcher
from irpe.server.metrics import triton_exposition
from tests.server.test_batching import Recorder


def _run(batcher: Batcher, *requests: int) -> None:
    async def main() -> None:
        for n in requests:
            await batcher.submit([np.ones(2, np.float32)] * n)

    asyncio.run(main())


def test_a_request_counts_once_whatever_its_images() -> None:
    batcher = Batcher(Recorder(), sizes=[1, 2, 4], max_wait_ms=1, max_queue=4)
    batcher.start()
    try:
        _run(batcher, 2, 1, 3)  # 3 images: a batch of 2 and one of 1 (the batcher's sizes)
        with pytest.raises(QueueFullError):
            _run(batcher, 5)
    finally:
        batcher.stop()
    stats = batcher.stats.to_triton("m", "1", reasons=True)
    infer = stats["inference_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (6, 4)
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert infer[key]["count"] == 3, key
    assert infer["fail"]["count"] == 1 and stats["fail_reasons"] == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0,
                                                                      "OTHER": 0}
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == 4
    assert {b["batch_size"] for b in stats["batch_stats"]} == {1, 2}
    assert stats["response_stats"] == {} and "fail_reasons" not in batcher.stats.to_triton("m")


def test_a_failing_engine_is_a_backend_failure() -> None:
    def broken(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("engine fell over")

    batcher = Batcher(broken, sizes=[1], max_wait_ms=1, max_queue=4)
    batcher.start()
    try:
        with pytest.raises(RuntimeError):
            _run(batcher, 1)
    finally:
        batcher.stop()
    assert batcher.stats.to_triton("m", reasons=True)["fail_reasons"]["BACKEND"] == 1


def test_nv_inference_families() -> None:
    batcher = Batcher(Recorder(), sizes=[1, 2], max_wait_ms=1, max_queue=4)
    batcher.start()
    try:
        _run(batcher, 2, 1)
    finally:
        batcher.stop()
    stats = batcher.stats.to_triton('we"ird', "3", reasons=True)
    text = triton_exposition([stats]).decode()
    labels = 'model="we\\"ird",version="3"'
    assert f"nv_inference_request_success{{{labels}}} 2" in text.splitlines()
    assert f"nv_inference_count{{{labels}}} 3" in text.splitlines()
    assert f"nv_inference_exec_count{{{labels}}} 2" in text.splitlines()
    assert f'nv_inference_request_failure{{reason="REJECTED",{labels}}} 0' in text.splitlines()
    assert "# TYPE nv_inference_count counter" in text
    queue_us = stats["inference_stats"]["queue"]["ns"] // 1000
    assert f"nv_inference_queue_duration_us{{{labels}}} {queue_us}" in text.splitlines()
    for family in ("request_duration_us", "compute_input_duration_us", "compute_infer_duration_us",
                   "compute_output_duration_us"):
        assert re.search(rf"^nv_inference_{family}\{{{re.escape(labels)}\}} \d+$", text, re.M), family
    assert triton_exposition([]).decode().count("# TYPE") == 10
    assert "nv_inference_pending_request_count{" not in text  # unknown: not made up
    pending = triton_exposition([{**stats, "pending": 0}]).decode()
    assert f"nv_inference_pending_request_count{{{labels}}} 0" in pending.splitlines()
