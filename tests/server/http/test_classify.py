"""POST /classify before FastAPI: which requests take it, and that both ways answer alike (real HTTP)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from irpe.server.http.classify import classify_params
from tests.server.helpers import encode, image, running_server


@pytest.mark.parametrize(("query", "want"), [
    (b"", (5, None, None)), (b"top_k=3", (3, None, None)), (b"top_k=%33", (3, None, None)),
    (b"model=m&version=2", (5, "m", "2")), (b"model=&top_k=1", (1, "", None)), (b"other=1&top_k=7", (7, None, None)),
    (b"top_k=0", None), (b"top_k=abc", None), (b"top_k=-1", None), (b"top_k=1.0", None), (b"top_k=", None),
    (b"top_k=%2B3", None), (b"top_k=3&top_k=3", None), (b"model=a&model=b", None),
])
def test_query_strings_fastapi_would_read_the_same(query: bytes, want: object) -> None:
    """Only a query FastAPI reads exactly so takes the fast path; anything else goes to FastAPI."""
    assert classify_params(query) == want


def _post(url: str, query: str, data: bytes | None = None, **headers: str) -> httpx.Response:
    files = {"file": ("a.png", data if data is not None else encode(image(seed=4)), "image/png")}
    return httpx.post(f"{url}/classify{query}", files=files, headers=headers)


# each pair: the fast path, then the same request sent FastAPI's way (a repeated top_k leaves the fast path)
PAIRS = [("?top_k=3", "?top_k=3&top_k=3"), ("?top_k=99", "?top_k=99&top_k=99"),
         ("?top_k=2&model=nope", "?top_k=2&top_k=2&model=nope"), ("?top_k=2&version=7", "?top_k=2&top_k=2&version=7")]


def test_both_ways_give_the_same_answers_and_errors(tiny_artifact: Path) -> None:
    """Predictions, 422 for top_k over the class count, 404 for an unknown model or version, 400 for a
    broken image, 401 without the key: same status, body and Retry-After either way; metrics count both
    under the /classify route."""
    with running_server(tiny_artifact, max_wait_ms=2, api_key="k3y") as url:
        auth = {"Authorization": "Bearer k3y"}
        for fast, slow in PAIRS:
            a, b = _post(url, fast, **auth), _post(url, slow, **auth)
            assert a.status_code == b.status_code
            body_a, body_b = a.json(), b.json()
            if a.status_code == 200:
                assert body_a["predictions"] == body_b["predictions"]
            else:
                assert body_a == body_b and "error" in body_a
        truncated = encode(image(seed=5))[:200]
        answers = [_post(url, query, truncated, **auth) for query in ("?top_k=3", "?top_k=3&top_k=3")]
        assert [a.status_code for a in answers] == [400, 400] and answers[0].json() == answers[1].json()
        for query in ("?top_k=3", "?top_k=3&top_k=3"):
            denied = _post(url, query)
            assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
            assert "x-request-id" in denied.headers and "traceparent" in denied.headers
        metrics = httpx.get(url + "/metrics", headers=auth).text
    ok = [line for line in metrics.splitlines() if line.startswith("irpe_requests_total{")
          and 'route="/classify"' in line and 'status="200"' in line]
    assert ok and float(ok[0].rsplit(" ", 1)[1]) >= 2  # one fast, one FastAPI
