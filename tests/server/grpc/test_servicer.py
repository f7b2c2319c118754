"""``irpe serve --grpc-port``: inference.GRPCInferenceService proven by NVIDIA's and KServe's own gRPC clients
(tritonclient.grpc sync, aio and streaming; kserve's InferenceGRPCClient) against real ``irpe serve`` processes on
127.0.0.1, in one process, with ``--frontends 2`` and with ``--workers 2``. The clients run in child processes
(:mod:`tests.server.grpc_client`): tritonclient.grpc and kserve cannot share one."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from irpe.server.config import Settings
from tests.reliability.procs import REPO, ServerProcess, server_env, start_server
from tests.server.grpc_client import images
from tests.server.helpers import expected_logits, listeners, make_slow_artifact

KEY = "grpc-test-key"
MAX_QUEUE = 8
GRPC_LINE = re.compile(r"irpe serve: gRPC listening on ([0-9.]+:[0-9]+)")


def grpc_address(server: ServerProcess) -> str:
    m = GRPC_LINE.search(server.output())
    assert m, server.output()
    return m.group(1)


def run_client(mode: str, address: str, key: str = KEY) -> dict:
    """One mode of tests/server/grpc_client.py in a child process; its JSON."""
    out = subprocess.run([sys.executable, "-m", "tests.server.grpc_client", mode, address, key], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module", params=[("--frontends", "0"), ("--frontends", "2"), ("--workers", "2")],
                ids=["one-process", "frontends-2", "workers-2"])
def server(request: pytest.FixtureRequest, tiny_artifact: Path) -> Iterator[ServerProcess]:
    flags = ("--grpc-port", "0", *request.param, "--max-wait-ms", "2", "--max-body-mb", "0.25",
             "--max-queue", str(MAX_QUEUE))
    proc = start_server(tiny_artifact, *flags, env=server_env(IRPE_API_KEY=KEY))
    try:
        yield proc
    finally:
        assert proc.stop() in (0, -15), proc.output()[-3000:]  # uvicorn re-raises SIGTERM after its graceful stop
        proc.log.unlink(missing_ok=True)


def _close(got: list, x: np.ndarray) -> bool:
    return np.allclose(np.asarray(got, np.float32), expected_logits(x), atol=1e-4)


def test_tritonclient_sync_every_unary_rpc(server: ServerProcess) -> None:
    out = run_client("triton", grpc_address(server))
    assert out["live"] and out["ready"] and out["model_ready"] and out["loaded_again"]
    assert out["load"] == "StatusCode.UNAVAILABLE"  # not --model-control explicit: Triton's answer
    assert out["server"]["name"] == "irpe-deploy"
    assert {"classification", "model_configuration", "model_repository", "statistics"} <= set(
        out["server"]["extensions"])
    assert out["metadata"]["platform"] == "onnxruntime_onnx" and out["metadata"]["versions"] == ["1"]
    assert out["metadata"]["inputs"] == [{"name": "images", "datatype": "FP32", "shape": ["-1", "3", "32", "32"]}]
    assert out["metadata"]["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": ["-1", "10"]}]
    config = out["config"]
    assert config["max_batch_size"] == MAX_QUEUE and config["input"][0]["dims"] == ["3", "32", "32"]
    # no delay for a lone request; a uint64 0 is left out of the JSON form
    assert config["dynamic_batching"].get("max_queue_delay_microseconds", "0") == "0"
    assert config["instance_group"][0]["name"] == "tiny-mean_0" and config["output"][0]["label_filename"]
    assert _close(out["logits"], images(3, 1)) and out["id"] == "r-1"
    assert _close(out["typed"], images(2, 3))
    want = expected_logits(images(2, 2))
    for row, scores in zip(out["classes"], want, strict=True):
        assert [int(s.split(":")[1]) for s in row] == list(np.argsort(-scores)[:3])
        assert all(s.split(":")[2] == f"class_{s.split(':')[1]}" for s in row)
    assert int(out["stats"][0]["inference_count"]) >= 7 and out["stats"][0]["name"] == "tiny-mean"
    assert out["index"] == [{"name": "tiny-mean", "version": "1", "state": "READY"}]


def test_grpc_and_http_answer_the_same_bytes(server: ServerProcess) -> None:
    x = images(3, 1)
    body = {"inputs": [{"name": "images", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    r = httpx.post(f"{server.url}/v2/models/tiny-mean/infer", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    http = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(3, 10)
    grpc = np.asarray(run_client("triton", grpc_address(server))["logits"], np.float32)
    assert np.array_equal(http, grpc)


def test_tritonclient_aio_concurrent(server: ServerProcess) -> None:
    got = run_client("aio", grpc_address(server))["logits"]
    assert len(got) == 8  # at most --max-queue at once: all answered
    assert all(_close(g, images(1, 100 + i)) for i, g in enumerate(got))


def test_stream_infer_answers_each_request_and_goes_on_after_an_error(server: ServerProcess) -> None:
    got = run_client("stream", grpc_address(server))
    assert "unexpected shape" in got.pop("error")
    assert sorted(got) == sorted(f"s-{i}" for i in range(8))
    assert all(_close(got[f"s-{i}"], images(1, 200 + i)) for i in range(8))


def test_status_codes(server: ServerProcess) -> None:
    got = run_client("errors", grpc_address(server))
    print(json.dumps(got, indent=1))
    expect = {"unknown_model": ("NOT_FOUND", "nope"), "unknown_version": ("NOT_FOUND", "version 7"),
              "wrong_shape": ("INVALID_ARGUMENT", "unexpected shape"),
              "wrong_datatype": ("INVALID_ARGUMENT", "expects 'FP32'"),
              "non_finite": ("INVALID_ARGUMENT", "non-finite"), "wrong_output": ("INVALID_ARGUMENT", "probs"),
              "too_big": ("RESOURCE_EXHAUSTED", "larger than max"), "no_key": ("UNAUTHENTICATED", "Bearer"),
              "wrong_key": ("UNAUTHENTICATED", "API key"), "live_without_key": ("OK", ""),
              "cuda_shared_memory": ("UNIMPLEMENTED", ""), "shm_off": ("PERMISSION_DENIED", "--allow-client-shm")}
    for name, (code, needle) in expect.items():
        assert code in got[name] and needle in got[name], (name, got[name])


def test_grpc_calls_are_counted_in_metrics(server: ServerProcess) -> None:
    """ModelInfer refused, stream requests answered and refused, by gRPC status name."""
    run_client("errors", grpc_address(server))
    run_client("stream", grpc_address(server))
    counts: dict[str, float] = {}
    # --workers: each worker counts its own calls, and a new connection reaches either worker
    for _ in range(20 if "--workers" in " ".join(server.proc.args) else 1):
        text = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
        for series, value in re.findall(r'^irpe_requests_total\{(method="GRPC",[^}]*)\} (\S+)$', text, re.M):
            counts[series] = max(counts.get(series, 0.0), float(value))
    route = 'route="/inference.GRPCInferenceService/{}",status="{}"'
    for rpc, status in (("ModelInfer", "INVALID_ARGUMENT"), ("ModelInfer", "NOT_FOUND"),
                        ("ModelInfer", "UNAUTHENTICATED"), ("ModelMetadata", "NOT_FOUND"), ("ServerLive", "OK"),
                        ("ModelStreamInfer", "OK"), ("ModelStreamInfer", "INVALID_ARGUMENT")):
        assert counts.get('method="GRPC",' + route.format(rpc, status), 0) >= 1, (rpc, status, counts)


def test_kserve_grpc_client(server: ServerProcess) -> None:
    got = run_client("kserve", grpc_address(server))
    assert got["live"] and got["ready"] and got["model_ready"]
    assert got["id"] == "k-1" and got["model"] == "tiny-mean" and _close(got["logits"], images(2, 5))
    assert got["unknown"].startswith("NOT_FOUND") and "nope" in got["unknown"]


def test_every_process_listens_on_the_grpc_port(server: ServerProcess) -> None:
    args = " ".join(server.proc.args)
    processes = 2 if "--frontends 2" in args or "--workers 2" in args else 1
    assert listeners(int(grpc_address(server).rsplit(":", 1)[1])) == processes


def test_queue_full_is_unavailable_and_the_deadline_is_deadline_exceeded(tmp_path: Path) -> None:
    slow = make_slow_artifact(tmp_path / "slow", matmuls=100)
    flags = ("--grpc-port", "0", "--frontends", "0", "--max-batch", "1", "--max-queue", "4", "--timeout-s", "0.5",
             "--inference-threads", "1")
    proc = start_server(slow, *flags)
    try:
        statuses = run_client("burst", grpc_address(proc), "")["statuses"]
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)
    print(statuses)
    assert any("UNAVAILABLE" in s and "queue is full" in s for s in statuses), statuses
    assert any("DEADLINE_EXCEEDED" in s and "--timeout-s" in s for s in statuses), statuses
    assert all(s.split()[0] in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED", "OK") for s in statuses)


def test_grpc_port_settings_and_a_taken_port(tiny_artifact: Path) -> None:
    assert Settings.from_env(env={"IRPE_GRPC_PORT": "8001"}).grpc_port == 8001
    assert Settings.from_env(env={}).grpc_port == -1
    with pytest.raises(ValueError, match="grpc_port 8000"):
        Settings.from_env(env={}, port=8000, grpc_port=8000)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for extra in ((), ("--frontends", "2"), ("--workers", "2")):
            out = subprocess.run([sys.executable, "-m", "irpe", "serve", str(tiny_artifact), "--port", "0",
                                  "--grpc-port", str(port), *extra], cwd=REPO, env=server_env(), capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode != 0 and "--grpc-port" in out.stderr, out.stderr[-2000:]


def test_system_shared_memory_in_and_out(tiny_artifact: Path) -> None:
    proc = start_server(tiny_artifact, "--grpc-port", "0", "--frontends", "0",
                        env=server_env(IRPE_ALLOW_CLIENT_SHM="1"))
    try:
        got = run_client("shm", grpc_address(proc), "")
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)
    assert sorted(got["status"]["regions"]) == ["in", "out"]
    assert got["status"]["regions"]["out"]["byte_size"] == "80"
    assert _close(got["logits"], images(2, 9)) and got["raw_outputs"] == 0
    assert "INVALID_ARGUMENT" in got["too_small"] and "at least 80 bytes" in got["too_small"]
    assert "NOT_FOUND" in got["gone"] and "'in'" in got["gone"]
    assert got["after"] == {}


def test_sigterm_lets_running_rpcs_finish(tmp_path: Path) -> None:
    """SIGTERM while slow gRPC requests run: every one is answered, then the server exits."""
    slow = make_slow_artifact(tmp_path / "slow", matmuls=30)
    proc = start_server(slow, "--grpc-port", "0", "--frontends", "0", "--max-batch", "1", "--inference-threads", "1",
                        "--timeout-s", "120")  # a loaded shared machine must not turn the test into a deadline test
    try:
        client = subprocess.Popen([sys.executable, "-m", "tests.server.grpc_client", "burst", grpc_address(proc), "",
                                   "4"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while _images_answered(proc) < 1:  # the first answered: the other three are queued or running
            assert time.monotonic() < deadline and client.poll() is None, client.communicate()
            time.sleep(0.05)
        proc.proc.send_signal(signal.SIGTERM)
        out, err = client.communicate(timeout=120)
        assert proc.proc.wait(60) in (0, -15), proc.output()[-2000:]
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)
    assert client.returncode == 0, err[-2000:]
    assert json.loads(out)["statuses"] == ["OK"] * 4, out


def _images_answered(proc: ServerProcess) -> float:
    m = re.search(r"^irpe_images_total (\S+)$", httpx.get(f"{proc.url}/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_the_grpc_front_end_is_imported_only_with_a_grpc_port() -> None:
    code = ("import sys, irpe.server.launch, irpe.server.ipc.supervisor, irpe.server.http.app, irpe.server.frontend; "
            "bad = [m for m in sys.modules if m.startswith(('irpe.server.grpc', 'tritonclient', 'grpc'))]; "
            "assert not bad, bad; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
