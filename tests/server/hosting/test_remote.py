"""Model control with ``irpe serve REPO --frontends 2`` (server/hosting/remote.py, server/ipc/engine_server.py):
loads and unloads arriving at any front end run in the engine process and every front end follows; a swap
under load answers every request; /v2 statistics add up over both front ends. Real HTTP on 127.0.0.1,
repository routes through tritonclient."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.reliability.procs import ServerProcess, serving
from tests.server.helpers import CROP
from tests.server.hosting.test_local import _classify, _hammer, _top, constant_artifact, pooled_artifact


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("frontrepo")
    constant_artifact(root / "main" / "1", 1)
    constant_artifact(root / "swap" / "1", 1)
    constant_artifact(root / "later" / "1", 7)  # not in --load-model: not loaded at startup
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with serving(repo, "--frontends", "2", "--model-control", "explicit", "--load-model", "main",
                 "--load-model", "swap", "--max-wait-ms", "2", "--timeout-s", "20") as proc:
        yield proc



def _routing_pids(url: str, model: str, version: str) -> set[str]:
    """The processes (engine and front ends) whose ``irpe_model_ready`` gauge says they route to it."""
    text = httpx.get(url + "/metrics", timeout=10).text
    labels = rf'(?=[^}}]*model="{model}")(?=[^}}]*version="{version}")[^}}]*pid="(\d+)"[^}}]*'
    pattern = rf'irpe_model_ready\{{{labels}\}} 1\.0'
    return set(re.findall(pattern, text))


def _infer(client: triton.InferenceServerClient, name: str, crop: int = CROP, version: str = "") -> list[int]:
    x = np.zeros((2, 3, crop, crop), np.float32)
    inp = triton.InferInput("images", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(name, [inp], model_version=version).as_numpy("logits").argmax(1).tolist()


def test_a_load_reaches_every_front_end_and_an_unload_404s(server: ServerProcess, repo: Path,
                                                          client: triton.InferenceServerClient) -> None:
    pooled_artifact(repo / "fresh" / "1", 24, 6)  # a new model with a crop size no front end has a pool for
    index = {r["name"]: r["state"] for r in client.get_model_repository_index()}
    assert index == {"later": "UNAVAILABLE", "main": "READY", "swap": "READY"}
    assert _classify(server.url, "?model=later").status_code == 404 and _classify(server.url).json()["model"] == "main"
    client.load_model("later")
    assert {_top(_classify(server.url, "?model=later").json()) for _ in range(4)} == {7}
    client.load_model("fresh")
    assert len(_routing_pids(server.url, "fresh", "1")) == 3  # the engine and both front ends
    for _ in range(6):  # fresh connections: either front end may answer
        c = triton.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            assert _infer(c, "fresh", 24) == [6, 6]
        finally:
            c.close()
    answers = [_classify(server.url, "?model=fresh") for _ in range(6)]
    assert {(r.status_code, r.json()["version"], _top(r.json())) for r in answers} == {(200, "1", 6)}
    assert {"name": "fresh", "version": "1", "state": "READY"} in client.get_model_repository_index()
    client.unload_model("fresh")
    assert _routing_pids(server.url, "fresh", "1") == set()
    with pytest.raises(InferenceServerException) as e:
        _infer(client, "fresh", 24)
    assert e.value.status() == "404"
    assert _classify(server.url, "?model=fresh").status_code == 404
    with pytest.raises(InferenceServerException) as e:
        client.load_model("nope")
    assert e.value.status() == "404"


def test_a_swap_under_load_answers_every_request(server: ServerProcess, repo: Path,
                                                 client: triton.InferenceServerClient) -> None:
    log: list[tuple[float, float, int, str, int]] = []
    load = threading.Thread(target=lambda: asyncio.run(_hammer(server.url, 400, 8, log)))
    load.start()
    while len(log) < 80 and load.is_alive():
        time.sleep(0.01)
    constant_artifact(repo / "swap" / "2", 2)
    client.load_model("swap")
    after = time.monotonic()
    load.join(120)
    assert len(log) == 400 and {s for _, _, s, _, _ in log} == {200}, [e for e in log if e[2] != 200][:5]
    assert {(v, top) for *_, v, top in log} == {("1", 1), ("2", 2)}
    assert all(v == "2" for sent, _, _, v, _ in log if sent > after)  # sent after the load returned: new
    assert _routing_pids(server.url, "swap", "1") == set() and len(_routing_pids(server.url, "swap", "2")) == 3


def test_v2_stats_add_up_over_both_front_ends(server: ServerProcess) -> None:
    def stats() -> dict:
        with httpx.Client(timeout=10) as c:  # a new connection: either front end may answer
            return c.get(server.url + "/v2/models/main/versions/1/stats").json()["model_stats"][0]

    before = stats()
    codes = []
    for _ in range(12):  # a new connection each: both front ends take some of them
        codes.append(_classify(server.url, "?model=main").status_code)
    after = stats()
    assert codes == [200] * 12
    assert (after["name"], after["version"]) == ("main", "1")
    assert after["inference_count"] - before["inference_count"] == 12
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 12
    assert after["execution_count"] > before["execution_count"]


def test_poll_runs_in_the_engine_and_every_front_end_follows(tmp_path: Path) -> None:
    constant_artifact(tmp_path / "polled" / "1", 1)
    with serving(tmp_path, "--frontends", "2", "--model-control", "poll", "--poll-interval-s", "0.2") as server:
        constant_artifact(tmp_path / "polled" / "2", 2)
        pooled_artifact(tmp_path / "added" / "1", 24, 5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(_routing_pids(server.url, "polled", "2")) < 3
                                               or len(_routing_pids(server.url, "added", "1")) < 3):
            time.sleep(0.1)
        assert len(_routing_pids(server.url, "polled", "2")) == 3 and len(_routing_pids(server.url, "added", "1")) == 3
        assert {(r.status_code, _top(r.json())) for r in (_classify(server.url, "?model=polled") for _ in range(6))} \
            == {(200, 2)}
        assert {_top(_classify(server.url, "?model=added").json()) for _ in range(4)} == {5}
        client = triton.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            with pytest.raises(InferenceServerException) as e:
                client.unload_model("polled")
            assert e.value.status() == "503" and "--model-control explicit" in str(e.value)
        finally:
            client.close()


def test_a_corrupt_version_loaded_through_a_front_end_leaves_the_old_one(
        server: ServerProcess, repo: Path, client: triton.InferenceServerClient) -> None:
    import shutil

    shutil.copytree(repo / "main" / "1", repo / "main" / "2")
    onnx = repo / "main" / "2" / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[:200])  # truncated: sha256 mismatch
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("main")
        assert e.value.status() == "400" and "version 2" in str(e.value) and "sha256" in str(e.value)
        rows = {r["version"]: r for r in client.get_model_repository_index() if r["name"] == "main"}
        assert rows["2"]["state"] == "UNAVAILABLE" and "sha256" in rows["2"]["reason"]
        assert rows["1"]["state"] == "READY"
        answers = [_classify(server.url) for _ in range(6)]
        assert {(r.status_code, r.json()["version"], _top(r.json())) for r in answers} == {(200, "1", 1)}
    finally:
        shutil.rmtree(repo / "main" / "2")
