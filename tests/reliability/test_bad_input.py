"""Bad-input battery over real HTTP against a real ``irpe serve``: every answer is the documented 2xx/4xx
with the JSON error shape, never a 5xx, and the server keeps answering normal requests afterwards."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest

from irpe.artifact import Preprocess
from irpe.artifact.preprocess import preprocess_image
from tests.reliability.inputs import (
    animated_gif,
    infer_body,
    jpeg_bomb,
    palette_png,
    png_bad_crc,
    png_bomb,
    sixteen_bit_png,
)
from tests.reliability.procs import ServerProcess
from tests.reliability.record import record
from tests.server.helpers import CROP, LABELS, encode, expected_logits, image

PNG = encode(image())
JPEG = encode(image(), "JPEG", quality=85)
MB = 1024 * 1024
INFER = "/v2/models/tiny-mean/infer"
ERROR_STATUSES = {400, 404, 405, 413, 415, 422}


@dataclass
class Case:
    """One request and the answers it may get (``code``: the expected error code, if one is documented)."""

    name: str
    kwargs: dict[str, Any]
    expect: set[int]
    code: str | None = None
    path: str = "/classify"
    method: str = "POST"
    images: int = field(default=1)


def raw(data: bytes, ctype: str = "image/png") -> dict[str, Any]:
    return {"content": data, "headers": {"content-type": ctype}}


def form(*files: tuple[str, str, bytes, str], data: dict[str, str] | None = None) -> dict[str, Any]:
    return {"files": [(field_, (name, blob, ctype)) for field_, name, blob, ctype in files], "data": data}


def chunks(total: int, size: int = MB) -> Iterator[bytes]:
    """A body without Content-Length (chunked transfer encoding)."""
    block = os.urandom(size)
    for _ in range(total // size):
        yield block


def cases() -> list[Case]:
    big = os.urandom(25 * MB)
    return [
        Case("empty raw body", raw(b""), {400}, "empty_body"),
        Case("empty body, no content type", {"content": b""}, {400}, "empty_body"),
        Case("wrong content type text/plain", raw(PNG, "text/plain"), {415}, "unsupported_media_type"),
        Case("JSON body to /classify", {"json": {"image": "x"}}, {415}, "unsupported_media_type"),
        Case("text sent as image/png", raw(b"hello, I am not an image\n" * 20), {415}, "unsupported_media_type"),
        Case("truncated JPEG (half)", raw(JPEG[: len(JPEG) // 2], "image/jpeg"), {400}),
        Case("truncated PNG (half)", raw(PNG[: len(PNG) // 2]), {400}),
        Case("PNG signature only", raw(PNG[:8]), {400, 415}),
        Case("JPEG SOI + garbage", raw(b"\xff\xd8\xff\xe0" + os.urandom(2000), "image/jpeg"), {400, 415}),
        Case("PNG with corrupt IHDR CRC", raw(png_bad_crc()), {400, 415}),
        Case("1x1 image", raw(encode(image((1, 1)))), {200}),
        Case("1x100000 image (resize would be 36x3.6M)", raw(encode(image((1, 100_000)))), {413}, "too_many_pixels"),
        Case("1x1000 image", raw(encode(image((1, 1000)))), {200}),
        Case("100x1 image", raw(encode(image((100, 1)))), {200}),
        Case("PNG bomb 100000x100000 in ~100 bytes", raw(png_bomb()), {413}, "too_many_pixels"),
        Case("PNG bomb 10000x10000 (above --max-pixels)", raw(png_bomb(10_000, 10_000)), {413}, "too_many_pixels"),
        Case("JPEG claiming 65000x65000", raw(jpeg_bomb(), "image/jpeg"), {413}, "too_many_pixels"),
        Case("16-bit grayscale PNG", raw(sixteen_bit_png()), {200}),
        Case("CMYK JPEG", raw(encode(image(mode="CMYK"), "JPEG"), "image/jpeg"), {200}),
        Case("palette PNG", raw(palette_png()), {200}),
        Case("palette PNG with transparency", raw(palette_png(True)), {200}),
        Case("RGBA PNG", raw(encode(image(mode="RGBA"))), {200}),
        Case("LA PNG", raw(encode(image(mode="LA"))), {200}),
        Case("animated GIF (4 frames)", raw(animated_gif(), "image/gif"), {200}),
        Case("TIFF", raw(encode(image(), "TIFF"), "image/tiff"), {200}),
        Case("WebP", raw(encode(image(), "WEBP"), "image/webp"), {200}),
        Case("BMP", raw(encode(image(), "BMP"), "image/bmp"), {200}),
        Case("ICO (not an accepted format)", raw(encode(image((32, 32)), "ICO"), "image/x-icon"), {415}),
        Case("25 MB raw body (Content-Length)", raw(big), {413}, "payload_too_large"),
        Case("25 MB multipart file", form(("file", "big.png", big, "image/png")), {413}, "payload_too_large"),
        Case("25 MB chunked body (no Content-Length)",
             {"content": chunks(25 * MB), "headers": {"content-type": "image/png"}}, {413}, "payload_too_large"),
        Case("multipart with no file field", form(("other", "a.png", PNG, "image/png")), {400}, "missing_file"),
        Case("multipart with only a text field", {"files": {"x": (None, "1")}, "data": {"note": "hi"}}, {400},
             "missing_file"),
        Case("multipart with an empty file", form(("file", "e.png", b"", "image/png")), {400}, "empty_body"),
        Case("multipart without boundary", raw(b"--x\r\n\r\n", "multipart/form-data"), {400}),
        Case("multipart with a wrong boundary", raw(b"--other\r\nContent-Disposition: form-data; name=\"file\""
                                                    b"\r\n\r\nabc\r\n--other--\r\n",
                                                    "multipart/form-data; boundary=zzz"), {400}),
        Case("multipart, truncated mid-part", raw(b"--zzz\r\nContent-Disposition: form-data; name=\"file\"; "
                                                  b"filename=\"a.png\"\r\n\r\n" + PNG[:100],
                                                  "multipart/form-data; boundary=zzz"), {200, 400}),
        Case("20 files in one request", form(*[("file", f"{i}.png", encode(image(seed=i)), "image/png")
                                               for i in range(20)]), {200}, images=20),
        Case("file name ../../etc/passwd", form(("file", "../../etc/passwd", PNG, "image/png")), {200}),
        Case("file name C:\\Windows\\win.ini", form(("file", "C:\\Windows\\win.ini", PNG, "image/png")), {200}),
        Case("unicode file name", form(("file", "ñandú 😀 файл.png", PNG, "image/png")), {200}),
        Case("10k-character file name", form(("file", "a" * 10_000 + ".png", PNG, "image/png")), {200, 400}),
        Case("file part typed text/plain", form(("file", "a.txt", PNG, "text/plain")), {200}),
        Case("top_k=0", {**raw(PNG), "params": {"top_k": 0}}, {422}, "validation_error"),
        Case("top_k=-1", {**raw(PNG), "params": {"top_k": -1}}, {422}, "validation_error"),
        Case("top_k=10^9", {**raw(PNG), "params": {"top_k": 10**9}}, {422}, "validation_error"),
        Case("top_k=10^30", {**raw(PNG), "params": {"top_k": 10**30}}, {422}, "validation_error"),
        Case("top_k=abc", {**raw(PNG), "params": {"top_k": "abc"}}, {422}, "validation_error"),
        Case("top_k=1.5", {**raw(PNG), "params": {"top_k": "1.5"}}, {422}, "validation_error"),
        Case("top_k=10 (= num_classes)", {**raw(PNG), "params": {"top_k": 10}}, {200}),
        Case("GET /classify", {}, {405}, method="GET"),
        Case("unknown route", {}, {404}, path="/nope"),
        Case("infer: unknown model", {"json": infer_body()}, {404}, "model_not_found", path="/v2/models/x/infer"),
        Case("infer: version 2", {"json": infer_body()}, {404}, path="/v2/models/tiny-mean/versions/2/infer"),
        Case("infer: not JSON", {"content": b"\x00\x01garbage"}, {400}, "invalid_input", path=INFER),
        Case("infer: JSON nested 100000 deep", {"content": b"[" * 100_000}, {400}, path=INFER),
        Case("infer: empty object", {"json": {}}, {400}, "invalid_input", path=INFER),
        Case("infer: two inputs", {"json": {"inputs": infer_body()["inputs"] * 2}}, {400}, path=INFER),
        Case("infer: wrong shape [1,3,31,32]", {"json": infer_body((1, 3, 31, 32))}, {400}, "invalid_input",
             path=INFER),
        Case("infer: 3-d shape", {"json": infer_body((3, 32, 32))}, {400}, "invalid_input", path=INFER),
        Case("infer: batch 0", {"json": infer_body((0, 3, 32, 32))}, {400}, "invalid_input", path=INFER),
        Case("infer: batch -1", {"json": infer_body((-1, 3, 32, 32), data=[0.0] * 3072)}, {400}, path=INFER),
        Case("infer: batch 'abc'", {"json": infer_body(["abc", 3, 32, 32], data=[0.0] * 3072)}, {400}, path=INFER),
        Case("infer: batch null", {"json": infer_body([None, 3, 32, 32], data=[0.0] * 3072)}, {400}, path=INFER),
        Case("infer: batch 10^12, data for 1", {"json": infer_body([10**12, 3, 32, 32], data=[0.0] * 3072)},
             {400}, path=INFER),
        Case("infer: too little data", {"json": infer_body(data=[0.0] * 100)}, {400}, "invalid_input", path=INFER),
        Case("infer: datatype INT64", {"json": infer_body(datatype="INT64")}, {400}, "invalid_input", path=INFER),
        Case("infer: datatype BYTES", {"json": infer_body(datatype="BYTES")}, {400}, path=INFER),
        Case("infer: datatype as a list", {"json": infer_body(datatype=["FP32"])}, {400}, path=INFER),
        Case("infer: strings as data", {"json": infer_body(data=["x"] * 3072)}, {400}, path=INFER),
        Case("infer: objects as data", {"json": infer_body(data=[{"a": 1}] * 3072)}, {400}, path=INFER),
        Case("infer: parameters is a string", {"json": {"inputs": [{**infer_body()["inputs"][0],
                                                                     "parameters": "x"}]}}, {400}, path=INFER),
        Case("infer: binary_data_size beyond the body",
             {"content": json.dumps({"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 32, 32],
                                                 "parameters": {"binary_data_size": 12288}}]}).encode(),
              "headers": {"inference-header-content-length": "999999"}}, {400}, path=INFER),
        Case("infer: outputs as strings", {"json": infer_body(outputs=["logits"])}, {400}, path=INFER),
        Case("infer: unknown output", {"json": infer_body(outputs=[{"name": "x"}])}, {400}, path=INFER),
        Case("infer: classification 'abc'",
             {"json": infer_body(outputs=[{"name": "logits", "parameters": {"classification": "abc"}}])},
             {400}, path=INFER),
        Case("infer: classification -1",
             {"json": infer_body(outputs=[{"name": "logits", "parameters": {"classification": -1}}])},
             {400}, path=INFER),
        Case("infer: 300 images (> max_batch_size)", {"json": infer_body((300, 3, 32, 32))}, {400}, path=INFER),
        Case("infer: valid request", {"json": infer_body()}, {200}, path=INFER),
    ]


CASES = cases()


def check_error_shape(r: httpx.Response) -> str:
    """The body is exactly ``{"error": {"code": str, "message": str}}``; returns the code. Under /v2 it is the
    Open Inference Protocol's ``{"error": str}`` (returns "")."""
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"}, body
    if r.request.url.path.startswith("/v2"):
        assert isinstance(body["error"], str) and body["error"], body
        return ""
    err = body["error"]
    assert isinstance(err["code"], str) and err["code"], body
    assert isinstance(err["message"], str) and err["message"], body
    return err["code"]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    """The battery's client; at teardown (after whichever tests of this module ran, in any order) the server
    must still answer correctly and have logged no exception."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
        check_still_answers_correctly(c, server)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_documented_answer(client: httpx.Client, case: Case) -> None:
    try:
        r = client.request(case.method, case.path, **case.kwargs)
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError) as e:
        pytest.fail(f"{case.name}: connection broken before an answer ({e!r})")
    record("bad-input", case.name, r)
    assert r.status_code < 500, r.text
    assert r.status_code in case.expect, f"{case.name}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        code = check_error_shape(r)
        if case.code and code:
            assert code == case.code, r.text
    elif case.path == "/classify":
        body = r.json()
        assert len(body["predictions"]) == case.images
        assert all(len(p) == int(case.kwargs.get("params", {}).get("top_k", 5)) for p in body["predictions"])


def reference_top1(png: bytes) -> str:
    """The label the handmade model gives ``png``, computed without the server."""
    import io

    from PIL import Image

    x = preprocess_image(Image.open(io.BytesIO(png)).convert("RGB"), Preprocess(resize=36, crop=CROP))
    return LABELS[int(np.argmax(expected_logits(x[None])[0]))]


def check_still_answers_correctly(client: httpx.Client, server: ServerProcess) -> None:
    """A normal request succeeds with the right label, and no request made the server log an exception."""
    for seed in range(3):
        png = encode(image(seed=seed))
        r = client.post("/classify", content=png, headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        assert r.json()["predictions"][0][0]["label"] == reference_top1(png)
    assert server.proc.poll() is None
    log = server.output()
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
