"""Odd input against a real ``irpe serve``: odd version numbers are a 404, never a 500 with a traceback; a
path cannot forge a log line before the key check; ``tracestate`` is passed on only when W3C's grammar and
limits allow it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.reliability.procs import ServerProcess, server_env, serving, start_server
from tests.server.helpers import encode, image

MODEL = "tiny-mean"
SUPERSCRIPT_TWO = "%C2%B2"  # '²'.isdigit() is true, int('²') raises
HUGE = "9" * 5000  # int() of over 4300 digits raises


@pytest.fixture(scope="module")
def server(tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, "--max-wait-ms", "1", "--log-level", "info") as s:
        yield s


@pytest.mark.parametrize("version", [SUPERSCRIPT_TWO, HUGE, "%D9%A1", "-1", "1.0", " 1"])
def test_odd_versions_are_a_404_not_a_500(server: ServerProcess, version: str) -> None:
    """'²' and a 5,000-digit version are no version: a 404, never a 500 with a traceback."""
    base = f"{server.url}/v2/models/{MODEL}/versions/{version}"
    answers = [httpx.get(base + tail, timeout=30) for tail in ("", "/config", "/ready", "/stats")]
    answers.append(httpx.post(base + "/infer", json={"inputs": []}, timeout=30))
    png = encode(image())
    for query in (f"version={version}", f"version={version}&top_k=1&top_k=1"):  # fast path, then FastAPI's
        answers.append(httpx.post(f"{server.url}/classify?{query}", content=png,
                                  headers={"content-type": "image/png"}, timeout=30))
    statuses = [a.status_code for a in answers]  # /ready of a known model: 503 (not ready)
    assert set(statuses) <= {404, 400, 422, 503}, [(a.request.url.path, a.status_code, a.text[:200]) for a in answers]
    assert all(len(a.text) < 1000 for a in answers)  # the 5,000 digits are not echoed
    assert "Traceback" not in server.output()


def _raw(url: str, request: bytes) -> bytes:
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_path_cannot_forge_a_log_line(tiny_artifact: Path) -> None:
    """A percent-encoded newline in the path of a request without the key (401) stays inside one escaped
    access line: it never starts a second line that reads as a genuine one."""
    forged = "2026-01-01 00:00:00,000 INFO irpe.access: 10.0.0.1 \"GET /admin\" 200 1.0ms"
    s = start_server(tiny_artifact, "--log-level", "info", env=server_env(IRPE_API_KEY="k"))
    try:
        target = "/nothing%0A" + forged.replace(" ", "%20").replace('"', "%22") + "%0D%1B[31m"
        answer = _raw(s.url, f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 401")
        long = "/x" * 5000
        assert httpx.get(s.url + long, timeout=10).status_code == 401
        s.stop()
        lines = s.output().splitlines()
        assert not [line for line in lines if line.startswith("2026-01-01")], lines
        access = [line for line in lines if "irpe.access" in line and "/nothing" in line]
        assert len(access) == 1 and "\\n2026-01-01" in access[0] and "\\x1b" in access[0], access
        assert max(len(line) for line in lines if "irpe.access" in line) < 600
    finally:
        s.stop()
        s.log.unlink(missing_ok=True)


PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(("state", "echoed"), [
    ("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
    ("a" * 59_990 + "=b", None),  # over the limits: dropped, not echoed
    (",".join(f"k{i}=v" for i in range(33)), None),  # over 32 members
    ("Upper=1", None), ("k=a=b", None), ("k=", None),
])
def test_tracestate_is_validated(server: ServerProcess, state: str, echoed: str | None) -> None:
    r = httpx.get(server.url + "/healthz", headers={"traceparent": PARENT, "tracestate": state}, timeout=10)
    assert r.status_code == 200 and r.headers.get("tracestate") == echoed
    assert r.headers["traceparent"].split("-")[1] == PARENT.split("-")[1]
