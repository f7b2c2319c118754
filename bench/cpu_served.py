"""``irpe bench cpu --served N``: served req/s of fp32 on ONNX Runtime vs int8 on the default backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .serve import _drive, _free_port, _merge, _request, sample_jpeg, server_process

CONCURRENCY = 16


def served_lines(model: str, fp32: Path, int8: Path, requests: int, rows: list[Any], rounds: int = 3) -> list[str]:
    """Both servers up at once, driven alternately (``rounds`` rounds) at concurrency 16 with real JPEGs."""
    import httpx

    payload = sample_jpeg()
    ports = _free_port(), _free_port()
    per_round = max(CONCURRENCY, requests // rounds)
    runs: dict[str, list[Any]] = {"fp32": [], "int8": []}
    with server_process(["-m", "irpe.cli", "serve", str(fp32), "--port", str(ports[0]), "--backend",
                         "onnxruntime", "--log-level", "warning"], ports[0]) as p0, \
            server_process(["-m", "irpe.cli", "serve", str(int8), "--port", str(ports[1]),
                            "--log-level", "warning"], ports[1]) as p1:
        info = httpx.get(f"http://127.0.0.1:{ports[1]}/v1/models").json()["models"][0]
        for _ in range(rounds):
            runs["fp32"].append(_drive((ports[0], p0.pid), _request(ports[0], payload), per_round, CONCURRENCY))
            runs["int8"].append(_drive((ports[1], p1.pid), _request(ports[1], payload), per_round, CONCURRENCY))
    a, b = _merge(runs["fp32"]), _merge(runs["int8"])
    lines = [f"served {model} at concurrency {CONCURRENCY} ({a.requests} requests each, {rounds} interleaved rounds): "
             f"fp32 onnxruntime {a.rps:.2f} req/s, int8 {info['backend']} ({info['precision']}) {b.rps:.2f} req/s "
             f"-> {b.rps / a.rps:.2f}x (errors {a.errors}/{b.errors})"]
    raw = next((r for r in rows if r.model == model and r.path == "ov-int8" and r.batch == 8), None)
    if raw is not None and info["backend"] == "openvino":
        lines.append(f"int8 served/raw: {b.rps:.2f} / {8000 / raw.median_ms:.2f} img/s (raw ov-int8, batch 8) "
                     f"= {b.rps / (8000 / raw.median_ms):.2f}")
    return lines
