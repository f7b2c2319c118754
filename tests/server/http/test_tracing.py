"""Tracing against a real ``irpe serve``: W3C traceparent accepted and echoed, request ids in the answer
and the access log, and spans exported by OpenTelemetry's OTLP/HTTP exporter to a collector stand-in
on 127.0.0.1 (a tiny HTTP server decoding ``ExportTraceServiceRequest`` protobufs)."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from irpe.server.http.tracing import parse_traceparent, printable, request_id_from
from tests.reliability.procs import ServerProcess, server_env, start_server
from tests.server.helpers import encode, free_port, image
from tests.server.kserve_child import run_in_child

MODEL = "tiny-mean"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Collector(http.server.ThreadingHTTPServer):
    """Receives OTLP/HTTP protobuf trace exports on /v1/traces and keeps the spans."""

    def __init__(self, port: int):
        super().__init__(("127.0.0.1", port), _Handler)
        self.spans: list[object] = []
        self.resources: list[dict[str, str]] = []

    def wait_for(self, predicate: object, timeout: float = 15.0) -> list[object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for s in list(self.spans) if predicate(s)]  # type: ignore[operator]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no matching span within {timeout}s; got {[s.name for s in self.spans]}")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["content-length"]))
        encoding = self.headers.get("content-encoding", "")
        body = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body) if encoding == "deflate" \
            else body
        assert self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
        req = ExportTraceServiceRequest.FromString(body)
        server: Collector = self.server  # type: ignore[assignment]
        for rs in req.resource_spans:
            server.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                server.spans.extend(ss.spans)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector(free_port())
    thread = threading.Thread(target=c.serve_forever, daemon=True)
    thread.start()
    yield c
    c.shutdown()
    c.server_close()


@pytest.fixture(scope="module")
def traced(tiny_artifact: Path, collector: Collector) -> Iterator[ServerProcess]:
    env = server_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_address[1]}",
                     OTEL_BSP_SCHEDULE_DELAY="100", OTEL_SERVICE_NAME="irpe-test")
    proc = start_server(tiny_artifact, "--max-wait-ms", "2", "--log-level", "info", env=env)
    yield proc
    proc.stop()
    proc.log.unlink(missing_ok=True)


def test_traceparent_parsing() -> None:
    ok = parse_traceparent(f"00-{TRACE_ID}-{PARENT}-01")
    assert ok is not None and (ok.trace_id, ok.span_id, ok.flags) == (TRACE_ID, PARENT, "01")
    assert parse_traceparent(f"01-{TRACE_ID}-{PARENT}-00-future") is not None  # later versions may add fields
    for bad in (None, "", "garbage", f"00-{TRACE_ID}-{PARENT}-01-extra", f"ff-{TRACE_ID}-{PARENT}-01",
                f"00-{'0' * 32}-{PARENT}-01", f"00-{TRACE_ID}-{'0' * 16}-01", f"00-{TRACE_ID.upper()}-{PARENT}-01"):
        assert parse_traceparent(bad) is None, bad
    assert request_id_from("abc-123") == "abc-123"
    for bad in (None, "", "x" * 200, "a b", "new\nline"):
        assert len(request_id_from(bad)) == 32


@pytest.mark.parametrize(("text", "limit", "want"), [
    ("/v2/models/m/infer", 200, "/v2/models/m/infer"), ("POST", 16, "POST"), ("a b~", 200, "a b~"),
    ('/a"b', 200, '/a\\"b'), ("/a\\b", 200, "/a\\\\b"), ("/a\nb\tc\x7f", 200, "/a\\nb\\tc\\x7f"),
    ("/é☃", 200, "/\\xe9\\u2603"), ("x" * 17, 16, "x" * 16 + "...(17 chars)"), ("", 200, "")])
def test_printable_escapes_what_could_forge_a_line(text: str, limit: int, want: str) -> None:
    """Printable ASCII passes as it is; quotes, backslashes, control characters and non-ASCII are escaped;
    longer strings are cut at ``limit``."""
    assert printable(text, limit) == want


def test_kserve_infer_span_is_a_child_of_the_callers(traced: ServerProcess, collector: Collector) -> None:
    headers = run_in_child("tests.server.http.test_tracing:kserve_infer_headers", traced.url)
    echoed = parse_traceparent(headers["traceparent"])
    assert echoed is not None and echoed.trace_id == TRACE_ID and echoed.span_id != PARENT
    assert headers["x-request-id"] == "req-42" and headers["tracestate"] == "k=v"
    (span,) = collector.wait_for(lambda s: s.trace_id.hex() == TRACE_ID)
    assert span.parent_span_id.hex() == PARENT and span.span_id.hex() == echoed.span_id
    assert span.name == "POST /v2/models/{name}/infer" and span.kind == span.SPAN_KIND_SERVER
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["irpe.request_id"].string_value == "req-42"
    assert attrs["http.response.status_code"].int_value == 200
    assert {"service.name": "irpe-test"}.items() <= collector.resources[-1].items()
    deadline = time.monotonic() + 5
    while "request_id=req-42" not in traced.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(ln for ln in traced.output().splitlines() if "request_id=req-42" in ln)
    print(line)
    assert "irpe.access" in line and "/v2/models/tiny-mean/infer" in line and f"trace_id={TRACE_ID}" in line


def test_without_traceparent_a_new_trace_starts_and_errors_are_spans_too(traced: ServerProcess,
                                                                         collector: Collector) -> None:
    r = httpx.post(traced.url + "/classify", content=encode(image()), headers={"content-type": "image/png"})
    assert r.status_code == 200
    mine = parse_traceparent(r.headers["traceparent"])
    assert mine is not None and len(r.headers["x-request-id"]) == 32
    (span,) = collector.wait_for(lambda s: s.trace_id.hex() == mine.trace_id)
    assert span.parent_span_id == b"" and span.name == "POST /classify"
    body = {"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.0] * 3072}]}
    r = httpx.post(f"{traced.url}/v2/models/{MODEL}/infer", json=body)
    assert r.json()["id"] == r.headers["x-request-id"]  # no id in the request: the request id is the answer's
    bad = httpx.get(traced.url + "/v2/models/nope", headers={"traceparent": "not-a-trace"})
    assert bad.status_code == 404 and "nope" in bad.json()["error"]
    other = parse_traceparent(bad.headers["traceparent"])
    assert other is not None and other.trace_id != mine.trace_id
    (span,) = collector.wait_for(lambda s: s.trace_id.hex() == other.trace_id)
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["http.response.status_code"].int_value == 404


def kserve_infer_headers(url: str) -> dict[str, str]:
    """One infer through the kserve SDK's InferenceRESTClient with a traceparent, tracestate and x-request-id (in a
    process of its own: tests/server/kserve_child.py). Returns the response's headers."""
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    async def main() -> dict[str, str]:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
        x = InferInput("images", [1, 3, 32, 32], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32), binary_data=True)
        seen: dict[str, str] = {}
        req = InferRequest(MODEL, [x])  # kserve adds a uuid id when sending
        try:
            res = await client.infer(url, req, model_name=MODEL, response_headers=seen,
                                     headers={"traceparent": f"00-{TRACE_ID}-{PARENT}-01", "tracestate": "k=v",
                                              "x-request-id": "req-42"})
        finally:
            await client.close()
        assert res.id  # kserve sends a uuid of its own; it is echoed
        return dict(seen)

    return asyncio.run(main())
