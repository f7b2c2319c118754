"""Open Inference Protocol (KServe v2 / Triton HTTP) endpoints, JSON and binary tensor data."""

from __future__ import annotations

import json

import httpx
import numpy as np

from tests.server.helpers import LABELS, expected_logits

MODEL = "tiny-mean"


def _images(n: int = 2) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((n, 3, 32, 32), dtype=np.float32)


def test_health_and_metadata(server_url: str) -> None:
    assert httpx.get(server_url + "/v2/health/live").status_code == 200
    assert httpx.get(server_url + "/v2/health/ready").json() == {"ready": True}
    assert "classification" in httpx.get(server_url + "/v2").json()["extensions"]
    meta = httpx.get(f"{server_url}/v2/models/{MODEL}").json()
    assert meta["inputs"] == [{"name": "images", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert meta["outputs"][0]["shape"] == [-1, 10] and meta["platform"] == "onnxruntime_onnx"
    assert httpx.get(f"{server_url}/v2/models/{MODEL}/versions/1").json()["name"] == MODEL
    assert httpx.get(f"{server_url}/v2/models/{MODEL}/ready").json()["ready"] is True
    missing = httpx.get(server_url + "/v2/models/nope")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")


def test_infer_json(server_url: str) -> None:
    x = _images()
    req = {"id": "r1", "inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}
    r = httpx.post(f"{server_url}/v2/models/{MODEL}/infer", json=req)
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == "r1" and body["model_name"] == MODEL
    out = body["outputs"][0]
    assert out["name"] == "logits" and out["shape"] == [2, 10] and out["datatype"] == "FP32"
    assert np.allclose(np.array(out["data"]).reshape(2, 10), expected_logits(x), atol=1e-4)


def test_infer_classification_extension(server_url: str) -> None:
    x = _images(3)
    req = {"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}],
           "outputs": [{"name": "logits", "parameters": {"classification": 2}}]}
    out = httpx.post(f"{server_url}/v2/models/{MODEL}/infer", json=req).json()["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [3, 2]
    want = expected_logits(x)
    for n in range(3):
        for rank in range(2):
            score, index, label = out["data"][n * 2 + rank].split(":")
            assert int(index) == int(np.argsort(-want[n])[rank]) and label == LABELS[int(index)]
            assert abs(float(score) - want[n, int(index)]) < 1e-4


def test_infer_binary_tensor_extension(server_url: str) -> None:
    """The wire format tritonclient.http uses by default (binary input and output)."""
    x = _images()
    header = json.dumps({"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    r = httpx.post(f"{server_url}/v2/models/{MODEL}/infer", content=header + x.tobytes(),
                   headers={"Inference-Header-Content-Length": str(len(header)),
                            "Content-Type": "application/octet-stream"})
    assert r.status_code == 200
    split = int(r.headers["inference-header-content-length"])
    head = json.loads(r.content[:split])
    size = head["outputs"][0]["parameters"]["binary_data_size"]
    logits = np.frombuffer(r.content[split:split + size], dtype=np.float32).reshape(2, 10)
    assert np.allclose(logits, expected_logits(x), atol=1e-4)


def test_infer_bad_input(server_url: str) -> None:
    url = f"{server_url}/v2/models/{MODEL}/infer"
    bad_shape = {"inputs": [{"name": "images", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.0] * 192}]}
    short = {"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.0] * 5}]}
    for req in (bad_shape, short, {"nothing": 1}):
        r = httpx.post(url, json=req)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_input")
    assert httpx.post(url, content=b"{not json").status_code == 400
