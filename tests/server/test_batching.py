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

from irpe.server.batch_queue import QueueFullError
from irpe.server.batching import Batcher
from tests.server.helpers import (
    encode,
    expected_logits,
    image,
    make_slow_artifact,
    running_server,
)


@pytest.fixture(scope="module")
def slow_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifact whose every engine call takes about 1 s on one idle core (more under load)."""
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
    batcher = Batcher(rec, sizes=[1, 2, 4, 8], max_wait_ms=600_000, max_queue=3)  # a fill window never reached
    batcher.start()

    async def main() -> tuple[list, int]:
        busy = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)]))  # taken at once: engine idle
        while not rec.sizes:  # the engine call has started
            await asyncio.sleep(0.005)
        first = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)] * 3))  # waits: engine busy
        while batcher.depth < 3:
            await asyncio.sleep(0.005)
        with pytest.raises(QueueFullError) as info:
            await batcher.submit([np.ones(2, np.float32)])
        stopper = asyncio.get_running_loop().run_in_executor(None, batcher.stop)  # drain: queued still run
        # a drain that waited for the 10-minute fill window would time out here
        res = await asyncio.wait_for(first, 60)
        await asyncio.wait_for(asyncio.gather(busy, stopper), 60)
        return res, info.value.retry_after

    res, retry_after = asyncio.run(main())
    assert len(res) == 3 and retry_after >= 1 and rec.sizes == [1, 2, 1]  # drained, not waiting to fill


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


def _voluntary_switches(thread: threading.Thread) -> int:
    """How many times ``thread`` blocked and was woken (Linux /proc)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc/self/task (Linux)")
def test_the_thread_that_ends_a_batch_takes_the_next_one_without_waking_a_filler() -> None:
    """A thread waiting to fill a batch is not woken when another batch ends: the thread that ran it takes what
    is queued itself (a wake-up and a GIL hand-off per batch saved). The filler keeps waiting for max_wait."""
    class Named(Recorder):
        def __init__(self) -> None:
            super().__init__(delay=0.2)
            self.threads: list[str] = []

        def __call__(self, x: np.ndarray) -> np.ndarray:
            self.threads.append(threading.current_thread().name)
            return super().__call__(x)

    rec = Named()
    batcher = Batcher(rec, sizes=[1, 2, 4, 8], max_wait_ms=60_000, max_queue=20, workers=2)
    batcher.start()
    switches: list[int] = []

    async def main() -> None:
        first = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)]))
        while not rec.threads:
            await asyncio.sleep(0.005)
        rest = [asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)])) for _ in range(3)]
        filler = next(t for t in batcher._threads if t.name != rec.threads[0])
        while batcher._filling == 0:  # the other thread has started waiting to fill
            await asyncio.sleep(0.005)
        switches.append(_voluntary_switches(filler))
        await asyncio.wait_for(asyncio.gather(first, *rest), 30)
        switches.append(_voluntary_switches(filler))

    asyncio.run(main())
    batcher.stop()
    assert rec.sizes == [1, 2, 1] and len(set(rec.threads)) == 1, (rec.sizes, rec.threads)
    assert switches[1] == switches[0], switches  # the filler slept through both batch ends


