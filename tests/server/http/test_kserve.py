"""Open Inference Protocol conformance, proven by NVIDIA's and KServe's own clients against a real
``irpe serve`` process on 127.0.0.1: tritonclient.http (sync and aio) and kserve's InferenceRESTClient
for every route and every error (each exception is printed: an unprintable error is a failure)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from tests.reliability.procs import ServerProcess, server_env, serving, start_server
from tests.server.helpers import LABELS, expected_logits
from tests.server.kserve_child import run_in_child

MODEL = "tiny-mean"
MAX_QUEUE = 8


@pytest.fixture(scope="module")
def server(tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, "--max-wait-ms", "2", "--max-body-mb", "1", "--max-queue", str(MAX_QUEUE)) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


def _images(n: int = 2, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32), dtype=np.float32)


def _input(x: np.ndarray, binary: bool = True, datatype: str = "FP32") -> triton.InferInput:
    i = triton.InferInput("images", list(x.shape), datatype)
    i.set_data_from_numpy(x, binary_data=binary)
    return i


def _error(call: object, status: int, *needles: str) -> str:
    """Run ``call``; it must raise InferenceServerException with ``status``; print and return its text."""
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    text = str(info.value)  # must not raise (it did when the body was {"error": {...}})
    print(f"{status}: {text}")
    assert info.value.status() == str(status), text
    for needle in needles:
        assert needle in text, text
    return text


def test_health_metadata_config_and_repository(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    assert client.is_model_ready(MODEL, "1")
    meta = client.get_server_metadata()
    assert {"classification", "binary_tensor_data", "model_configuration", "statistics"} <= set(meta["extensions"])
    model = client.get_model_metadata(MODEL)
    assert model["inputs"] == [{"name": "images", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert model["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert client.get_model_metadata(MODEL, "1") == model
    config = client.get_model_config(MODEL)
    assert config == client.get_model_config(MODEL, "1")
    assert config["max_batch_size"] == MAX_QUEUE and config["platform"] == "onnxruntime_onnx"
    assert config["input"][0]["dims"] == [3, 32, 32] and config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["output"][0]["dims"] == [10]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0  # a lone request never waits
    assert config["parameters"]["busy_fill_wait_us"] == {"string_value": "2000"}
    assert config["instance_group"][0]["name"] == f"{MODEL}_0" and config["optimization"]["priority"]
    assert config["output"][0]["label_filename"] == "labels.txt"
    assert config["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4]
    assert client.get_model_repository_index() == [{"name": MODEL, "version": "1", "state": "READY"}]
    _error(lambda: client.load_model(MODEL), 503, "not allowed if polling is enabled")  # Triton's answer


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_infer_every_wire_format(client: triton.InferenceServerClient, binary: bool, compression: str | None) -> None:
    x = _images()
    out = triton.InferRequestedOutput("logits", binary_data=binary)
    r = client.infer(MODEL, [_input(x, binary)], outputs=[out], request_id="r-1", model_version="1",
                     request_compression_algorithm=compression, response_compression_algorithm=compression)
    assert np.allclose(r.as_numpy("logits"), expected_logits(x), atol=1e-4)
    assert r.get_response()["id"] == "r-1" and r.get_response()["model_name"] == MODEL


def test_request_level_binary_data_output_and_id_always_present(client: triton.InferenceServerClient) -> None:
    """No outputs listed: tritonclient asks for ``binary_data_output: true``; the answer must be binary."""
    x = _images(3)
    r = client.infer(MODEL, [_input(x, binary=False)])
    out = r.get_response()["outputs"][0]
    assert "data" not in out and out["parameters"]["binary_data_size"] == 3 * 10 * 4
    assert np.allclose(r.as_numpy("logits"), expected_logits(x), atol=1e-4)
    assert r.get_response()["id"]  # the server's request id when the client sent none


def test_classification_extension(client: triton.InferenceServerClient) -> None:
    x = _images(3)
    for binary in (True, False):
        out = triton.InferRequestedOutput("logits", binary_data=binary, class_count=2)
        got = client.infer(MODEL, [_input(x)], outputs=[out]).as_numpy("logits")
        assert got.shape == (3, 2)
        want = expected_logits(x)
        for n in range(3):
            for rank in range(2):
                value = got[n, rank]  # bytes from the binary form, str from JSON (as with Triton)
                score, index, label = (value.decode() if isinstance(value, bytes) else value).split(":")
                assert int(index) == int(np.argsort(-want[n])[rank]) and label == LABELS[int(index)]
                assert abs(float(score) - want[n, int(index)]) < 1e-4


def test_statistics_come_from_the_batcher(client: triton.InferenceServerClient) -> None:
    before = client.get_inference_statistics(MODEL)["model_stats"][0]
    client.infer(MODEL, [_input(_images(2))])
    stats = client.get_inference_statistics(MODEL, "1")["model_stats"][0]
    assert client.get_inference_statistics()["model_stats"][0]["name"] == MODEL
    assert stats["inference_count"] == before["inference_count"] + 2
    assert stats["execution_count"] >= before["execution_count"] + 1
    infer = stats["inference_stats"]
    assert infer["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert infer["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert infer["queue"]["count"] == infer["success"]["count"]  # per request, as Triton counts
    assert stats["inference_count"] == before["inference_count"] + 2 and stats["response_stats"] == {}
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]


def test_every_error_is_printable_with_its_status(client: triton.InferenceServerClient) -> None:
    x = _images(1)
    _error(lambda: client.get_model_metadata("nope"), 404, "unknown model", "nope")
    _error(lambda: client.get_model_metadata(MODEL, "2"), 404, "version 2")
    _error(lambda: client.get_model_config("nope"), 404, "nope")
    _error(lambda: client.get_inference_statistics("nope"), 400, "nope")
    assert not client.is_model_ready("nope")
    _error(lambda: client.infer("nope", [_input(x)]), 404, "nope")
    _error(lambda: client.load_model("nope"), 503, "not allowed")
    _error(lambda: client.unload_model(MODEL), 503, "unload is not allowed")
    assert client.get_trace_settings()["trace_level"] == ["OFF"]
    for datatype in ("FP16", "FP64", "INT64"):
        data = x.astype({"FP16": np.float16, "FP64": np.float64, "INT64": np.int64}[datatype])
        _error(lambda d=data, t=datatype: client.infer(MODEL, [_input(d, datatype=t)]), 400, datatype, "expects 'FP32'")
    _error(lambda: client.infer(MODEL, [_input(np.zeros((1, 3, 16, 16), np.float32))]), 400, "shape")
    bad = triton.InferInput("pixels", [1, 3, 32, 32], "FP32")
    bad.set_data_from_numpy(x)
    _error(lambda: client.infer(MODEL, [bad]), 400, "pixels")
    _error(lambda: client.infer(MODEL, [_input(x)], outputs=[triton.InferRequestedOutput("probs")]), 400, "probs")
    twice = [triton.InferRequestedOutput("logits", class_count=3)] * 2
    _error(lambda: client.infer(MODEL, [_input(x)], outputs=twice), 400, "requested once")
    _error(lambda: client.infer(MODEL, [_input(_images(MAX_QUEUE + 1))]), 400, "batch-size must be <= 8")
    _error(lambda: client.infer(MODEL, [_input(np.zeros((100, 3, 32, 32), np.float32))]), 413, "1048576")
    bomb = np.zeros((100, 3, 32, 32), np.float32)  # 1.2 MB inflated from ~1 KB of gzip: over the 1 MB limit
    _error(lambda: client.infer(MODEL, [_input(bomb)], request_compression_algorithm="gzip"), 413, "inflates")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("binary", [True, False])
def test_non_finite_input_is_refused(client: triton.InferenceServerClient, bad: float, binary: bool) -> None:
    """Policy: NaN/Inf inputs are a 400 (binary: counted; JSON: the NaN/Infinity tokens are not JSON)."""
    x = _images(2)
    x[1, 2, 5, 7] = bad
    _error(lambda: client.infer(MODEL, [_input(x, binary)]), 400, "non-finite" if binary else "not JSON")


@pytest.mark.parametrize("class_count", [0, 3])
def test_overflowing_output_is_refused_not_leaked(client: triton.InferenceServerClient, class_count: int) -> None:
    """Finite FP32 input whose mean overflows inside the model: a 400, never NaN/Infinity in the body."""
    x = np.full((1, 3, 32, 32), 3e38, dtype=np.float32)
    out = triton.InferRequestedOutput("logits", binary_data=False, class_count=class_count)
    _error(lambda: client.infer(MODEL, [_input(x, binary=False)], outputs=[out]), 400, "not finite")


def test_aio_client_routes_errors_and_concurrency(server: ServerProcess) -> None:
    async def main() -> None:
        async with triton_aio.InferenceServerClient(server.url.removeprefix("http://")) as c:
            assert await c.is_server_live() and await c.is_server_ready() and await c.is_model_ready(MODEL)
            assert (await c.get_model_config(MODEL))["max_batch_size"] == MAX_QUEUE
            assert (await c.get_model_repository_index())[0]["state"] == "READY"
            assert (await c.get_inference_statistics(MODEL))["model_stats"][0]["name"] == MODEL
            xs = [_images(1, seed=s) for s in range(MAX_QUEUE)]  # more could meet a full queue (503)
            results = await asyncio.gather(*(c.infer(MODEL, [_input(x)], request_compression_algorithm="gzip",
                                                     response_compression_algorithm="gzip") for x in xs))
            for x, r in zip(xs, results, strict=True):
                assert np.allclose(r.as_numpy("logits"), expected_logits(x), atol=1e-4)
            with pytest.raises(InferenceServerException) as info:
                await c.infer(MODEL, [_input(_images(1).astype(np.float16), datatype="FP16")])
            print(f"aio 400: {info.value}")
            assert info.value.status() == "400" and "expects 'FP32'" in str(info.value)
            with pytest.raises(InferenceServerException) as info:
                await c.get_model_metadata("nope")
            print(f"aio 404: {info.value}")
            assert info.value.status() == "404" and "nope" in str(info.value)

    asyncio.run(main())


def test_kserve_client(server: ServerProcess) -> None:
    """The kserve SDK's InferenceRESTClient (in a process of its own: tests/server/kserve_child.py): health,
    model readiness, binary and JSON infer, and its errors."""
    messages = run_in_child("tests.server.http.test_kserve:kserve_client_checks", server.url)
    assert len(messages) == 2, messages
    listing = httpx.get(server.url + "/v2/models").json()  # KServe's list route (no client method for it)
    assert listing == {"models": [MODEL]}


def kserve_client_checks(url: str) -> list[str]:
    """The kserve SDK's side of :func:`test_kserve_client`. Returns the two errors' texts."""
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    async def main() -> list[str]:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
        try:
            assert await client.is_server_live(url) and await client.is_server_ready(url)
            assert await client.is_model_ready(url, MODEL)
            assert not await client.is_model_ready(url, "nope")
            x = _images(2)
            for binary in (True, False):
                inp = InferInput("images", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=binary)
                res = await client.infer(url, InferRequest(MODEL, [inp], request_id="k-1"), model_name=MODEL)
                assert res.id == "k-1" and res.model_name == MODEL
                assert np.allclose(res.outputs[0].as_numpy(), expected_logits(x), atol=1e-4)
            bad = InferInput("images", [1, 3, 32, 32], "FP64")
            bad.set_data_from_numpy(np.zeros((1, 3, 32, 32)), binary_data=True)
            messages = []
            for model, req, needle in ((MODEL, InferRequest(MODEL, [bad]), "expects 'FP32'"),
                                       ("nope", InferRequest("nope", [inp]), "unknown model")):
                with pytest.raises(httpx.HTTPStatusError) as info:
                    await client.infer(url, req, model_name=model)
                assert needle in str(info.value), str(info.value)
                messages.append(str(info.value))
            return messages
        finally:
            await client.close()

    return asyncio.run(main())


    listing = httpx.get(server.url + "/v2/models").json()  # KServe's list route (no client method for it)
    assert listing == {"models": [MODEL]}


def test_gzip_bomb_is_413_with_bounded_memory(server: ServerProcess) -> None:
    """A 64 MB-of-zeros gzip body (~64 KB on the wire) stops inflating at the 1 MB body limit."""
    bomb = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    rss = server.rss_mb()
    r = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", content=bomb, headers={"content-encoding": "gzip"})
    assert r.status_code == 413 and "inflates" in r.json()["error"], r.text
    assert server.rss_mb() - rss < 30


def test_api_key_through_the_clients(tiny_artifact: Path) -> None:
    """With IRPE_API_KEY: tritonclient and kserve send the key as a header; without it a printable 401."""
    proc = start_server(tiny_artifact, "--max-wait-ms", "2", env=server_env(IRPE_API_KEY="s3cret"))
    c = triton.InferenceServerClient(proc.url.removeprefix("http://"))
    try:
        _error(lambda: c.get_model_metadata(MODEL), 401, "API key")
        _error(lambda: c.infer(MODEL, [_input(_images(1))]), 401, "Authorization: Bearer")
        x = _images(1)
        r = c.infer(MODEL, [_input(x)], headers={"Authorization": "Bearer s3cret"})
        assert np.allclose(r.as_numpy("logits"), expected_logits(x), atol=1e-4)
    finally:
        c.close()
        proc.stop()


def test_overload_deadline_and_internal_errors_are_printable(tmp_path: Path) -> None:
    """503 (queue full), 504 (deadline) and 500 (engine failure) through tritonclient.http.aio."""
    from tests.server.helpers import make_failing_artifact, make_slow_artifact

    slow = make_slow_artifact(tmp_path / "slow", matmuls=300)  # each engine call >= 3 s
    with serving(slow, "--max-batch", "1", "--max-queue", "1", "--inference-threads", "1", "--timeout-s", "0.8") as p:
        async def main() -> list[object]:
            async with triton_aio.InferenceServerClient(p.url.removeprefix("http://")) as c:
                first = asyncio.ensure_future(c.infer("slow", [_input(_images(1))]))  # runs, then 504
                await asyncio.sleep(0.3)
                second = asyncio.ensure_future(c.infer("slow", [_input(_images(1))]))  # queued
                await asyncio.sleep(0.2)
                third = c.infer("slow", [_input(_images(1))])  # queue full
                return await asyncio.gather(first, second, third, return_exceptions=True)

        outcomes = asyncio.run(main())
    for e in outcomes:
        print(f"overload: {e}")
    assert all(isinstance(e, InferenceServerException) for e in outcomes), outcomes
    statuses = sorted(e.status() for e in outcomes)  # type: ignore[union-attr]
    assert statuses == ["503", "504", "504"], statuses
    assert any("queue is full" in str(e) for e in outcomes) and any("--timeout-s" in str(e) for e in outcomes)
    with serving(make_failing_artifact(tmp_path / "failing"), "--max-wait-ms", "1") as p:
        c = triton.InferenceServerClient(p.url.removeprefix("http://"))
        try:
            _error(lambda: c.infer("failing", [_input(np.ones((1, 3, 32, 32), np.float32))]), 500, "logged")
            after = c.infer("failing", [_input(np.zeros((1, 3, 32, 32), np.float32))])  # the server carries on
            assert after.as_numpy("logits").shape == (1, 10)
        finally:
            c.close()


def test_trace_logging_and_cuda_shared_memory_routes(server: ServerProcess) -> None:
    """Triton's trace/logging/CUDA shared memory routes answer: logging settings change this process's
    log level; trace files stay off (a request for them is a 400 naming why); CUDA regions cannot be registered."""
    with httpx.Client(base_url=server.url, timeout=10) as c:
        start = c.get("/v2/logging").json()
        assert c.post("/v2/logging", json={"log_verbose_level": 1}).json()["log_verbose_level"] == 1
        quiet = c.post("/v2/logging", json={"log_verbose_level": 0, "log_info": False, "log_warning": False}).json()
        assert (quiet["log_info"], quiet["log_warning"], quiet["log_error"]) == (False, False, True)
        assert c.post("/v2/logging", json={"log_file": "/tmp/x"}).status_code == 400
        assert c.post("/v2/logging", json={"log_info": "yes"}).status_code == 400
        c.post("/v2/logging", json={k: start[k] for k in ("log_info", "log_warning", "log_error")})
        assert c.get("/v2/trace/setting").json()["trace_level"] == ["OFF"]
        r = c.post("/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]})
        assert r.status_code == 400 and "traceparent" in r.json()["error"]
        assert c.post(f"/v2/models/{MODEL}/trace/setting", json={"trace_level": ["OFF"]}).status_code == 200
        assert c.get("/v2/models/nope/trace/setting").status_code == 404
        assert c.get("/v2/cudasharedmemory/status").json() == []
        r = c.post("/v2/cudasharedmemory/region/g/register", json={"raw_handle": {"b64": ""}, "device_id": 0,
                                                                   "byte_size": 8})
        assert r.status_code == 400 and "system shared memory" in r.json()["error"]
        r = c.post("/v2/systemsharedmemory/region/r/register", json={"key": "/x", "offset": 0, "byte_size": 8})
        assert r.status_code == 403 and "--allow-client-shm" in r.json()["error"]
