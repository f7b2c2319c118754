"""Where the Service decodes: small baseline JPEGs on the event loop, everything else in the decode pool."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from irpe.server.config import Settings
from irpe.server.pipeline import decode as decode_module
from irpe.server.pipeline import service as state_module
from tests.server.helpers import encode, image


def _decode(settings: Settings, blobs: list[bytes]) -> list[np.ndarray]:
    async def run() -> list[np.ndarray]:
        st = state_module.local_service(settings)
        st.load()
        st.warm()
        try:
            return (await st.preprocess(blobs))[0]
        finally:
            st.shutdown()

    return asyncio.run(run())


@pytest.fixture
def threads_seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each decode ran on."""
    seen: list[str] = []
    real = decode_module.prepare

    def spy(*args: object, **kwargs: object) -> np.ndarray:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(decode_module, "prepare", spy)
    return seen


def test_decode_placement_and_same_pixels(tiny_artifact: Path, threads_seen: list[str]) -> None:
    """Default: a baseline JPEG up to 1 Mpx decodes on the loop's thread; progressive, over 1 Mpx and PNG go
    to the pool (one request of one image, and one of several). --decode-threads 1: all in the pool. The
    pixels are the same wherever they were decoded."""
    small = encode(image((64, 48), seed=1), "JPEG", quality=90)
    blobs = [small, encode(image((64, 48), seed=2), "JPEG", progressive=True),
             encode(image((1100, 1000), seed=3), "JPEG"), encode(image((64, 48), seed=4), "PNG")]
    auto = Settings.from_env(env={}, artifact_dir=str(tiny_artifact), max_wait_ms=2)
    here = threading.current_thread().name
    singles = [_decode(auto, [b])[0] for b in blobs]
    assert threads_seen[0] == here and all(t.startswith("irpe-decode") for t in threads_seen[1:])
    threads_seen.clear()
    together = _decode(auto, blobs)
    assert threads_seen.count(here) == 1 and len(threads_seen) == 4
    threads_seen.clear()
    pooled = _decode(Settings.from_env(env={}, artifact_dir=str(tiny_artifact), max_wait_ms=2, decode_threads=1),
                     blobs)
    assert all(t.startswith("irpe-decode") for t in threads_seen) and len(threads_seen) == 4
    for a, b, c in zip(singles, together, pooled, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
