"""The CPU serving image, built from the Dockerfile and run (docker, or podman + runc): an exported iRPE artifact
mounted read-only, a read-only root filesystem, an API key; over HTTP on 127.0.0.1 it answers as the same
artifact served outside the container, runs as non-root, passes its own HEALTHCHECK, loses no request in
flight on SIGTERM, and a missing or corrupt /models is a one-line error with a non-zero exit.

scripts/test.sh sets podman up (scripts/container-setup.sh); the base image is python:3.11-slim when a registry
answers, else a local Debian stand-in (scripts/container-base.sh). Sizes and build times go to
test-artifacts/container.json."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.deploy.images import MODEL
from tests.deploy.images import build as _build
from tests.deploy.images import record as _record
from tests.deploy.images import run as _run
from tests.server.helpers import encode, free_port, image, make_slow_artifact, running_server

REPO = Path(__file__).resolve().parents[2]
KEY = "container-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
pytestmark = [pytest.mark.container, pytest.mark.timeout(1800)]


class Container:
    """A detached container (``run -d`` + ``options`` + image + args), reached on 127.0.0.1:``port``."""

    def __init__(self, engine: list[str], options: list[str], port: int, ready: bool = True,
                 ready_timeout: float = 180):
        self.engine, self.name, self.port = engine, f"irpe-test-{uuid.uuid4().hex[:8]}", port
        self.url = f"http://127.0.0.1:{port}"
        _run([*engine, "run", "-d", "--name", self.name, *options])
        if ready:
            try:
                self.wait_ready(ready_timeout)
            except BaseException:
                self.remove()  # the caller never gets it to remove: a container left warming up loads the host
                raise

    @classmethod
    def serve(cls, engine: list[str], image: str, models: Path | None, *args: str, ready: bool = True,
              ready_timeout: float = 180) -> Container:
        """The hardened way to run it: read-only root, a small /tmp, the key, /models read-only."""
        port = free_port()
        options = ["--read-only", "--tmpfs", "/tmp:size=64m", "-p", f"127.0.0.1:{port}:8000",
                   "-e", f"IRPE_API_KEY={KEY}", "-e", "IRPE_LOG_LEVEL=warning"]
        if models is not None:
            options += ["-v", f"{models}:/models:ro"]
        return cls(engine, [*options, image, *args], port, ready, ready_timeout)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            if self.state()["Running"] is False:
                break
            time.sleep(0.2)
        raise AssertionError(f"container not ready: {self.state()}\n{self.logs()}")

    def state(self) -> dict:
        return json.loads(_run([*self.engine, "inspect", "--format", "{{json .State}}", self.name]).stdout)

    def logs(self) -> str:
        out = _run([*self.engine, "logs", self.name], check=False)
        return out.stdout + out.stderr

    def exec(self, *cmd: str) -> subprocess.CompletedProcess:
        return _run([*self.engine, "exec", self.name, *cmd], check=False, timeout=60)

    def wait_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.state()["Running"] and time.monotonic() < deadline:
            time.sleep(0.2)
        return int(self.state()["ExitCode"])

    def remove(self) -> None:
        _run([*self.engine, "rm", "-f", self.name], check=False)


@pytest.fixture(scope="module")
def served(engine: list[str], cpu_image: str, artifact: Path) -> Iterator[Container]:
    c = Container.serve(engine, cpu_image, artifact)
    try:
        yield c
    finally:
        c.remove()


def _files(n: int) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("file", (f"{k}.png", encode(image((64 + 8 * k, 48), seed=k)), "image/png")) for k in range(n)]


def test_classify_matches_the_artifact_served_outside(served: Container, artifact: Path) -> None:
    files = _files(3)
    r = httpx.post(served.url + "/classify?top_k=5", files=files, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    with running_server(artifact) as url:
        ref = httpx.post(url + "/classify?top_k=5", files=files, timeout=60)
    assert ref.status_code == 200 and r.json()["model"] == ref.json()["model"] == MODEL
    got, want = r.json()["predictions"], ref.json()["predictions"]
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert [(p["index"], p["label"]) for p in g] == [(p["index"], p["label"]) for p in w]
        np.testing.assert_allclose([p["probability"] for p in g], [p["probability"] for p in w], rtol=1e-5,
                                   atol=1e-7)
    # the key is enforced inside the container
    assert httpx.post(served.url + "/classify", files=files[:1], timeout=30).status_code == 401


def test_runs_as_non_root_on_a_read_only_root(served: Container) -> None:
    status = served.exec("cat", "/proc/1/status")
    assert status.returncode == 0, status.stderr
    uids = re.search(r"^Uid:\s+(.*)$", status.stdout, re.M).group(1).split()
    assert uids and all(u == "10001" for u in uids), uids  # the server process (PID 1), not just exec
    cmdline = served.exec("cat", "/proc/1/cmdline").stdout.split("\0")
    assert "serve" in cmdline and "/models" in cmdline
    assert served.state()["Running"]
    assert served.exec("touch", "/opt/venv/x").returncode != 0  # root filesystem is read-only
    assert served.exec("touch", "/models/x").returncode != 0  # the artifact mount too
    assert served.exec("touch", "/tmp/x").returncode == 0  # the tmpfs is writable


def test_image_healthcheck_succeeds_inside(served: Container, engine: list[str], cpu_image: str) -> None:
    raw = _run([*engine, "image", "inspect", "--format", "{{json .Config.Healthcheck}}", cpu_image]).stdout
    hc = json.loads(raw)
    assert hc and hc["Test"][0] == "CMD", raw  # kept in the image (podman: --format docker)
    ok = served.exec(*hc["Test"][1:])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # and the same command fails when nothing answers
    bad = served.exec("env", "IRPE_PORT=1", *hc["Test"][1:])
    assert bad.returncode != 0


SIGTERM_TIMEOUT_S = 60  # the server's --timeout-s in the SIGTERM test: what a request may wait before its 504


def test_sigterm_with_requests_in_flight_loses_none(engine: list[str], cpu_image: str, tmp_path: Path) -> None:
    """One request keeps the engine busy (>= 3 s per call) while the others wait in the queue; SIGTERM then.
    The drain, not a race: every request gets an answer, a 200 with its prediction or, where the machine is
    too slow to reach it within --timeout-s, the documented 504 ``timeout``, and no sooner than that deadline;
    none is refused or cut off, and the server exits 0."""
    slow = make_slow_artifact(tmp_path / "slow", matmuls=300)  # each engine call >= 3 s
    for p in [slow, *slow.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    n = 12
    # ready after a warm-up call at each of the 7 batch sizes (>= 3 s each): minutes on a loaded 2-core host
    c = Container.serve(engine, cpu_image, slow, "--max-batch", "64", "--max-wait-ms", "8000",
                        "--inference-threads", "1", "--timeout-s", str(SIGTERM_TIMEOUT_S), ready_timeout=900)
    try:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            post = {"files": _files(1), "headers": AUTH, "timeout": SIGTERM_TIMEOUT_S + 120}
            futures = [pool.submit(_timed_post, c.url + "/classify", **post) for _ in range(n)]
            deadline = time.monotonic() + 120  # liveness only: decoding 12 small PNGs takes well under a second
            # every request decoded and handed to the batcher, some still waiting behind the busy engine
            # (not "exactly n - 1 queued": requests sent at once may share the first batch)
            while (seen := _metric(c, "irpe_decode_seconds_count")) < n or _metric(c, "irpe_queue_depth") < 1:
                assert time.monotonic() < deadline, f"requests never reached the queue ({seen} of {n} decoded)"
                time.sleep(0.02)
            _run([*c.engine, "kill", "--signal", "TERM", c.name])
            results = [f.result() for f in futures]  # an exception here is a request lost (reset, refused)
        for elapsed, r in results:
            if r.status_code == 200:
                assert len(r.json()["predictions"]) == 1, r.text
            else:
                assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
                assert elapsed >= 0.99 * SIGTERM_TIMEOUT_S, f"a 504 after {elapsed:.1f} s, before the deadline"
        assert c.wait_exit(SIGTERM_TIMEOUT_S + 60) == 0, c.logs()
    finally:
        c.remove()


def _timed_post(url: str, **kwargs) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    response = httpx.post(url, **kwargs)
    return time.monotonic() - start, response


def _metric(c: Container, name: str) -> float:
    text = httpx.get(c.url + "/metrics", headers=AUTH, timeout=5).text
    return float(re.search(rf"^{name} ([0-9.e+]+)$", text, re.M).group(1))


def _corrupt(artifact: Path, tmp: Path) -> Path:
    bad = tmp / "corrupt"
    shutil.copytree(artifact, bad)
    (bad / "model.onnx").write_bytes(b"\x08\x07 this is not an ONNX protobuf" * 64)
    for p in [bad, *bad.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return bad


@pytest.mark.parametrize("case", ["missing", "corrupt"])
def test_bad_models_is_a_one_line_error(case: str, engine: list[str], cpu_image: str, artifact: Path,
                                        tmp_path: Path) -> None:
    models = None if case == "missing" else _corrupt(artifact, tmp_path)
    code, lines = _exit_and_lines(Container.serve(engine, cpu_image, models, ready=False))
    assert code != 0
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert lines[0].startswith("irpe serve: error:") and "/models" in lines[0], lines


def _exit_and_lines(c: Container) -> tuple[int, list[str]]:
    """Wait for a container that should not start to exit; its exit code and non-blank log lines."""
    try:
        return c.wait_exit(120), [line for line in c.logs().splitlines() if line.strip()]
    finally:
        c.remove()


def _readme_journey() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text[text.index("# 3. in a container"):]
    return block[:block.index("```")].splitlines()[1:]


def test_readme_container_lines_work(engine: list[str], cpu_image: str, artifact: Path, tmp_path: Path) -> None:
    """README's `docker run` and `curl` lines, run as written but for what the comment above them says
    (CPU image: no --gpus all), the image tag, the artifact path and a free port on 127.0.0.1."""
    import shlex

    build, run, curl = _readme_journey()
    assert shlex.split(build)[:2] == ["docker", "build"]
    port = free_port()
    args = shlex.split(run.replace("--gpus all ", "").replace("-p 8000:8000", f"-p 127.0.0.1:{port}:8000")
                       .replace("$PWD/artifacts/small-k", str(artifact)))
    assert args[:3] == ["docker", "run", "-d"] and args[-1] == "irpe-serve:gpu"
    c = Container(engine, args[2:-1] + [cpu_image], port)
    try:
        (tmp_path / "cat.jpg").write_bytes(encode(image((96, 80)), "JPEG"))
        out = subprocess.run(shlex.split(curl.replace(":8000/", f":{port}/")), cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and json.loads(out.stdout)["model"] == MODEL, out.stdout + out.stderr
    finally:
        c.remove()


@pytest.mark.slow
def test_gpu_image_without_a_cuda_base(engine: list[str], artifact: Path) -> None:
    """The GPU variant (about 3 GB of CUDA/cuDNN wheels; `pytest -m slow`): no GPU is needed to build it.
    Its onnxruntime lists the CUDA and TensorRT providers, the CUDA provider's libraries all resolve but
    the driver's libcuda.so.1 (the NVIDIA container toolkit mounts it), and a start without a GPU is one
    line and a non-zero exit."""
    tag = "localhost/irpe-serve:gpu-test"
    _build(engine, "gpu", tag)
    probe = ("import glob, subprocess, onnxruntime as ort; print(ort.get_available_providers()); "
             "lib = glob.glob('/opt/venv/lib/python3*/site-packages/onnxruntime/capi/"
             "libonnxruntime_providers_cuda.so')[0]; "
             "print([l.split()[0] for l in subprocess.run(['ldd', lib], capture_output=True, text=True)"
             ".stdout.splitlines() if 'not found' in l])")
    out = _run([*engine, "run", "--rm", "--entrypoint", "python", tag, "-c", probe])
    providers, missing = out.stdout.strip().splitlines()[-2:]
    assert "'CUDAExecutionProvider'" in providers and "'TensorrtExecutionProvider'" in providers, out.stdout
    assert missing == "['libcuda.so.1']", out.stdout
    _record(gpu_providers=providers)
    code, lines = _exit_and_lines(Container.serve(engine, tag, artifact, ready=False))
    assert code != 0 and len(lines) == 1, lines
    assert "--device cuda: no NVIDIA driver" in lines[0] and "--gpus all" in lines[0], lines


def test_open_bind_needs_a_key_or_an_explicit_opt_out(engine: list[str], cpu_image: str, artifact: Path) -> None:
    """The image binds 0.0.0.0: with the server's refusal of an open bind without a key it does not start without a key;
    IRPE_INSECURE=1, as documented, serves without one."""
    port = free_port()
    base = ["--read-only", "--tmpfs", "/tmp:size=64m", "-p", f"127.0.0.1:{port}:8000", "-v", f"{artifact}:/models:ro"]
    if "insecure" in (REPO / "server" / "config.py").read_text():
        c = Container(engine, [*base, cpu_image], port, ready=False)
        try:
            code, lines = c.wait_exit(120), [line for line in c.logs().splitlines() if line.strip()]
        finally:
            c.remove()
        assert code != 0 and len(lines) == 1 and "IRPE_API_KEY" in lines[0], lines
    c = Container(engine, [*base, "-e", "IRPE_INSECURE=1", cpu_image], port)
    try:
        r = httpx.post(c.url + "/classify", files=_files(1), timeout=60)
        assert r.status_code == 200, r.text
    finally:
        c.remove()
