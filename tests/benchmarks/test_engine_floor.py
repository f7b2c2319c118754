"""bench/engine_floor.py: the minimal KServe server running the artifact's engine answers what ``irpe serve``
answers, over HTTP and gRPC, through tritonclient on 127.0.0.1."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from irpe.bench.empty_kserve import floor_server
from irpe.bench.triton import irpe_server
from tests.server.helpers import make_artifact


def _logits(protocol: str, url: str, model: str, x: np.ndarray) -> tuple[np.ndarray, int]:
    """The logits of one binary request and the server's answered count (statistics extension)."""
    if protocol == "http":
        import tritonclient.http as client
    else:
        import tritonclient.grpc as client
    c = client.InferenceServerClient(url)
    meta = c.get_model_metadata(model, as_json=True) if protocol == "grpc" else c.get_model_metadata(model)
    name, out = meta["inputs"][0]["name"], meta["outputs"][0]["name"]
    given = client.InferInput(name, list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    wanted = client.InferRequestedOutput(out, binary_data=True) if protocol == "http" \
        else client.InferRequestedOutput(out)
    logits = c.infer(model, [given], outputs=[wanted]).as_numpy(out)
    stats = c.get_inference_statistics(model, as_json=True) if protocol == "grpc" \
        else c.get_inference_statistics(model)
    return logits, int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_floor_with_the_engine_answers_irpe_serves_logits(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is in the dev extra")
    artifact = make_artifact(tmp_path / "a")
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with irpe_server(artifact, ("--log-level", "warning"), grpc=True) as irpe, \
            tempfile.TemporaryDirectory() as work, \
            floor_server(irpe["http"], artifact, work, engine=True) as floor, \
            floor_server(irpe["http"], artifact, work) as empty:
        for protocol in ("http", "grpc"):
            served, _ = _logits(protocol, irpe[protocol], "tiny-mean", x)
            answered, count = _logits(protocol, floor[protocol], "tiny-mean", x)
            assert served.shape == answered.shape == (1, 10) and served.any()
            np.testing.assert_array_equal(answered, served)  # the same engine, batch 1: the same bytes
            assert count == (1 if protocol == "http" else 2)  # the statistics the CPU meter reads
            zeros, _ = _logits(protocol, empty[protocol], "tiny-mean", x)  # the floor without it: all zeros
            assert zeros.shape == (1, 10) and not zeros.any()


def test_a_client_that_leaves_mid_body_gets_no_answer_and_no_traceback(tmp_path: Path,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """perf_analyzer killed at its memory cap leaves mid-body: the floor drops that request without a traceback
    in the bench's output, and answers the next one."""
    import socket

    pytest.importorskip("tritonclient.grpc", reason="tritonclient is in the dev extra")
    artifact = make_artifact(tmp_path / "a")
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with irpe_server(artifact, ("--log-level", "warning"), grpc=True) as irpe, \
            tempfile.TemporaryDirectory() as work, \
            floor_server(irpe["http"], artifact, work, engine=True) as floor:
        host, port = floor["http"].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v2/models/tiny-mean/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 2"
                      b"\r\nContent-Length: 12290\r\n\r\n{}" + bytes(100))
        answered, count = _logits("http", floor["http"], "tiny-mean", x)
        assert answered.shape == (1, 10) and count == 1  # the request left mid-body was not counted
    assert "Traceback" not in capfd.readouterr().err
