"""Dynamic batching: requests share inference calls, the queue is bounded (503), deadlines hold (504)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from irpe.server.batching import Batcher, QueueFullError
from tests.server.helpers import BIAS, CROP, LABELS, NUM_CLASSES, WEIGHT, encode, expected_logits, image, running_server


def make_slow_artifact(directory: Path, matmuls: int = 30) -> Path:
    """The handmade model plus a chain of ``matmuls`` 1024x1024 MatMuls that depend on the input (about
    25 ms each on one core, whatever the batch size) and add 0 to the logits: an engine that stays busy."""
    from onnx import TensorProto, helper, numpy_helper, save

    from irpe.artifact import ModelArtifact, Preprocess, save_artifact

    d = 1024
    nodes = [helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["mm"]),
             helper.make_node("ReduceSum", ["images"], ["s"], keepdims=0),
             helper.make_node("Mul", ["s", "A"], ["m0"])]
    nodes += [helper.make_node("MatMul", [f"m{k}", "A"], [f"m{k + 1}"]) for k in range(matmuls)]
    nodes += [helper.make_node("ReduceMean", [f"m{matmuls}"], ["burn"], keepdims=0),
              helper.make_node("Mul", ["burn", "zero"], ["nothing"]),
              helper.make_node("Add", ["mm", "b"], ["mb"]), helper.make_node("Add", ["mb", "nothing"], ["logits"])]
    inits = [numpy_helper.from_array(WEIGHT, "W"), numpy_helper.from_array(BIAS, "b"),
             numpy_helper.from_array(np.full((d, d), 1.0 / d, np.float32), "A"),
             numpy_helper.from_array(np.float32(0.0), "zero")]
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, CROP, CROP])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory.mkdir(parents=True, exist_ok=True)
    save(model, str(directory / "model.onnx"))
    art = ModelArtifact(name="slow", architecture={"kind": "handmade"}, img_size=CROP, num_classes=NUM_CLASSES,
                        preprocess=Preprocess(resize=36, crop=CROP), labels=list(LABELS))
    save_artifact(art, directory)
    return directory


@pytest.fixture(scope="module")
def slow_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifact whose every engine call takes about 0.75 s on one core."""
    return make_slow_artifact(tmp_path_factory.mktemp("slow"))


class Recorder:
    """A real engine function (doubles its input) that records the batch sizes it was called with."""

    def __init__(self, delay: float = 0.0):
        self.sizes: list[int] = []
        self.delay = delay

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.sizes.append(len(x))
        time.sleep(self.delay)
        return x * 2


def test_batcher_groups_and_returns_rows_in_order() -> None:
    rec = Recorder(delay=0.01)
    batcher = Batcher(rec, sizes=[1, 2, 4, 8], max_wait_ms=50, max_queue=100)
    batcher.start()

    async def main() -> list:
        return await asyncio.gather(*(batcher.submit([np.full(3, i, np.float32)]) for i in range(20)))

    results = asyncio.run(main())
    batcher.stop()
    assert [float(r[0].logits[0]) for r in results] == [2.0 * i for i in range(20)]
    assert sum(rec.sizes) == 20 and max(rec.sizes) == 8 and set(rec.sizes) <= {1, 2, 4, 8}
    assert len(rec.sizes) < 20


def test_batcher_queue_bound_and_drain() -> None:
    rec = Recorder(delay=0.3)
    batcher = Batcher(rec, sizes=[1, 2, 4, 8], max_wait_ms=5000, max_queue=3)
    batcher.start()

    async def main() -> tuple[list, int]:
        busy = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)]))  # taken at once: engine idle
        await asyncio.sleep(0.05)
        first = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)] * 3))  # waits: engine busy
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError) as info:
            await batcher.submit([np.ones(2, np.float32)])
        stopper = asyncio.get_running_loop().run_in_executor(None, batcher.stop)  # drain: queued still run
        res = await first
        await asyncio.gather(busy, stopper)
        return res, info.value.retry_after

    start = time.monotonic()
    res, retry_after = asyncio.run(main())
    assert len(res) == 3 and retry_after >= 1 and rec.sizes == [1, 2, 1]  # drained without waiting 5 s
    assert time.monotonic() - start < 3


