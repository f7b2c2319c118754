"""Fixtures for the serving tests: the handmade artifact and a shared default server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.helpers import make_artifact, running_server


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch-free ONNX model + model.json (32x32 input, 10 classes)."""
    return make_artifact(tmp_path_factory.mktemp("artifact"))


@pytest.fixture(scope="module")
def server_url(tiny_artifact: Path) -> Iterator[str]:
    """A server with default settings (small limits so the error tests stay cheap)."""
    with running_server(tiny_artifact, max_body_mb=1, max_pixels=4_000_000, max_wait_ms=2) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[Any]:
    """A tritonclient HTTP client of the module's ``server`` fixture (a ServerProcess)."""
    import tritonclient.http as triton

    c = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=120.0)
    yield c
    c.close()
