"""With an API key every route but health needs ``Authorization: Bearer <key>``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.helpers import encode, image, running_server


@pytest.fixture(scope="module")
def secured(tiny_artifact: Path) -> Iterator[str]:
    with running_server(tiny_artifact, api_key="s3cret") as url:
        yield url


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"])
def test_health_is_open(secured: str, path: str) -> None:
    assert httpx.get(secured + path).status_code == 200


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/", "/v2/models/tiny-mean", "/docs"])
def test_other_routes_need_the_key(secured: str, path: str) -> None:
    r = httpx.get(secured + path)
    err = r.json()["error"]  # under /v2 the Open Inference Protocol's {"error": "message"}
    assert r.status_code == 401 and ("API key" in err if path.startswith("/v2") else err["code"] == "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(secured + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(secured + path, headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_classify_with_and_without_key(secured: str) -> None:
    kw = {"content": encode(image()), "headers": {"content-type": "image/png"}}
    assert httpx.post(secured + "/classify", **kw).status_code == 401
    kw["headers"]["Authorization"] = "Bearer s3cret"
    assert httpx.post(secured + "/classify", **kw).status_code == 200