def test_lone_request_is_not_held_while_the_engine_is_idle() -> None:
    """max_wait_ms applies only while a batch is in flight: an idle engine runs a lone image at once."""
    rec = Recorder()
    batcher = Batcher(rec, sizes=[1, 2, 4, 8], max_wait_ms=2000, max_queue=10)
    batcher.start()

    async def main() -> list[float]:
        waits = []
        for _ in range(5):
            (res,) = await batcher.submit([np.ones(2, np.float32)])
            waits.append(res.queue_s)
        return waits

    start = time.monotonic()
    waits = asyncio.run(main())
    batcher.stop()
    assert time.monotonic() - start < 1.0 and max(waits) < 0.2 and rec.sizes == [1] * 5
    stats = batcher.stats.to_triton("m")
    assert stats["inference_count"] == 5 and stats["execution_count"] == 5
    assert stats["inference_stats"]["success"]["count"] == 5 and stats["batch_stats"][0]["batch_size"] == 1


def test_busy_engine_fills_a_batch_up_to_max_wait() -> None:
    """While one batch runs, later images wait (up to max_wait_ms) and go together."""
    rec = Recorder(delay=0.2)
    batcher = Batcher(rec, sizes=[1, 2, 4, 8], max_wait_ms=5000, max_queue=20, workers=2)
    batcher.start()

    async def main() -> None:
        first = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)]))
        await asyncio.sleep(0.05)  # worker 1 runs; worker 2 waits for the batch to fill or the engine to idle
        rest = [asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)])) for _ in range(3)]
        await asyncio.gather(first, *rest)

    asyncio.run(main())
    batcher.stop()
    assert rec.sizes == [1, 2, 1], rec.sizes  # greedy would give [1, 1, 1, 1]


def _metric(text: str, name: str) -> float:
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))


def test_concurrent_requests_share_inference_calls(tiny_artifact: Path) -> None:
    from irpe.artifact import Preprocess
    from irpe.artifact.preprocess import preprocess_image

    with running_server(tiny_artifact, max_batch=8, max_wait_ms=150) as url:
        async def main() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=20) as client:
                return await asyncio.gather(*(
                    client.post(url + "/classify?top_k=1", content=encode(image(seed=s)),
                                headers={"content-type": "image/png"}) for s in range(24)))

        responses = asyncio.run(main())
        metrics = httpx.get(url + "/metrics").text
    for seed, r in enumerate(responses):
        assert r.status_code == 200
        want = int(np.argmax(expected_logits(preprocess_image(image(seed=seed), Preprocess(36, 32))[None])))
        assert r.json()["predictions"][0][0]["index"] == want
    batches = _metric(metrics, "irpe_batch_size_count")
    singles = _metric(metrics, 'irpe_batch_size_bucket{le="1.0"}')
    assert _metric(metrics, "irpe_batch_size_sum") >= 24  # warm-up does not count
    assert batches < 24 and batches - singles > 0
    assert max(r.json()["batch_size"] for r in responses) > 1


def test_queue_full_is_503_with_retry_after(slow_artifact: Path) -> None:
    with running_server(slow_artifact, max_batch=2, max_wait_ms=1500, max_queue=2, inference_threads=1) as url:
        body, hdr = encode(image()), {"content-type": "image/png"}
        post = {"content": body, "headers": hdr, "timeout": 20}
        busy = threading.Thread(target=httpx.post, args=(url + "/classify",), kwargs=post)  # occupies the engine
        busy.start()
        time.sleep(0.2)  # decoded and running: the engine call takes ~0.75 s
        waiting = [threading.Thread(target=httpx.post, args=(url + "/classify",), kwargs=post) for _ in range(2)]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 5
        while "irpe_queue_depth 2.0" not in httpx.get(url + "/metrics").text and time.monotonic() < deadline:
            time.sleep(0.02)
        r = httpx.post(url + "/classify", content=body, headers=hdr)
        for t in [busy, *waiting]:
            t.join()
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    assert int(r.headers["retry-after"]) >= 1


def test_deadline_is_504(slow_artifact: Path) -> None:
    with running_server(slow_artifact, max_batch=2, max_wait_ms=3000, timeout_s=0.2, inference_threads=1) as url:
        start = time.monotonic()
        r = httpx.post(url + "/classify", content=encode(image()), headers={"content-type": "image/png"}, timeout=10)
        took = time.monotonic() - start
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert took < 2.0
