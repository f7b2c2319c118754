"""/classify, metadata, health, the page and every error, against a real uvicorn server over HTTP."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest

from irpe.artifact import Preprocess
from irpe.artifact.preprocess import preprocess_image
from tests.server.helpers import LABELS, encode, expected_logits, image, make_failing_artifact, running_server

PP = Preprocess(resize=36, crop=32)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _expected(img_seed: int, size: tuple[int, int] = (64, 48)) -> np.ndarray:
    x = preprocess_image(image(size, seed=img_seed), PP)[None]
    return _softmax(expected_logits(x)[0].astype(np.float64))


def _check(preds: list[dict], probs: np.ndarray, k: int) -> None:
    assert [p["index"] for p in preds] == list(np.argsort(-probs)[:k])
    for p in preds:
        assert p["label"] == LABELS[p["index"]]
        assert abs(p["probability"] - probs[p["index"]]) < 1e-5


def test_classify_multipart_matches_reference(server_url: str) -> None:
    r = httpx.post(server_url + "/classify", files={"file": ("a.png", encode(image(seed=1)), "image/png")})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "tiny-mean" and len(body["predictions"]) == 1
    _check(body["predictions"][0], _expected(1), 5)
    assert {"decode", "queue", "inference", "total"} <= set(body["timing_ms"])


def test_classify_raw_body_and_top_k(server_url: str) -> None:
    r = httpx.post(server_url + "/classify?top_k=3", content=encode(image(seed=2)),
                   headers={"content-type": "image/png"})
    assert r.status_code == 200
    _check(r.json()["predictions"][0], _expected(2), 3)


@pytest.mark.parametrize("change", ["flip_lr", "flip_tb", "transpose", "bgr", "shift"])
def test_served_model_sees_flips_transposes_channels_and_offsets(server_url: str, change: str) -> None:
    """The handmade model weighs every pixel: a server that flipped, transposed, swapped channels or cropped
    off-centre would return other probabilities than the reference computes for the image sent."""
    from PIL import Image

    img = image((64, 64), seed=21)
    variants = {"flip_lr": img.transpose(Image.FLIP_LEFT_RIGHT), "flip_tb": img.transpose(Image.FLIP_TOP_BOTTOM),
                "transpose": img.transpose(Image.TRANSPOSE), "bgr": Image.merge("RGB", img.split()[::-1]),
                "shift": img.crop((4, 0, 68, 64))}
    other = variants[change]
    probs = [_softmax(expected_logits(preprocess_image(i, PP)[None])[0].astype(np.float64)) for i in (img, other)]
    assert np.abs(probs[0] - probs[1]).max() > 0.02  # the change is visible to this model
    files = [("file", (f"{k}.png", encode(i), "image/png")) for k, i in enumerate((img, other))]
    r = httpx.post(server_url + "/classify?top_k=10", files=files)
    assert r.status_code == 200
    for preds, want in zip(r.json()["predictions"], probs, strict=True):
        _check(preds, want, 10)


def test_classify_several_files(server_url: str) -> None:
    files = [("file", (f"{i}.png", encode(image(seed=10 + i)), "image/png")) for i in range(3)]
    r = httpx.post(server_url + "/classify?top_k=10", files=files)
    assert r.status_code == 200
    preds = r.json()["predictions"]
    assert len(preds) == 3
    for i, p in enumerate(preds):
        _check(p, _expected(10 + i), 10)


@pytest.mark.parametrize("query", ["top_k=0", "top_k=11", "top_k=abc"])
def test_top_k_validation_is_422_json(server_url: str, query: str) -> None:
    r = httpx.post(f"{server_url}/classify?{query}", content=encode(image()), headers={"content-type": "image/png"})
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "validation_error" and "top_k" in r.json()["error"]["message"]


@pytest.mark.parametrize(("content", "ctype", "status", "code"), [
    (b"", "image/png", 400, "empty_body"),
    (b"hello", "text/plain", 415, "unsupported_media_type"),
    (b"not an image", "image/jpeg", 415, "unsupported_media_type"),
])
def test_bad_bodies(server_url: str, content: bytes, ctype: str, status: int, code: str) -> None:
    r = httpx.post(server_url + "/classify", content=content, headers={"content-type": ctype})
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)


def test_truncated_image_is_400(server_url: str) -> None:
    data = encode(image((200, 200), seed=4), "JPEG")
    r = httpx.post(server_url + "/classify", files={"file": ("t.jpg", data[: len(data) // 2], "image/jpeg")})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "truncated_image")


def test_missing_file_field(server_url: str) -> None:
    r = httpx.post(server_url + "/classify", files={"image": ("a.png", encode(image()), "image/png")})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "missing_file")


def test_one_bad_image_fails_only_its_request(server_url: str) -> None:
    files = [("file", ("ok.png", encode(image(seed=1)), "image/png")), ("file", ("bad.png", b"garbage", "image/png"))]
    bad = httpx.post(server_url + "/classify", files=files)
    good = httpx.post(server_url + "/classify", files={"file": ("ok.png", encode(image(seed=1)), "image/png")})
    assert bad.status_code == 415 and good.status_code == 200


def test_too_many_pixels_is_413(server_url: str) -> None:
    r = httpx.post(server_url + "/classify", content=encode(big := image((2100, 2000)), "PNG"),
                   headers={"content-type": "image/png"})
    assert big.size[0] * big.size[1] > 4_000_000
    assert (r.status_code, r.json()["error"]["code"]) == (413, "too_many_pixels")


def _raw_exchange(url: str, head: bytes, body_parts: list[bytes]) -> tuple[bytes, int]:
    """Send headers and body parts until the server answers; returns (response, body bytes sent)."""
    u = urlparse(url)
    sent = 0
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(head)
        s.settimeout(0.02)
        response = b""
        for part in body_parts:
            try:
                response = s.recv(65536)
            except TimeoutError:
                response = b""
            if response:
                break
            s.sendall(part)
            sent += len(part)
        s.settimeout(10)
        while b"}}" not in response:  # the JSON error body ends the response
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionError):
                break
            if not chunk:
                break
            response += chunk
        return response, sent


def test_declared_body_over_limit_is_413_before_reading(server_url: str) -> None:
    host = urlparse(server_url).netloc
    head = (f"POST /classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: image/jpeg\r\n"
            f"Content-Length: {50 * 1024 * 1024}\r\n\r\n").encode()
    response, sent = _raw_exchange(server_url, head, [b"x" * 65536] * 800)
    assert response.startswith(b"HTTP/1.1 413")
    assert sent < 5 * 1024 * 1024  # answered long before the 50 MB were sent


def test_streamed_body_over_limit_is_413(server_url: str) -> None:
    host = urlparse(server_url).netloc
    head = (f"POST /classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: image/jpeg\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"10000\r\n" + b"x" * 65536 + b"\r\n"
    response, sent = _raw_exchange(server_url, head, [chunk] * 800)
    assert response.startswith(b"HTTP/1.1 413") and b"payload_too_large" in response
    assert sent < 10 * 1024 * 1024


def test_unknown_route_and_method_are_json(server_url: str) -> None:
    r = httpx.get(server_url + "/no/such/route")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    r = httpx.get(server_url + "/classify")
    assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")


def test_health_models_page_docs(server_url: str) -> None:
    assert httpx.get(server_url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(server_url + "/readyz").json() == {"status": "ready"}
    meta = httpx.get(server_url + "/v1/models").json()["models"][0]
    assert meta["name"] == "tiny-mean" and meta["num_classes"] == 10 and meta["labels"] == LABELS
    assert meta["providers"] == ["CPUExecutionProvider"] and meta["batch_sizes"] == [1, 2, 4]
    assert meta["preprocess"]["crop"] == 32
    assert httpx.get(server_url + "/v1/models/tiny-mean").json()["name"] == "tiny-mean"
    assert httpx.get(server_url + "/v1/models/other").status_code == 404
    page = httpx.get(server_url + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"] and "canvas" in page.text
    js = httpx.get(server_url + "/static/app.js")
    assert js.status_code == 200 and "/classify" in js.text
    assert httpx.get(server_url + "/docs").status_code == 200
    spec = httpx.get(server_url + "/openapi.json").json()
    assert "/classify" in spec["paths"] and "/v2/models/{name}/infer" in spec["paths"]


def test_metrics_exposition(server_url: str) -> None:
    httpx.post(server_url + "/classify", content=encode(image()), headers={"content-type": "image/png"})
    httpx.get(server_url + "/missing")
    text = httpx.get(server_url + "/metrics").text
    assert 'irpe_requests_total{method="POST",route="/classify",status="200"}' in text
    assert 'route="unmatched",status="404"' in text
    for name in ("irpe_request_latency_seconds_bucket", "irpe_queue_wait_seconds_bucket", "irpe_batch_size_bucket",
                 "irpe_inference_seconds_bucket", "irpe_queue_depth", "irpe_decode_seconds_bucket"):
        assert name in text


def test_unexpected_error_is_logged_json_500_and_server_survives(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    art = make_failing_artifact(tmp_path / "failing")
    with running_server(art) as url:
        r = httpx.post(url + "/classify", content=encode(image()), headers={"content-type": "image/png"})
        zeros = {"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.0] * 3072}]}
        after = httpx.post(url + "/v2/models/failing/infer", json=zeros)
        metrics = httpx.get(url + "/metrics").text
    assert r.status_code == 500 and r.json() == {"error": {"code": "internal_error",
                                                           "message": "unexpected server error; it has been logged"}}
    assert after.status_code == 200  # the inference thread survived the failed batch
    assert 'route="/classify",status="500"' in metrics
    assert any("inference failed" in rec.getMessage() for rec in caplog.records)


def test_too_many_files_is_413(server_url: str) -> None:
    tiny = encode(image((4, 4)))
    for n in (257, 300):  # the limit is --max-queue (256 here)
        files = [("file", (f"{i}.png", tiny, "image/png")) for i in range(n)]
        r = httpx.post(server_url + "/classify", files=files)
        assert (r.status_code, r.json()["error"]["code"]) == (413, "too_many_files")


def _multipart(parts: list[tuple[str, str | None, bytes]], boundary: str = "irpe-test-boundary") -> dict:
    """httpx kwargs for a hand-built multipart body: (field name, filename or None, content) per part."""
    chunks = []
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        chunks.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n")
    return {"content": b"".join(chunks) + f"--{boundary}--\r\n".encode(),
            "headers": {"content-type": f"multipart/form-data; boundary={boundary}"}}


def test_file_part_without_filename_is_a_file(server_url: str) -> None:
    """A ``file`` part with no filename is read as raw image bytes (not decoded as a text field)."""
    data = encode(image(seed=3))
    assert b"\x89PNG" in data  # not valid UTF-8: a text-field decode would have mangled it
    r = httpx.post(server_url + "/classify?top_k=3", **_multipart([("file", None, data)]))
    assert r.status_code == 200, r.text
    _check(r.json()["predictions"][0], _expected(3), 3)


def test_file_parts_with_and_without_filename_are_both_classified(server_url: str) -> None:
    parts = [("file", None, encode(image(seed=1))), ("note", None, b"just text"),
             ("file", "two.png", encode(image(seed=2)))]
    r = httpx.post(server_url + "/classify?top_k=2", **_multipart(parts))
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert len(preds) == 2  # the text field "note" is ignored, both file parts count, in order
    _check(preds[0], _expected(1), 2)
    _check(preds[1], _expected(2), 2)


def test_file_part_without_filename_holding_text_is_415_not_missing_file(server_url: str) -> None:
    r = httpx.post(server_url + "/classify", **_multipart([("file", None, b"hello, not an image")]))
    assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")


def test_text_fields_under_other_names_are_ignored(server_url: str) -> None:
    only_text = httpx.post(server_url + "/classify", **_multipart([("image", None, encode(image()))]))
    assert (only_text.status_code, only_text.json()["error"]["code"]) == (400, "missing_file")
    assert "image" in only_text.json()["error"]["message"]


def test_top_k_orders_like_a_stable_argsort() -> None:
    """The O(n) selection returns exactly the first k of a stable argsort, ties included."""
    from irpe.server.pipeline.topk import top_k

    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 1001))
        z = rng.standard_normal(n).astype(np.float32)
        if trial % 3 == 0:
            z = np.round(z, 1)  # many ties
        k = int(rng.integers(1, n + 1))
        p = np.exp(z.astype(np.float64) - z.max())
        want = np.argsort(-(p / p.sum()), kind="stable")[:k].tolist()
        got = top_k(z, k, [str(i) for i in range(n)])
        assert [d["index"] for d in got] == want
        assert abs(sum(d["probability"] for d in top_k(z, n, [""] * n)) - 1.0) < 1e-9
