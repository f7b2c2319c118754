"""POST /v2/models/{m}/infer before FastAPI: which requests take it, and that it answers exactly as FastAPI's
route does (two real servers on 127.0.0.1, one of them with the fast path switched off)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest

from irpe.server.http.infer_fast import infer_params
from tests.server.helpers import serving_app, wait_ready


@pytest.mark.parametrize(("method", "path", "want"), [
    ("POST", "/v2/models/m/infer", ("m", None)), ("POST", "/v2/models/m/versions/3/infer", ("m", "3")),
    ("POST", "/v2/models/a b/infer", ("a b", None)), ("GET", "/v2/models/m/infer", None),
    ("POST", "/v2/models/m/infer/", None), ("POST", "/v2/models//infer", None), ("POST", "/v2/models/m", None),
    ("POST", "/v2/models/m/versions//infer", None), ("POST", "/v2/models/a/b/infer", None),
    ("POST", "/classify", None),
])
def test_only_infer_routes_take_the_fast_path(method: str, path: str, want: object) -> None:
    assert infer_params({"type": "http", "method": method, "path": path}) == want


@pytest.fixture(scope="module")
def urls(tiny_artifact: Path) -> Iterator[tuple[str, str]]:
    """(fast path on, fast path off): the same settings, each a real uvicorn server."""
    from irpe.server.config import Settings
    from irpe.server.http.app import create_app

    with ExitStack() as stack:
        out = []
        for fast in (True, False):
            cfg = Settings.from_env(env={}, artifact_dir=str(tiny_artifact), port=0, log_level="warning",
                                    max_wait_ms=2, api_key="k3y", max_body_mb=1)
            app = create_app(cfg)
            if not fast:
                app.infer_stack = None
            url = stack.enter_context(serving_app(app))
            wait_ready(url)
            out.append(url)
        yield out[0], out[1]


def _binary(x: np.ndarray, **extra: object) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"id": "r1", "inputs": [{"name": "images", "datatype": "FP32", "shape": list(x.shape),
                                               "parameters": {"binary_data_size": x.nbytes}}], **extra}).encode()
    return head + x.astype("<f4").tobytes(), {"Inference-Header-Content-Length": str(len(head))}


def _cases() -> list[tuple[str, bytes, dict[str, str]]]:
    x = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    binary, hdr = _binary(x, outputs=[{"name": "logits", "parameters": {"binary_data": True}}])
    classes, chdr = _binary(x[:1], outputs=[{"name": "logits", "parameters": {"classification": 3}}])
    as_json = json.dumps({"id": "j", "inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 32, 32],
                                      "data": x[0].ravel().tolist()}]}).encode()
    bad_shape, bhdr = _binary(x[:, :, :16])
    nan = x[:1].copy()
    nan[0, 0, 0, 0] = np.nan
    nan_body, nhdr = _binary(nan)
    m = "/v2/models/tiny-mean"
    return [(f"{m}/infer", binary, hdr), (f"{m}/versions/1/infer", classes, chdr), (f"{m}/infer", as_json, {}),
            (f"{m}/infer", gzip.compress(binary), {**hdr, "Content-Encoding": "gzip", "Accept-Encoding": "gzip"}),
            (f"{m}/infer", bad_shape, bhdr), (f"{m}/infer", nan_body, nhdr), ("/v2/models/nope/infer", binary, hdr),
            (f"{m}/versions/9/infer", binary, hdr), (f"{m}/infer", b"{", {}),
            (f"{m}/infer", binary, {"Inference-Header-Content-Length": "99999999"}),
            (f"{m}/infer", b"x" * (2 << 20), {})]


def test_fast_and_fastapi_give_the_same_answers_errors_and_headers(urls: tuple[str, str]) -> None:
    """Logits (binary and JSON), classification strings, gzip both ways, 400 (shape, NaN, broken JSON, header
    length), 404 (model, version), 413, 401: same status, body and headers either way."""
    auth = {"Authorization": "Bearer k3y"}
    drop = {"x-request-id", "traceparent", "date", "server"}
    for path, body, headers in _cases():
        a, b = (httpx.post(u + path, content=body, headers={**auth, **headers}) for u in urls)
        assert a.status_code == b.status_code, (path, a.text, b.text)
        assert a.content == b.content, path  # (httpx inflates; every request names its id)
        assert {k: v for k, v in a.headers.items() if k not in drop} == \
            {k: v for k, v in b.headers.items() if k not in drop}, path
    denied = httpx.post(urls[0] + "/v2/models/tiny-mean/infer", content=_cases()[0][1], headers=_cases()[0][2])
    assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
    assert "x-request-id" in denied.headers and denied.json() == {"error": denied.json()["error"]}


def test_metrics_count_fast_requests_under_the_route_template(urls: tuple[str, str]) -> None:
    body, hdr = _binary(np.zeros((1, 3, 32, 32), np.float32))
    auth = {"Authorization": "Bearer k3y"}
    for path in ("/v2/models/tiny-mean/infer", "/v2/models/tiny-mean/versions/1/infer"):
        assert httpx.post(urls[0] + path, content=body, headers={**auth, **hdr}).status_code == 200
    metrics = httpx.get(urls[0] + "/metrics", headers=auth).text
    for route in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        assert any(line.startswith("irpe_requests_total{") and f'route="{route}"' in line and 'status="200"' in line
                   for line in metrics.splitlines()), route


def test_fast_path_traces_refuses_and_counts_as_fastapi_does(urls: tuple[str, str]) -> None:
    """The client's X-Request-Id, a caller's traceparent and tracestate come back alike either way; a request
    without the key is a 401 counted under route "unmatched" (refused before any route is known)."""
    body, hdr = _binary(np.zeros((1, 3, 32, 32), np.float32))
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = {**hdr, "Authorization": "Bearer k3y", "X-Request-Id": "req-7", "traceparent": parent,
              "tracestate": "a=1 , b=2"}
    answers = [httpx.post(u + "/v2/models/tiny-mean/infer", content=body, headers=traced) for u in urls]
    for r in answers:
        assert r.status_code == 200 and r.headers["x-request-id"] == "req-7" and r.json()["id"] == "r1"
        assert r.headers["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
        assert r.headers["traceparent"].endswith("-01") and r.headers["tracestate"] == "a=1,b=2"
    refused = [httpx.post(u + "/v2/models/tiny-mean/infer", content=body, headers=hdr) for u in urls]
    assert [r.status_code for r in refused] == [401, 401] and refused[0].content == refused[1].content
    for u in urls:
        metrics = httpx.get(u + "/metrics", headers={"Authorization": "Bearer k3y"}).text
        assert 'irpe_requests_total{method="POST",route="unmatched",status="401"}' in metrics


def test_unexpected_error_is_a_logged_500_with_the_request_id(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """An inference that raises (not an APIError) answers the JSON 500, keeps the trace headers, is logged
    with its traceback and counted as a 500 of the route."""
    from tests.server.helpers import make_failing_artifact, running_server

    body, hdr = _binary(np.ones((1, 3, 32, 32), np.float32))
    with running_server(make_failing_artifact(tmp_path / "failing")) as url:
        r = httpx.post(url + "/v2/models/failing/infer", content=body, headers={**hdr, "X-Request-Id": "bad-1"})
        metrics = httpx.get(url + "/metrics").text
    assert r.status_code == 500 and r.json() == {"error": "unexpected server error; it has been logged"}
    assert r.headers["x-request-id"] == "bad-1" and r.headers["traceparent"]
    assert 'route="/v2/models/{name}/infer",status="500"' in metrics
    assert any(rec.getMessage().startswith("unhandled error on POST /v2/models/failing/infer") and rec.exc_info
               for rec in caplog.records)
