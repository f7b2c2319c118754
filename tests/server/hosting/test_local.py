"""The model repository (server/hosting/local.py) against a real ``irpe serve REPO`` on 127.0.0.1: routing by
model and version, a version swap under load with no failed request, a corrupt new version that leaves the
old one serving, unload then 404, memory after load/unload cycles. Repository routes go through
tritonclient (NVIDIA's client), /classify through plain HTTP."""

from __future__ import annotations

import asyncio
import json
import shutil
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
from tests.server.helpers import CROP, NUM_CLASSES, encode, handmade_artifact, image

PNG = {"content-type": "image/png"}


def constant_artifact(directory: Path, top: int, name: str = "constant") -> Path:
    """A model whose logits ignore the image: class ``top`` always wins (tells versions apart)."""
    from onnx import helper

    bias = np.zeros(NUM_CLASSES, np.float32)
    bias[top] = 5.0
    nodes = [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
             helper.make_node("MatMul", ["flat", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["logits"])]
    return handmade_artifact(directory, name, nodes, {"W": np.zeros((3 * CROP * CROP, NUM_CLASSES), np.float32),
                                                      "b": bias})


def heavy_artifact(directory: Path) -> Path:
    """A model with 24 MB of weights (a leak per load/unload cycle would show in RSS at once)."""
    from onnx import helper

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((3 * CROP * CROP, 2048)) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((2048, NUM_CLASSES)) * 0.01).astype(np.float32)
    nodes = [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
             helper.make_node("MatMul", ["flat", "W1"], ["hidden"]),
             helper.make_node("MatMul", ["hidden", "W2"], ["logits"])]
    return handmade_artifact(directory, "heavy", nodes, {"W1": w1, "W2": w2})


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    constant_artifact(root / "swap" / "1", 1)
    constant_artifact(root / "keep" / "1", 1)
    constant_artifact(root / "gone" / "1", 3)
    heavy_artifact(root / "cycle" / "1")
    constant_artifact(root / "multi" / "1", 4)
    constant_artifact(root / "multi" / "2", 5)
    constant_artifact(root / "multi" / "3", 6)
    (root / "multi" / "config.json").write_text(json.dumps({"version_policy": {"specific": {"versions": [1, 2]}}}))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with serving(repo, "--model-control", "explicit", "--default-model", "swap", "--max-wait-ms", "2",
                 "--timeout-s", "20") as proc:
        yield proc



def _classify(url: str, query: str = "") -> httpx.Response:
    return httpx.post(f"{url}/classify{query}", content=encode(image()), headers=PNG, timeout=30)


def _top(body: dict) -> int:
    return body["predictions"][0][0]["index"]


def _index(client: triton.InferenceServerClient, name: str) -> list[dict]:
    return [row for row in client.get_model_repository_index() if row["name"] == name]


