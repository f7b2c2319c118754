"""The model repository on disk (server/hosting/repository.py) and the fair inference slots
(server/hosting/loading.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from irpe.server.hosting.loading import InferenceSlots
from irpe.server.hosting.repository import RepositoryError, VersionPolicy, check_layout, read_config, scan
from irpe.server.hosting.version import ModelVersion
from tests.server.helpers import make_artifact


def test_version_policies_select_as_triton() -> None:
    have = [3, 1, 10, 2]
    assert VersionPolicy().select(have) == [10]
    assert VersionPolicy("latest", 2).select(have) == [3, 10]
    assert VersionPolicy("all").select(have) == [1, 2, 3, 10]
    assert VersionPolicy("specific", versions=(2, 7)).select(have) == [2]
    for raw in ({"latest": {"num_versions": 2}}, {"all": {}}, {"specific": {"versions": [1, 3]}}):
        assert VersionPolicy.from_config(raw, "x").to_config() == raw
    for bad in ({"latest": {"num_versions": 0}}, {"newest": {}}, {"specific": {"versions": []}}, [1]):
        with pytest.raises(RepositoryError, match="version_policy must be"):
            VersionPolicy.from_config(bad, "x")


def test_scan_finds_models_versions_and_bad_configs(tmp_path: Path) -> None:
    plain = make_artifact(tmp_path / "plain", name="solo")
    assert {n: sorted(m.versions) for n, m in scan(plain).items()} == {"solo": [1]}
    repo = tmp_path / "repo"
    make_artifact(repo / "a" / "1")
    make_artifact(repo / "a" / "12")
    (repo / "a" / "notes").mkdir()  # not a version
    (repo / "a" / "0").mkdir()  # versions start at 1
    (repo / "b" / "1").mkdir(parents=True)
    (repo / "b" / "config.json").write_text('{"version_policy": {"all": {}}, "max_queue": 8}')
    (repo / "c" / "1").mkdir(parents=True)
    (repo / "c" / "config.json").write_text("{ nope")
    (repo / ".hidden").mkdir()
    models = check_layout(repo)
    assert sorted(models) == ["a", "b", "c"] and sorted(models["a"].versions) == [1, 12]
    assert read_config(repo / "b").max_queue == 8 and models["b"].config.policy.kind == "all"
    assert "not valid JSON" in models["c"].error
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RepositoryError, match="neither an artifact directory"):
        check_layout(empty)
    with pytest.raises(RepositoryError, match="no such directory"):
        check_layout(tmp_path / "missing")


def test_a_busy_model_does_not_starve_another() -> None:
    """One slot; model A keeps two workers calling it back to back, B asks once: first come, first served,
    so B runs after at most the call in progress and the one already waiting (not after A drains)."""
    slots = InferenceSlots(1)
    order: list[str] = []
    stop = threading.Event()

    def run_a(x: np.ndarray) -> np.ndarray:
        order.append("a")
        time.sleep(0.01)
        return x

    def busy() -> None:
        gated = slots.wrap(run_a)
        while not stop.is_set():
            gated(np.zeros(1))

    workers = [threading.Thread(target=busy) for _ in range(2)]
    for t in workers:
        t.start()
    time.sleep(0.1)
    before = len(order)
    slots.wrap(lambda x: order.append("b") or x)(np.zeros(1))
    stop.set()
    for t in workers:
        t.join(5)
    assert order.index("b") - before <= 2, order


def _kill_inference_thread(model_version: ModelVersion) -> None:
    """End the only inference thread of ``model_version`` by an error outside the engine call (a result of
    the wrong length)."""
    import asyncio

    batcher = model_version.batcher
    assert batcher is not None
    batcher._run = batcher._solo = lambda x: np.zeros((0, 10), np.float32)  # IndexError in the thread

    async def submit() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(batcher.submit([np.zeros((3, 32, 32), np.float32)]), 1.0)

    asyncio.run(submit())
    batcher._threads[0].join(5)
    assert not batcher._threads[0].is_alive()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_inference_thread_of_the_default_model_turns_the_server_unready(tmp_path: Path) -> None:
    from irpe.server.config import Settings
    from irpe.server.errors import APIError
    from irpe.server.pipeline.service import local_service

    make_artifact(tmp_path / "a" / "1")
    state = local_service(Settings(artifact_dir=str(tmp_path), inference_threads=1))
    state.load()
    state.warm()
    try:
        assert state.ready
        with state.use("a") as model_version:
            _kill_inference_thread(model_version)
        with pytest.raises(APIError) as e, state.use("a"):
            pass
        assert e.value.status == 503 and not state.ready and "restart the server" in state.failure
    finally:
        state.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_inference_thread_makes_only_its_model_unavailable(tmp_path: Path) -> None:
    from irpe.server.config import Settings
    from irpe.server.errors import APIError
    from irpe.server.pipeline.service import local_service

    make_artifact(tmp_path / "a" / "1")
    make_artifact(tmp_path / "b" / "1")
    state = local_service(Settings(artifact_dir=str(tmp_path), inference_threads=1))
    state.load()
    state.warm()
    try:
        with state.use("b") as model_version:
            _kill_inference_thread(model_version)
        for _ in range(2):  # the first request finds it, the next one is refused by the lookup
            with pytest.raises(APIError) as e, state.use("b"):
                pass
            assert e.value.status == 503 and "worker thread stopped" in e.value.message
        with state.use("a") as other:
            assert other.ready and state.ready  # the default model and the server are unaffected
        assert {r["name"]: r["state"] for r in state.host.index()} == {"a": "READY", "b": "UNAVAILABLE"}
    finally:
        state.shutdown()
