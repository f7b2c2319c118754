"""The Triton harness (bench/tritonserver.py): the real tritonserver 2.51 on 127.0.0.1 serves a tiny exported
model through its Python backend, tritonclient over HTTP and gRPC gets ONNX Runtime's logits, the caller's
batching config is the one Triton runs, and the server stops cleanly.

tritonclient.grpc runs in a child process: its generated ``inference.*`` messages and kserve's (imported by other
test modules) cannot share one process's protobuf pool."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irpe.bench.tritonserver import TritonServer
from tests.server.helpers import make_artifact

ort = pytest.importorskip("onnxruntime")
http = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
MAX_BATCH = 4
GRPC_INFER = """
import io, sys
import numpy as np
import tritonclient.grpc as grpc
x = np.load(io.BytesIO(sys.stdin.buffer.read()))
client = grpc.InferenceServerClient(sys.argv[1])
inp = grpc.InferInput("images", list(x.shape), "FP32")
inp.set_data_from_numpy(x)
out = io.BytesIO()
np.save(out, client.infer("irpe", [inp]).as_numpy("logits"))
client.close()
sys.stdout.buffer.write(out.getvalue())
"""


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("artifact"))


@pytest.fixture(scope="module")
def server(artifact: Path) -> Iterator[TritonServer]:
    with TritonServer(artifact, max_batch=MAX_BATCH, instances=2, threads=1) as s:
        yield s


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, 32, 32), dtype=np.float32)


def _reference(artifact: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"images": x})[0]


def _infer(url: str, x: np.ndarray) -> np.ndarray:
    client = http.InferenceServerClient(url)
    try:
        inp = http.InferInput("images", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("irpe", [inp]).as_numpy("logits")
    finally:
        client.close()


def _grpc_infer(url: str, x: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    np.save(buf, x)
    out = subprocess.run([sys.executable, "-c", GRPC_INFER, url], input=buf.getvalue(), capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    return np.load(io.BytesIO(out.stdout))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_gives_onnxruntimes_logits(server: TritonServer, artifact: Path, protocol: str) -> None:
    x = _images(3, seed=len(protocol))
    got = _infer(server.http_url, x) if protocol == "http" else _grpc_infer(server.grpc_url, x)
    assert got.shape == (3, 10) and got.dtype == np.float32
    np.testing.assert_allclose(got, _reference(artifact, x), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got[0], got[1])  # distinct images, distinct logits


def test_the_callers_batching_config_is_the_one_triton_runs(server: TritonServer) -> None:
    client = http.InferenceServerClient(server.http_url)
    try:
        config = client.get_model_config("irpe")
    finally:
        client.close()
    assert config["backend"] == "python" and config["max_batch_size"] == MAX_BATCH
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0  # a lone request runs at once
    assert [(g["count"], g["kind"]) for g in config["instance_group"]] == [(2, "KIND_CPU")]
    assert config["parameters"]["intra_op_threads"]["string_value"] == "1"
    with pytest.raises(Exception, match="batch"):
        _infer(server.http_url, _images(MAX_BATCH + 1))


def test_metrics_port_counts_the_inferences(server: TritonServer) -> None:
    _infer(server.http_url, _images(1))
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith('nv_inference_request_success{model="irpe"')]
    assert float(line.rsplit(" ", 1)[1]) >= 1


def test_stop_ends_the_server_and_its_stubs(server: TritonServer) -> None:
    pgid = server.process.pid
    assert server.stop() == 0
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # no stub left in the server's process group
    assert server.stop() == 0  # idempotent


def test_a_missing_artifact_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="model.json"):
        TritonServer(tmp_path / "nothing")