class HeldEngine(Recorder):
    """A :class:`Recorder` whose calls wait while ``hold`` is set (the engine stays busy as long as a test needs)."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay=delay)
        self.hold = threading.Event()
        self.released = threading.Event()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.sizes.append(len(x))
        if self.hold.is_set():
            self.released.wait(30)
        time.sleep(self.delay)
        return x * 2


@pytest.mark.parametrize(("per_image_s", "beside_at"), [(0.0, 5), (0.01, 4)], ids=["fast-engine", "slow-engine"])
def test_a_second_batch_runs_beside_a_running_one_only_when_it_pays(per_image_s: float, beside_at: int) -> None:
    """With a batch of 4 running, 4 queued images start a second batch beside it on an engine that takes 1 ms or
    more per image; on a faster one they wait for the first to end (the event loop answers it meanwhile) until
    a fifth image queues. ``beside_at``: the queued images that start the second batch."""
    engine = HeldEngine(delay=per_image_s)
    batcher = Batcher(engine, sizes=[1, 2, 4], max_wait_ms=60_000, max_queue=20, workers=2)
    batcher.start()
    one = [np.ones(2, np.float32)]

    async def main() -> list[int]:
        await batcher.submit(one)  # measures the engine's time per image
        engine.hold.set()
        running = asyncio.ensure_future(batcher.submit(one * 4))
        while len(engine.sizes) < 2:
            await asyncio.sleep(0.005)
        queued = [asyncio.ensure_future(batcher.submit(one)) for _ in range(beside_at - 1)]
        await asyncio.sleep(0.3)
        before = len(engine.sizes)  # no second batch yet
        queued.append(asyncio.ensure_future(batcher.submit(one)))
        deadline = time.monotonic() + 10
        while len(engine.sizes) == before and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        engine.released.set()
        await asyncio.wait_for(asyncio.gather(running, *queued), 30)
        return [before, len(engine.sizes)]

    before, after = asyncio.run(main())
    batcher.stop()
    assert before == 2 and after >= 3 and engine.sizes[:3] == [1, 4, 4], (before, engine.sizes)


def test_a_batch_alone_runs_on_the_solo_engine_and_others_share() -> None:
    """Only a batch taken with the engine idle and nothing else queued runs ``solo`` (every core); one taken
    beside a running batch, or leaving images behind, runs the shared engine."""
    shared, solo = Recorder(delay=0.2), Recorder(delay=0.2)
    batcher = Batcher(shared, sizes=[1, 2], max_wait_ms=0, max_queue=20, workers=2, solo=solo)
    batcher.start()

    async def main() -> None:
        await batcher.submit([np.ones(2, np.float32)])  # alone: solo
        first = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)]))  # alone: solo, 0.2 s
        await asyncio.sleep(0.05)
        # beside it: 2 of these run shared at once; the third, taken when the solo batch ends while those 2
        # still run, runs shared too
        await asyncio.gather(first, batcher.submit([np.ones(2, np.float32)] * 3))

    asyncio.run(main())
    batcher.stop()
    assert solo.sizes == [1, 1] and shared.sizes == [2, 1], (solo.sizes, shared.sizes)


def test_a_batch_alone_on_a_fast_engine_keeps_the_shared_engine() -> None:
    """On an engine faster than SIDE_BY_SIDE_MIN_S per image a batch taken alone runs the shared engine, leaving
    the other cores to the event loop; only the first batch, before any time is measured, runs ``solo``."""
    shared, solo = Recorder(delay=0.0), Recorder(delay=0.0)
    batcher = Batcher(shared, sizes=[1, 2], max_wait_ms=0, max_queue=20, workers=2, solo=solo)
    batcher.start()

    async def main() -> None:
        for _ in range(3):
            await batcher.submit([np.ones(2, np.float32)])  # each alone, one after the other

    asyncio.run(main())
    batcher.stop()
    assert solo.sizes == [1] and shared.sizes == [1, 1], (solo.sizes, shared.sizes)


def test_solo_threads_only_when_the_cores_are_split() -> None:
    from irpe.server.config import Settings, usable_cpus

    cpus = usable_cpus()
    assert Settings(inference_threads=1).resolved_solo_threads() == 0  # one thread already has every core
    assert Settings(device="cuda").resolved_solo_threads() == 0
    if cpus > 1:
        assert Settings().resolved_solo_threads() == cpus and Settings().resolved_threads() < cpus


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
        time.sleep(0.2)  # decoded and running: the engine call takes >= 1 s
        # admission counts images from upload to answer: the running one + one queued fill --max-queue 2
        waiting = [threading.Thread(target=httpx.post, args=(url + "/classify",), kwargs=post)]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 5
        while "irpe_queue_depth 1.0" not in httpx.get(url + "/metrics").text and time.monotonic() < deadline:
            time.sleep(0.02)
        r = httpx.post(url + "/classify", content=body, headers=hdr)
        for t in [busy, *waiting]:
            t.join()
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    assert int(r.headers["retry-after"]) >= 1


def test_deadline_is_504(slow_artifact: Path) -> None:
    """The engine call takes >= 1 s; the 0.2 s deadline answers 504 (a server that ignored it would answer 200)."""
    with running_server(slow_artifact, max_batch=2, max_wait_ms=3000, timeout_s=0.2, inference_threads=1) as url:
        r = httpx.post(url + "/classify", content=encode(image()), headers={"content-type": "image/png"}, timeout=60)
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"


def test_results_and_metrics_report_real_waits_and_durations() -> None:
    """Found by scripts/mutate.py: a sign error in the queue-wait or inference timing went unnoticed."""
    from irpe.server.metrics import Metrics

    metrics = Metrics()
    rec = Recorder(delay=0.02)
    batcher = Batcher(rec, sizes=[1, 2, 4], max_wait_ms=30, max_queue=10, metrics=metrics)
    batcher.start()

    async def main() -> list:
        return await asyncio.gather(*(batcher.submit([np.ones(2, np.float32)]) for _ in range(3)))

    start = time.perf_counter()
    results = [r for rs in asyncio.run(main()) for r in rs]
    elapsed = time.perf_counter() - start
    batcher.stop()
    for r in results:  # bounds that hold on any machine: each part of a request lies within the request
        assert 0 <= r.queue_s <= elapsed and 0.02 <= r.inference_s <= elapsed, (r, elapsed)
        assert r.batch_size in (1, 2, 4)
    text = metrics.render().decode()
    assert 0 <= _metric(text, "irpe_queue_wait_seconds_sum") <= 3 * elapsed
    assert 0.02 * len(rec.sizes) <= _metric(text, "irpe_inference_seconds_sum") <= elapsed
    assert _metric(text, "irpe_queue_wait_seconds_count") == 3


class Overlap:
    """An engine function that records how many calls run at once (and can demand company)."""

    def __init__(self, meet: int = 0):
        self.active = self.most = 0
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(meet, timeout=20) if meet else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            if self.barrier is not None:
                self.barrier.wait()  # only passes if another worker is inside run() at the same time
            else:
                time.sleep(0.02)
            return x
        finally:
            with self.lock:
                self.active -= 1


def _run_batcher(run: Overlap, workers: int, n: int) -> list:
    batcher = Batcher(run, sizes=[1], max_wait_ms=0, max_queue=100, workers=workers)
    batcher.start()

    async def main() -> list:
        return await asyncio.gather(*(batcher.submit([np.ones(2, np.float32)]) for _ in range(n)))

    try:
        return asyncio.run(main())
    finally:
        batcher.stop()


def test_one_worker_never_runs_the_engine_concurrently() -> None:
    """Found by scripts/mutate.py: the worker count was unchecked; one worker (the GPU default) must
    serialise engine calls."""
    run = Overlap()
    assert len(_run_batcher(run, workers=1, n=8)) == 8
    assert run.most == 1


def test_several_workers_run_batches_side_by_side() -> None:
    run = Overlap(meet=2)
    assert len(_run_batcher(run, workers=2, n=4)) == 4 and run.most == 2


def test_retry_after_follows_the_measured_time_per_image() -> None:
    """Found by scripts/mutate.py: the per-image estimate behind Retry-After was unchecked. Batches of one
    image take >= 0.3 s each, so 4 queued images are worth >= 1.2 s: Retry-After 2 (seconds, rounded up)."""
    gate = threading.Event()
    calls: list[int] = []

    def run(x: np.ndarray) -> np.ndarray:
        calls.append(len(x))
        if len(calls) <= 3:
            time.sleep(0.3)  # three measured batches feed the moving average
        else:
            gate.wait(20)  # the fourth batch holds the only worker while the queue fills
        return x

    batcher = Batcher(run, sizes=[1], max_wait_ms=0, max_queue=4)
    batcher.start()

    async def main() -> int:
        for _ in range(3):
            await batcher.submit([np.ones(2, np.float32)])
        held = asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)]))
        while len(calls) < 4:  # the worker is inside the gated batch
            await asyncio.sleep(0.01)
        waiting = [asyncio.ensure_future(batcher.submit([np.ones(2, np.float32)])) for _ in range(4)]
        await asyncio.sleep(0)
        try:
            with pytest.raises(QueueFullError) as info:
                await batcher.submit([np.ones(2, np.float32)])
        finally:
            gate.set()
        await asyncio.gather(held, *waiting)
        return info.value.retry_after

    try:
        assert asyncio.run(main()) >= 2
    finally:
        gate.set()
        batcher.stop()


def test_submit_timeout_gives_up_and_the_images_are_skipped() -> None:
    """``submit(timeout=)`` (the engine process's deadline): TimeoutError in time, the abandoned image never
    reaches the engine, and a later request is answered normally."""
    rec = Recorder(delay=1.5)
    batcher = Batcher(rec, sizes=[1], max_wait_ms=0, max_queue=10, workers=1)
    batcher.start()

    async def main() -> tuple[bool, list]:
        busy = asyncio.ensure_future(batcher.submit([np.full(3, 1, np.float32)]))  # holds the only worker
        await asyncio.sleep(0.05)
        with pytest.raises(asyncio.TimeoutError):
            await batcher.submit([np.full(3, 2, np.float32)], timeout=0.05)
        gave_up_first = not busy.done()
        await busy
        return gave_up_first, await batcher.submit([np.full(3, 3, np.float32)], timeout=30)

    gave_up_first, last = asyncio.run(main())
    batcher.stop()
    assert gave_up_first  # the timeout fired while the engine was still busy
    assert float(last[0].logits[0]) == 6.0 and rec.sizes == [1, 1]  # the abandoned image was skipped