def test_routes_by_model_and_version_with_the_version_policy(server: ServerProcess,
                                                             client: triton.InferenceServerClient) -> None:
    r = _classify(server.url)  # the default model
    assert r.status_code == 200 and r.json()["model"] == "swap" and r.json()["version"] == "1"
    newest = _classify(server.url, "?model=multi").json()
    assert (newest["version"], _top(newest)) == ("2", 5)  # specific [1, 2]: version 3 is not served
    old = _classify(server.url, "?model=multi&version=1").json()
    assert (old["model"], old["version"], _top(old)) == ("multi", "1", 4)
    missing = _classify(server.url, "?model=multi&version=3")
    assert missing.status_code == 404 and "version 3" in missing.json()["error"]["message"]
    assert _classify(server.url, "?model=nope").status_code == 404
    listed = {(m["name"], m["version"]) for m in httpx.get(server.url + "/v1/models").json()["models"]}
    assert {("swap", "1"), ("multi", "1"), ("multi", "2"), ("cycle", "1")} <= listed and ("multi", "3") not in listed
    x = np.zeros((2, 3, CROP, CROP), np.float32)
    inp = triton.InferInput("images", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("multi", [inp], model_version="1")
    assert res.get_response()["model_version"] == "1" and res.as_numpy("logits").argmax(1).tolist() == [4, 4]
    assert client.infer("multi", [inp]).get_response()["model_version"] == "2"
    assert client.get_model_metadata("multi")["versions"] == ["1", "2"]
    assert client.get_model_config("multi")["version_policy"] == {"specific": {"versions": [1, 2]}}
    assert client.is_model_ready("multi", "2") and not client.is_model_ready("multi", "3")
    stats = client.get_inference_statistics("multi")["model_stats"]
    assert {s["version"] for s in stats} == {"1", "2"}
    metrics = httpx.get(server.url + "/metrics").text
    assert 'irpe_model_images_total{model="multi",version="1"} 3.0' in metrics  # 1 /classify + 2 /v2 images
    assert 'irpe_model_ready{model="multi",version="2"} 1.0' in metrics
    with pytest.raises(InferenceServerException) as e:
        client.infer("multi", [inp], model_version="3")
    assert e.value.status() == "404" and "version 3" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("not-there")
    assert e.value.status() == "404" and "not-there" in str(e.value)


async def _hammer(url: str, n: int, concurrency: int, log: list[tuple[float, float, int, str, int]],
                  model: str = "swap") -> None:
    """``n`` /classify requests on ``concurrency`` connections; (sent, answered, status, version, top) each."""
    body = encode(image())
    left = iter(range(n))
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as c:
        async def worker() -> None:
            for _ in left:
                sent = time.monotonic()
                r = await c.post(f"{url}/classify?model={model}", content=body, headers=PNG)
                j = r.json() if r.status_code == 200 else {}
                log.append((sent, time.monotonic(), r.status_code, j.get("version", ""),
                            _top(j) if j else -1))
        await asyncio.gather(*(worker() for _ in range(concurrency)))


def test_version_swap_under_load_answers_every_request(server: ServerProcess, repo: Path,
                                                       client: triton.InferenceServerClient) -> None:
    log: list[tuple[float, float, int, str, int]] = []
    load = threading.Thread(target=lambda: asyncio.run(_hammer(server.url, 2000, 16, log)))
    load.start()
    while len(log) < 300 and load.is_alive():
        time.sleep(0.01)
    constant_artifact(repo / "swap" / "2", 2)
    started = time.monotonic()
    client.load_model("swap")  # returns once version 2 is warm and routed to, version 1 drained
    swapped = time.monotonic()
    load.join(120)
    answered = sorted(a for _, a, *_ in log)
    during = [a for a in answered if started <= a <= swapped]
    gap = max(b - a for a, b in zip([started, *during], [*during, swapped], strict=True))
    print(f"swap (load + warm + drain): {swapped - started:.3f}s; longest time without an answer during it "
          f"{gap * 1e3:.1f} ms; {len(log)} requests")
    assert len(log) == 2000 and {s for _, _, s, _, _ in log} == {200}
    assert all(top == int(v) for _, _, _, v, top in log)  # each answer names the version that computed it
    assert all(v == "1" for _, answered, _, v, _ in log if answered < started)  # old before the switch
    assert all(v == "2" for sent, _, _, v, _ in log if sent > swapped)  # new after it
    assert sum(v == "1" for *_, v, _ in log) >= 300 and sum(v == "2" for *_, v, _ in log) >= 100
    assert _index(client, "swap") == [{"name": "swap", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
                                      {"name": "swap", "version": "2", "state": "READY"}]
    assert httpx.get(server.url + "/readyz").status_code == 200


def _corrupt_versions(model: Path) -> dict[int, str]:
    """Version 2: truncated model.onnx (checksum mismatch); 3: model.onnx ONNX Runtime refuses (checksum
    updated to match); 4: model.json that is not JSON. Returns version -> a word of the expected reason."""
    from irpe.artifact import file_sha256

    for v in (2, 3, 4):
        shutil.copytree(model / "1", model / str(v))
    onnx = model / "2" / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[:200])
    (model / "3" / "model.onnx").write_bytes(b"\x08\x07garbage" * 50)
    meta = json.loads((model / "3" / "model.json").read_text())
    meta["onnx_sha256"] = file_sha256(model / "3" / "model.onnx")
    (model / "3" / "model.json").write_text(json.dumps(meta))
    (model / "4" / "model.json").write_text("{ not json")
    return {2: "sha256", 3: "ONNX Runtime", 4: "model.json"}


def test_a_corrupt_new_version_leaves_the_old_one_serving(server: ServerProcess, repo: Path,
                                                          client: triton.InferenceServerClient) -> None:
    expected = _corrupt_versions(repo / "keep")
    for v in sorted(expected, reverse=True):  # latest(1): a load tries the newest version on disk
        with pytest.raises(InferenceServerException) as e:
            client.load_model("keep")
        assert e.value.status() == "400" and f"version {v}" in str(e.value) and expected[v] in str(e.value)
        row = {r["version"]: r for r in _index(client, "keep")}[str(v)]
        assert row["state"] == "UNAVAILABLE" and expected[v] in row["reason"]
        r = _classify(server.url, "?model=keep")
        assert r.status_code == 200 and r.json()["version"] == "1" and _top(r.json()) == 1
        assert client.is_model_ready("keep")
        shutil.rmtree(repo / "keep" / str(v))
    assert {r["version"]: r["state"] for r in _index(client, "keep")}["1"] == "READY"


def test_unload_then_infer_is_the_protocols_404(server: ServerProcess, client: triton.InferenceServerClient) -> None:
    assert _classify(server.url, "?model=gone").status_code == 200
    client.unload_model("gone")
    assert not client.is_model_ready("gone")
    assert _index(client, "gone") == [{"name": "gone", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    x = np.zeros((1, 3, CROP, CROP), np.float32)
    inp = triton.InferInput("images", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as e:
        client.infer("gone", [inp])
    assert e.value.status() == "404" and "gone" in str(e.value) and "not loaded" in str(e.value)
    r = _classify(server.url, "?model=gone")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    client.load_model("gone")
    assert _top(_classify(server.url, "?model=gone").json()) == 3


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_load_unload_cycles_free_the_memory(server: ServerProcess, client: triton.InferenceServerClient) -> None:
    for _ in range(2):  # the first cycles settle allocator pools and lazy imports
        client.unload_model("cycle")
        client.load_model("cycle")
    start = _rss_mb(server.pid)
    for _ in range(20):
        client.unload_model("cycle")
        client.load_model("cycle")
    end = _rss_mb(server.pid)
    print(f"RSS before 20 load/unload cycles {start:.1f} MB, after {end:.1f} MB")
    assert end - start < 50, (start, end)
    assert _classify(server.url, "?model=cycle").status_code == 200


def test_unloading_the_default_model_turns_readyz_but_not_healthz(server: ServerProcess,
                                                                  client: triton.InferenceServerClient) -> None:
    client.unload_model("swap")
    try:
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 503 and "swap" in ready.json()["detail"]
        assert httpx.get(server.url + "/healthz").status_code == 200
        assert _classify(server.url).status_code == 404
        assert _classify(server.url, "?model=multi").status_code == 200
    finally:
        client.load_model("swap")
    assert httpx.get(server.url + "/readyz").status_code == 200


def _until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the repository change was not picked up in time"
        time.sleep(0.1)


def _version(url: str, model: str) -> str:
    r = _classify(url, f"?model={model}")
    return r.json()["version"] if r.status_code == 200 else f"HTTP {r.status_code}"


def test_poll_picks_up_new_versions_and_models_on_openvino(tmp_path: Path) -> None:
    """--model-control poll (and the OpenVINO backend: the repository sits above the Engine interface)."""
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    constant_artifact(repo / "m" / "1", 1)
    with serving(repo, "--model-control", "poll", "--poll-interval-s", "0.2", "--backend", "openvino") as server:
        assert _version(server.url, "m") == "1"
        constant_artifact(staging / "2", 2).rename(repo / "m" / "2")  # appears whole
        _until(lambda: _version(server.url, "m") == "2")
        shutil.rmtree(repo / "m" / "2")
        _until(lambda: _version(server.url, "m") == "1")
        assert _version(server.url, "n") == "HTTP 404"
        constant_artifact(staging / "n" / "1", 7)
        (staging / "n").rename(repo / "n")  # a new model
        _until(lambda: _version(server.url, "n") == "1")
        assert _top(_classify(server.url, "?model=n").json()) == 7
        client = triton.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            with pytest.raises(InferenceServerException) as e:
                client.unload_model("m")
            assert e.value.status() == "503" and "not allowed" in str(e.value)
            assert client.get_model_metadata("m")["platform"] == "openvino"
        finally:
            client.close()


@pytest.mark.parametrize("flags, needle", [(("--workers", "2"), "use --workers 1"),
                                           (("--load-model", "keep"), "add --model-control explicit"),
                                           (("--model-control", "explicit", "--load-model", "nope"),
                                            "fix --load-model"),
                                           (("--model-control", "explicit", "--load-model", "keep",
                                             "--default-model", "swap"), "add --load-model swap"),
                                           (("--default-model", "nope"), "fix --default-model")])
def test_what_a_repository_cannot_do_yet_is_one_line(repo: Path, flags: tuple[str, ...], needle: str) -> None:
    import subprocess
    import sys

    from tests.reliability.procs import REPO, server_env

    proc = subprocess.run([sys.executable, "-m", "irpe", "serve", str(repo), "--port", "0", *flags], cwd=REPO,
                          env=server_env(), capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and needle in lines[-1], proc.stderr
    assert len(lines) == 1, proc.stderr


def pooled_artifact(directory: Path, crop: int, top: int, name: str = "pooled") -> Path:
    """A model for ``crop`` x ``crop`` images (mean-pooled) whose class ``top`` always wins."""
    from onnx import TensorProto, helper, numpy_helper, save

    from irpe.artifact import ModelArtifact, Preprocess, file_sha256, save_artifact

    bias = np.zeros(NUM_CLASSES, np.float32)
    bias[top] = 5.0
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0),
         helper.make_node("MatMul", ["pooled", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["logits"])],
        name, [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, crop, crop])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        initializer=[numpy_helper.from_array(np.zeros((3, NUM_CLASSES), np.float32), "W"),
                     numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory.mkdir(parents=True, exist_ok=True)
    save(model, str(directory / "model.onnx"))
    save_artifact(ModelArtifact(name=name, architecture={"kind": "handmade"}, img_size=crop, num_classes=NUM_CLASSES,
                                preprocess=Preprocess(resize=crop + 4, crop=crop),
                                labels=[f"class_{i}" for i in range(NUM_CLASSES)],
                                onnx_sha256=file_sha256(directory / "model.onnx")), directory)
    return directory


def test_frontends_route_by_model_and_version(tmp_path: Path) -> None:
    """--frontends 2 over a repository: two crop sizes (two slot pools), routing by name and version in the
    engine process, the same answers as one process would give."""
    pooled_artifact(tmp_path / "small" / "1", 24, 2)
    pooled_artifact(tmp_path / "small" / "2", 24, 3)
    (tmp_path / "small" / "config.json").write_text('{"version_policy": {"all": {}}}')
    constant_artifact(tmp_path / "big" / "1", 1)
    with serving(tmp_path, "--frontends", "2", "--default-model", "big") as server:
        answers = [_classify(server.url, q) for q in ("", "?model=small", "?model=small&version=1") * 4]
        assert [r.status_code for r in answers] == [200] * 12
        got = {(r.json()["model"], r.json()["version"], _top(r.json())) for r in answers}
        assert got == {("big", "1", 1), ("small", "2", 3), ("small", "1", 2)}
        assert _classify(server.url, "?model=small&version=7").status_code == 404
        assert _classify(server.url, "?model=nope").status_code == 404
        client = triton.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            x = np.zeros((2, 3, 24, 24), np.float32)
            inp = triton.InferInput("images", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            res = client.infer("small", [inp], model_version="1")
            assert res.as_numpy("logits").argmax(1).tolist() == [2, 2]
            assert {r["name"] for r in client.get_model_repository_index()} == {"big", "small"}
        finally:
            client.close()


def test_a_version_rewritten_in_place_is_reloaded_without_a_failed_request(
        server: ServerProcess, repo: Path, client: triton.InferenceServerClient) -> None:
    staging = repo.parent / "staging-multi-1"
    constant_artifact(staging, 8)
    log: list[tuple[float, float, int, str, int]] = []
    load = threading.Thread(target=lambda: asyncio.run(_hammer(server.url, 300, 8, log, "multi&version=1")))
    load.start()
    while len(log) < 50 and load.is_alive():
        time.sleep(0.01)
    shutil.rmtree(repo / "multi" / "1")
    staging.rename(repo / "multi" / "1")
    client.load_model("multi")  # version 1 changed on disk: reloaded, the old copy drained
    load.join(60)
    assert {s for _, _, s, _, _ in log} == {200}, log
    tops = [top for *_, top in log]
    assert tops[0] == 4 and tops[-1] == 8 and set(tops) == {4, 8}


def test_load_model_picks_what_explicit_loads_at_startup(repo: Path) -> None:
    """Triton's --load-model: only the named models at startup (the first is the default model); '*': all."""
    with serving(repo, "--model-control", "explicit", "--load-model", "keep", "--load-model", "gone") as server:
        client = triton.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            rows = {r["name"]: r for r in client.get_model_repository_index()}
            assert rows["keep"]["state"] == rows["gone"]["state"] == "READY"
            assert (rows["swap"]["state"], rows["swap"]["reason"]) == ("UNAVAILABLE", "unloaded")
            assert not client.is_model_ready("swap") and client.is_model_ready("gone")
            r = _classify(server.url)
            assert r.status_code == 200 and r.json()["model"] == "keep"
            assert _classify(server.url, "?model=swap").status_code == 404
            client.load_model("swap")
            assert _classify(server.url, "?model=swap").status_code == 200
        finally:
            client.close()
    with serving(repo, "--model-control", "explicit", "--load-model", "*", "--default-model", "swap") as server:
        assert {m["name"] for m in httpx.get(server.url + "/v1/models").json()["models"]} >= {"swap", "keep", "multi"}
