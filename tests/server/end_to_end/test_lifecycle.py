"""The real ``irpe serve`` process: torch never loaded, SIGTERM drains in-flight requests, GPU asks fail."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.helpers import announced_url, encode, image, make_slow_artifact, wait_ready

REPO = Path(__file__).resolve().parents[3]
FORBIDDEN = ("torch", "irpe.models", "irpe.export", "irpe.plugins", "irpe.training")


def _serve(artifact: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "irpe.cli", "serve", str(artifact), "--port", "0",
                             "--log-level", "info", *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(condition, timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``condition()`` until true (instead of sleeping a guessed time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(0.02)


def queue_depth(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("irpe_queue_depth ")))


def test_server_process_never_imports_torch_and_drains_on_sigterm(tmp_path: Path) -> None:
    """One request keeps the (slow) engine busy, a second waits in the queue; SIGTERM answers both.

    ``--max-batch 1``: the two requests can never share a batch (both sent at once, they could arrive
    before the idle engine takes the first), so exactly one waits while the other runs."""
    slow = make_slow_artifact(tmp_path / "slow", matmuls=300)  # each engine call >= 3 s
    proc = _serve(slow, "--max-batch", "1", "--max-wait-ms", "3000", "--inference-threads", "1")
    lines: list[str] = []
    results: list[httpx.Response] = []
    reader: threading.Thread | None = None
    try:
        url = announced_url(proc, lines)  # port 0: the address the server really bound
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        reader.start()  # keep draining the log: a full pipe would block the server's event loop
        wait_ready(url, timeout=60)
        post = {"content": encode(image()), "headers": {"content-type": "image/png"}, "timeout": 60}
        threads = [threading.Thread(target=lambda: results.append(httpx.post(url + "/classify", **post)))
                   for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: queue_depth(url) == 1, what="a request waiting behind the busy engine")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libtorch" not in maps and "onnxruntime" in maps
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if reader is not None:
        reader.join(10)
    output = "".join(lines)
    assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
    assert all(len(r.json()["predictions"][0]) == 5 for r in results)
    assert code in (0, -signal.SIGTERM), output  # uvicorn re-raises the signal after a clean shutdown
    assert "Application shutdown complete" in output
    assert "providers in use ['CPUExecutionProvider']" in output and "batcher drained" in output


def test_sigterm_past_the_drain_timeout_waits_for_the_running_engine_call(tmp_path: Path) -> None:
    """--timeout-s 0.3 and an engine call of >= 1.5 s: the request is answered 504 and SIGTERM comes while the
    engine still runs it; the engine process waits for that call (past its 0.3 s drain) before it exits, so ONNX
    Runtime's threads are not torn down under a running session: exit code 0 and no ``terminate called``."""
    slow = make_slow_artifact(tmp_path / "slow", matmuls=150)  # each engine call >= 1.5 s on an idle core
    proc = _serve(slow, "--frontends", "1", "--max-batch", "1", "--inference-threads", "1", "--timeout-s", "0.3",
                  "--log-level", "warning")
    lines: list[str] = []
    try:
        url = announced_url(proc, lines)
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        reader.start()
        wait_ready(url, timeout=60)
        start = time.monotonic()
        r = httpx.post(url + "/classify", content=encode(image()), headers={"content-type": "image/png"}, timeout=30)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic() - start
        code = proc.wait(60)
        stopped = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    output = "".join(lines)
    print(f"504 after {sent:.2f} s; exited {code} {stopped:.2f} s after the request was sent")
    assert r.status_code == 504 and "--timeout-s" in r.text, r.text
    assert sent < 1.5, sent  # SIGTERM came while the engine call ran (else this test shows nothing)
    assert code == 0 and "terminate called" not in output, output


def test_app_and_inference_import_no_torch(tiny_artifact: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        from tests.server.helpers import running_server, encode, image
        import httpx
        with running_server({str(tiny_artifact)!r}) as url:
            r = httpx.post(url + "/classify", content=encode(image()), headers={{"content-type": "image/png"}})
            assert r.status_code == 200, r.text
        import irpe.server.http.app, irpe.server.pipeline.offline, irpe.server.http.kserve
        bad = [m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith({FORBIDDEN[1:]!r})]
        assert not bad, bad
        print("TORCH-FREE")
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "TORCH-FREE" in out.stdout, out.stderr


def test_gpu_request_without_gpu_fails_startup(tiny_artifact: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a CUDA-enabled onnxruntime is installed; the fallback check needs a CPU-only build")
    for layout in ("0", "auto"):  # one process, and one front end over the engine process (auto with cuda)
        proc = _serve(tiny_artifact, "--device", "cuda", "--frontends", layout)
        out, _ = proc.communicate(timeout=60)
        errors = [line for line in out.splitlines() if line.startswith("irpe serve: error: cannot load the model: "
                                                                        "--device cuda: ")]
        assert proc.returncode != 0 and len(errors) == 1 and "CUDAExecutionProvider" in errors[0], out
        assert "Traceback" not in out and " ERROR " not in out, out


@pytest.mark.parametrize("layout", [("--frontends", "0"), ("--frontends", "2"), ("--frontends", "0", "--workers", "2")],
                         ids=["one-process", "frontends", "workers"])
def test_a_port_in_use_is_one_error_line_and_never_ready(tiny_artifact: Path, layout: tuple[str, ...]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        out = subprocess.run([sys.executable, "-m", "irpe.cli", "serve", str(tiny_artifact), "--host", "127.0.0.1",
                              "--port", port, *layout], cwd=REPO, capture_output=True, text=True, timeout=90)
    errors = [line for line in out.stderr.splitlines() if line.startswith("irpe serve: error: ")]
    assert out.returncode == 3 and len(errors) == 1 and port in errors[0] and "--port" in errors[0], out.stderr
    assert "ready: " not in out.stderr and "listening on" not in out.stdout + out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_load_model_that_does_nothing_is_refused(tiny_artifact: Path) -> None:
    """On a plain artifact: without explicit model control, and naming a model the artifact is not."""
    def refused(*flags: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "irpe.cli", "serve", str(tiny_artifact), "--port", "0", *flags],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0, out.stderr
        return out.stderr.strip().splitlines()

    assert refused("--load-model", "foo") == [
        "irpe serve: error: --load-model picks the models loaded at startup with --model-control explicit "
        "(got none); add --model-control explicit"]
    assert refused("--load-model", "foo", "--model-control", "explicit") == [
        f"irpe serve: error: --load-model 'foo' is not in {tiny_artifact} (models: ['tiny-mean']); fix --load-model"]


def test_bad_artifact_dir_is_a_one_line_error(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "irpe.cli", "serve", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=30, env=dict(os.environ, IRPE_DEBUG=""))
    assert out.returncode == 2 and "model.json" in out.stderr and "Traceback" not in out.stderr
