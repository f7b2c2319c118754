"""Server states a happy-path test never sees: warm-up failure (not ready everywhere), the drain window
(``shutting_down``), NaN logits (``non_finite_output``), ``--workers N`` and ``--backend auto``."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.benchmarks.test_triton_bench import _perf_analyzer_runs
from tests.server.helpers import (
    BIAS,
    CROP,
    PIXEL_WEIGHT,
    announced_url,
    connections_spread,
    encode,
    handmade_artifact,
    image,
    listeners,
    running_server,
    serving_app,
    wait_ready,
)

REPO = Path(__file__).resolve().parents[3]
PNG = {"content-type": "image/png"}


def batch_one_only(directory: Path) -> Path:
    """Reshapes to a fixed [1, 3072]: batch 1 runs, the warm-up of batch 2 fails inside ONNX Runtime."""
    from onnx import helper

    nodes = [helper.make_node("Reshape", ["images", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["logits"])]
    return handmade_artifact(directory, "batch-one", nodes, {"shape": np.array([1, 3 * CROP * CROP], np.int64),
                                                     "W": PIXEL_WEIGHT, "b": BIAS})


def nan_on_real_images(directory: Path) -> Path:
    """logits + sqrt(-max(image)): finite for the all-zero warm-up, NaN for any real (normalised) image."""
    from onnx import helper

    nodes = [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
             helper.make_node("MatMul", ["flat", "W"], ["mm"]),
             helper.make_node("ReduceMax", ["images"], ["peak"], keepdims=0),
             helper.make_node("Neg", ["peak"], ["neg"]), helper.make_node("Sqrt", ["neg"], ["root"]),
             helper.make_node("Add", ["mm", "root"], ["logits"])]
    return handmade_artifact(directory, "nan-model", nodes, {"W": PIXEL_WEIGHT})


def _poll(url: str, status: int, timeout: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(url, timeout=5)
        if r.status_code == status or time.monotonic() > deadline:
            return r
        time.sleep(0.02)


def test_warm_up_failure_leaves_every_route_not_ready(tmp_path: Path) -> None:
    from irpe.server.config import Settings
    from irpe.server.http.app import create_app

    art = batch_one_only(tmp_path / "a")
    cfg = Settings.from_env(env={}, artifact_dir=str(art), max_batch=4, log_level="warning")
    with serving_app(create_app(cfg)) as url:
        health = _poll(url + "/healthz", 503)
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "warm-up failed" in health.json()["detail"]
        ready = httpx.get(url + "/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
        assert "warm-up failed" in ready.json()["detail"] and ready.headers["retry-after"] == "1"
        r = httpx.post(url + "/classify", content=encode(image()), headers=PNG)
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert "warm-up failed" in r.json()["error"]["message"] + str(r.json()["error"].get("detail", ""))
        assert r.headers["retry-after"] == "1"
        assert httpx.get(url + "/v2/health/ready").status_code == 503
        v2 = httpx.post(url + "/v2/models/batch-one/infer", json={"inputs": [
            {"name": "images", "shape": [1, 3, CROP, CROP], "datatype": "FP32", "data": [0.0] * (3 * CROP * CROP)}]})
        assert v2.status_code == 503 and "warm-up failed" in v2.json()["error"]  # the protocol: {"error": "..."}
        assert httpx.get(url + "/v1/models/batch-one").json()["ready"] is False


def test_batcher_stopping_under_a_request_is_shutting_down_503(tiny_artifact: Path) -> None:
    """The drain window: the request passed the ready check, then the batcher stopped (SIGTERM)."""
    from irpe.server.config import Settings
    from irpe.server.http.app import create_app

    app = create_app(Settings.from_env(env={}, artifact_dir=str(tiny_artifact), log_level="warning"))
    with serving_app(app) as url:
        wait_ready(url)
        app.state.irpe.host.newest("tiny-mean").batcher.stop(drain=True, timeout=5)  # what the lifespan does on SIGTERM
        r = httpx.post(url + "/classify", content=encode(image()), headers=PNG)
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    assert r.headers["retry-after"] == "1"


def test_nan_logits_are_a_json_500_and_the_server_keeps_serving(tmp_path: Path, tiny_artifact: Path) -> None:
    with running_server(nan_on_real_images(tmp_path / "nan")) as url:
        r = httpx.post(url + "/classify", content=encode(image()), headers=PNG)
        assert r.status_code == 500 and r.json()["error"]["code"] == "non_finite_output"
        assert "NaN/Inf" in r.json()["error"]["message"]
        assert httpx.get(url + "/readyz").status_code == 200  # one bad output does not take the server down
        again = httpx.post(url + "/classify", content=encode(image(seed=3)), headers=PNG)
        assert again.status_code == 500 and again.json()["error"]["code"] == "non_finite_output"


def test_backend_auto_on_cpu_is_onnxruntime_even_with_a_plan(tiny_artifact: Path, tmp_path: Path) -> None:
    own = tmp_path / "a"
    shutil.copytree(tiny_artifact, own)
    (own / "model.plan").write_bytes(b"not a plan")  # auto must not pick TensorRT without a GPU
    with running_server(own, backend="auto") as url:
        meta = httpx.get(url + "/v1/models/tiny-mean").json()
        r = httpx.post(url + "/classify", content=encode(image()), headers=PNG)
    assert meta["backend"] == "onnxruntime" and meta["device"] == "cpu"
    assert meta["providers"] == ["CPUExecutionProvider"] and r.status_code == 200


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _model_holders(pid: int) -> list[int]:
    """Child processes of ``pid`` with ONNX Runtime loaded (the workers; not e.g. a resource tracker)."""
    holders = []
    for child in _children(pid):
        try:
            if "onnxruntime" in Path(f"/proc/{child}/maps").read_text():
                holders.append(child)
        except OSError:
            continue
    return holders


@contextlib.contextmanager
def _two_workers(artifact: Path) -> Iterator[tuple[subprocess.Popen, str, float]]:
    """``irpe serve --workers 2`` on ``artifact``: (the supervisor, its URL, a deadline 60 s on) once it is ready
    and each worker has loaded the model and listens (or the deadline passed); stopped on exit."""
    proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", str(artifact), "--port", "0",
                             "--workers", "2", "--log-level", "warning"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = announced_url(proc)
        wait_ready(url, timeout=60)
        deadline = time.monotonic() + 60
        port = int(url.rsplit(":", 1)[1])  # the supervisor announces once the first worker listens
        while (len(_model_holders(proc.pid)) < 2 or listeners(port) < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc, url, deadline
    finally:
        proc.terminate()
        proc.wait(30)


def test_workers_serve_from_separate_processes(tiny_artifact: Path) -> None:
    """``--workers 2``: two worker processes, each with its own model, answer correctly."""
    from tests.server.http.test_app import _check, _expected

    with _two_workers(tiny_artifact) as (proc, url, deadline):
        assert len(_model_holders(proc.pid)) == 2  # one model per worker process
        assert "onnxruntime" not in Path(f"/proc/{proc.pid}/maps").read_text()  # the supervisor holds none
        for seed in range(8):  # a new connection each: the kernel spreads them over the workers' accept()
            r = _classify_once_warm(url, encode(image(seed=seed)), deadline)
            assert r.status_code == 200, r.text
            _check(r.json()["predictions"][0], _expected(seed), 5)
    assert proc.returncode in (0, -15)


def _classify_once_warm(url: str, body: bytes, deadline: float) -> httpx.Response:
    """POST ``body`` to /classify; while the worker that took it is still warming up (/readyz answered 200 from
    the other one), 503 ``not_ready``, sent again on a new connection until ``deadline``."""
    while True:
        r = httpx.post(url + "/classify", content=body, headers=PNG, timeout=30)
        if r.status_code != 503 or "not_ready" not in r.text or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_connections_spread_over_the_workers(tiny_artifact: Path) -> None:
    """Each worker listens on its own socket of the port (SO_REUSEPORT), so connections opened at once spread over
    them; on one shared socket the first worker to wake accepted all of them."""
    with _two_workers(tiny_artifact) as (proc, url, _):
        port = int(url.rsplit(":", 1)[1])
        workers = _model_holders(proc.pid)
        assert listeners(port) == 2  # the workers' sockets; the supervisor's does not listen
        held = connections_spread(workers, port, 16)
        assert sum(held.values()) == 16 and min(held.values()) >= 1, held


def test_every_worker_answers_statistics_summed_over_the_workers(tiny_artifact: Path) -> None:
    """``--workers 2``: each read of /v2/models/{m}/stats, on a new connection (either worker may take it), counts
    every answered request, whichever worker answered it."""
    with _two_workers(tiny_artifact) as (_, url, deadline):
        for seed in range(8):  # a new connection each: both workers answer
            assert _classify_once_warm(url, encode(image(seed=seed)), deadline).status_code == 200
        assert "statistics" in httpx.get(f"{url}/v2", timeout=10).json()["extensions"]
        for _ in range(8):
            stats = httpx.get(f"{url}/v2/models/tiny-mean/stats", timeout=10).json()["model_stats"][0]
            assert stats["inference_count"] == 8 and stats["inference_stats"]["success"]["count"] == 8, stats


@pytest.mark.perf_analyzer  # IRPE_TEST_WITHOUT=perf_analyzer opts out (tests/conftest.py)
@pytest.mark.skipif(not _perf_analyzer_runs(), reason="perf_analyzer (or its podman image) is not here")
def test_perf_analyzer_reads_the_statistics_of_both_workers(tiny_artifact: Path) -> None:
    """perf_analyzer reads /stats before and after each window and keeps the version whose count grew; with
    each worker answering its own counts, a start read from one worker and an end read from the other made it
    fail ("failed to find the requested model version") in about half its runs."""
    from irpe.bench.perf_analyzer import Target, pa_args, perf_analyzer_command, run_pa

    with _two_workers(tiny_artifact) as (_, url, deadline):
        for seed in range(8):  # each worker warm: new connections spread over both
            assert _classify_once_warm(url, encode(image(seed=seed)), deadline).status_code == 200
        target = Target("irpe", "http", url.removeprefix("http://"), "tiny-mean")
        for _ in range(3):
            m = run_pa(perf_analyzer_command(), pa_args(target, 8, 300), timeout_s=120, tries=1)
            assert m.rps > 0 and m.inferences > 0 and m.executions > 0  # its "Server:" section, from the sums


@pytest.mark.parametrize("flag", ["--workers", "--max-batch", "--max-queue"])
def test_invalid_counts_are_one_line_errors(flag: str, tiny_artifact: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "irpe", "serve", str(tiny_artifact), "--port", "0", flag, "-1"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert flag.removeprefix("--").replace("-", "_") in out.stderr
