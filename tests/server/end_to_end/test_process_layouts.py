"""One process and ``--frontends 1`` answer the same requests alike: a plain artifact is a one-model
repository in every process layout (the front end routes by the engine's table, it has no model of its own)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.server.helpers import announced_url, encode, image, wait_ready

PNG = {"content-type": "image/png"}
_VOLATILE = {"timing_ms", "ns", "id", "last_inference"}


@contextmanager
def _serve(art: Path, *extra: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", str(art), "--port", "0", "--log-level",
                             "warning", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = announced_url(proc)
        wait_ready(url, timeout=90)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _stable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: "<t>" if k in _VOLATILE else _stable(x) for k, x in v.items()}
    return [_stable(x) for x in v] if isinstance(v, list) else v


def _answers(url: str) -> list[Any]:
    png = encode(image(seed=1))
    x = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    v2 = {"inputs": [{"name": "images", "shape": [2, 3, 32, 32], "datatype": "FP32", "data": x.ravel().tolist()}]}
    asks: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/classify?top_k=3", {"content": png, "headers": PNG}),
        ("POST", "/classify?model=nope", {"content": png, "headers": PNG}),
        ("POST", "/classify?model=tiny-mean&version=7", {"content": png, "headers": PNG}),
        ("GET", "/v1/models", {}), ("GET", "/v2/models/tiny-mean", {}), ("GET", "/v2/models/nope", {}),
        ("GET", "/v2/models/tiny-mean/config", {}), ("GET", "/v2/models/nope/ready", {}),
        ("POST", "/v2/models/tiny-mean/infer", {"json": v2}), ("POST", "/v2/models/nope/infer", {"json": v2}),
        ("GET", "/v2/models/tiny-mean/stats", {}), ("POST", "/v2/repository/index", {}),
        ("POST", "/v2/repository/models/nope/load", {}), ("POST", "/v2/repository/models/tiny-mean/unload", {}),
    ]
    out = []
    with httpx.Client(timeout=30) as c:
        for method, path, kw in asks:
            r = c.request(method, url + path, **kw)
            out.append([method, path, r.status_code, _stable(r.json())])
    return out


def test_one_process_and_frontends_answer_alike(tiny_artifact: Path) -> None:
    with _serve(tiny_artifact) as url:
        one = _answers(url)
    with _serve(tiny_artifact, "--frontends", "1") as url:
        split = _answers(url)
    assert [a[2] for a in one] == [200, 404, 404, 200, 200, 404, 200, 400, 200, 404, 200, 200, 503, 503]
    for a, b in zip(one, split, strict=True):
        assert a == b, f"{a[0]} {a[1]}: one process {a[2:]} vs --frontends 1 {b[2:]}"
