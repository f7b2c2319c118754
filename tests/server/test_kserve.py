"""Open Inference Protocol (KServe v2 / Triton HTTP) endpoints, JSON and binary tensor data."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

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


def _strict_json(text: bytes) -> object:
    """json.loads that refuses the NaN / Infinity / -Infinity tokens Python's json accepts by default."""
    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in a response body")
    return json.loads(text, parse_constant=refuse)


def _infer_json_text(x: np.ndarray, datatype: str = "FP32") -> bytes:
    """A JSON infer request; non-finite values become the (non-standard) NaN/Infinity tokens."""
    req = {"inputs": [{"name": "images", "shape": list(x.shape), "datatype": datatype,
                       "data": x.reshape(-1).astype(np.float64).tolist()}]}
    return json.dumps(req, allow_nan=True).encode()


def _infer_binary(x: np.ndarray, datatype: str = "FP32") -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "images", "shape": list(x.shape), "datatype": datatype,
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("wire", ["json", "binary"])
def test_non_finite_input_is_400_invalid_input(server_url: str, bad: float, wire: str) -> None:
    x = _images(2)
    x[1, 2, 5, 7] = bad
    body, headers = (_infer_json_text(x), {}) if wire == "json" else _infer_binary(x)
    assert (b"NaN" in body or b"Infinity" in body) == (wire == "json")  # the request really carries it
    r = httpx.post(f"{server_url}/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert r.status_code == 400, r.text
    body_json = _strict_json(r.content)
    assert body_json["error"]["code"] == "invalid_input" and "non-finite" in body_json["error"]["message"]


@pytest.mark.parametrize("wire", ["json", "binary"])
def test_fp64_beyond_fp32_range_is_refused(server_url: str, wire: str) -> None:
    x = np.zeros((1, 3, 32, 32), dtype=np.float64)
    x[0, 0, 0, 0] = 1e300  # finite in FP64, +inf once cast to FP32
    body, headers = (_infer_json_text(x, "FP64"), {}) if wire == "json" else _infer_binary(x, "FP64")
    r = httpx.post(f"{server_url}/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert (r.status_code, _strict_json(r.content)["error"]["code"]) == (400, "invalid_input")


@pytest.mark.parametrize("classification", [0, 3])
@pytest.mark.parametrize("wire", ["json", "binary"])
def test_overflowing_output_never_leaks_nan(server_url: str, wire: str, classification: int) -> None:
    """Finite FP32 input whose mean overflows inside the model: a 400, never NaN/Infinity in the body."""
    x = np.full((1, 3, 32, 32), 3e38, dtype=np.float32)
    body, headers = (_infer_json_text(x), {}) if wire == "json" else _infer_binary(x)
    if classification:
        req = json.loads(body[:int(headers.get("Inference-Header-Content-Length", len(body)))])
        req["outputs"] = [{"name": "logits", "parameters": {"classification": classification}}]
        head = json.dumps(req).encode()
        body = head + body[len(body) - x.nbytes:] if headers else head
        headers = {"Inference-Header-Content-Length": str(len(head))} if headers else {}
    r = httpx.post(f"{server_url}/v2/models/{MODEL}/infer", content=body, headers=headers)
    answer = _strict_json(r.content)
    assert r.status_code == 400 and "outputs" not in answer and answer["error"]["code"] == "invalid_input"


def test_finite_answers_are_strict_json(server_url: str) -> None:
    x = _images(2) * 1e3
    for classification in (0, 2):
        req = json.loads(_infer_json_text(x))
        req["outputs"] = [{"name": "logits", "parameters": {"classification": classification}}]
        r = httpx.post(f"{server_url}/v2/models/{MODEL}/infer", json=req)
        assert r.status_code == 200
        assert _strict_json(r.content)["outputs"][0]["shape"][0] == 2
