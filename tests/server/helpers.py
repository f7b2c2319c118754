"""Test helpers: a torch-free handmade artifact, images, and a real uvicorn server in a thread."""

from __future__ import annotations

import contextlib
import io
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from irpe.artifact import ModelArtifact, Preprocess, file_sha256, save_artifact

NUM_CLASSES = 10
CROP = 32
LABELS = [f"class_{i}" for i in range(NUM_CLASSES)]
RNG = np.random.default_rng(1234)
WEIGHT = RNG.normal(size=(3, NUM_CLASSES)).astype(np.float32) * 4  # the failing model's pooled weights
BIAS = RNG.normal(size=(NUM_CLASSES,)).astype(np.float32)
# One weight per pixel and channel: a flip, transpose, crop offset or channel swap changes the logits.
PIXEL_WEIGHT = (RNG.normal(size=(3 * CROP * CROP, NUM_CLASSES)) * 0.03).astype(np.float32)


def handmade_artifact(directory: Path, name: str, nodes: list, inits: dict[str, np.ndarray]) -> Path:
    """images [N,3,32,32] -> ``nodes`` -> logits [N,10] as model.onnx, plus its model.json (with the digest)."""
    from onnx import TensorProto, helper, numpy_helper, save

    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, CROP, CROP])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory.mkdir(parents=True, exist_ok=True)
    save(model, str(directory / "model.onnx"))
    art = ModelArtifact(name=name, architecture={"kind": "handmade"}, img_size=CROP, num_classes=NUM_CLASSES,
                        preprocess=Preprocess(resize=36, crop=CROP), labels=list(LABELS),
                        onnx_sha256=file_sha256(directory / "model.onnx"))
    save_artifact(art, directory)
    return directory


def make_artifact(directory: Path, name: str = "tiny-mean") -> Path:  # name kept: many tests use it
    """images [N,3,32,32] -> Flatten -> MatMul -> Add -> logits [N,10] (position-sensitive), plus model.json."""
    from onnx import helper

    nodes = [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
             helper.make_node("MatMul", ["flat", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["logits"])]
    return handmade_artifact(directory, name, nodes, {"W": PIXEL_WEIGHT, "b": BIAS})


def make_slow_artifact(directory: Path, matmuls: int = 100) -> Path:
    """The handmade model plus a chain of ``matmuls`` 1024x1024 MatMuls that depend on the input (about
    10 ms each on one idle core, whatever the batch size) and add 0 to the logits: an engine that stays busy."""
    from onnx import helper

    d = 1024
    nodes = [helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["mm"]),
             helper.make_node("ReduceSum", ["images"], ["s"], keepdims=0),
             helper.make_node("Mul", ["s", "A"], ["m0"])]
    nodes += [helper.make_node("MatMul", [f"m{k}", "A"], [f"m{k + 1}"]) for k in range(matmuls)]
    nodes += [helper.make_node("ReduceMean", [f"m{matmuls}"], ["burn"], keepdims=0),
              helper.make_node("Mul", ["burn", "zero"], ["nothing"]),
              helper.make_node("Add", ["mm", "b"], ["mb"]), helper.make_node("Add", ["mb", "nothing"], ["logits"])]
    inits = {"W": WEIGHT, "b": BIAS, "A": np.full((d, d), 1.0 / d, np.float32), "zero": np.float32(0.0)}
    return handmade_artifact(directory, "slow", nodes, inits)


def make_failing_artifact(directory: Path) -> Path:
    """Like :func:`make_artifact`, but inference fails at run time (a Gather index out of range) for any
    input whose maximum exceeds 0.01, i.e. every real image, while the all-zero warm-up passes."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["mm"]),
             helper.make_node("ReduceMax", ["images"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "scale"], ["scaled"]),
             helper.make_node("Cast", ["scaled"], ["index"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "index"], ["offset"]),
             helper.make_node("Add", ["mm", "offset"], ["logits"])]
    inits = {"W": WEIGHT, "scale": np.float32(1000.0), "table": np.zeros(10, np.float32)}
    return handmade_artifact(directory, "failing", nodes, inits)


def expected_logits(x: np.ndarray) -> np.ndarray:
    """What the handmade model computes for preprocessed input [N,3,32,32]."""
    return x.reshape(len(x), -1) @ PIXEL_WEIGHT + BIAS


def image(size: tuple[int, int] = (64, 48), seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A smooth random image (so JPEG artefacts stay small)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    img = Image.fromarray(small, "RGB").resize(size, Image.BILINEAR)
    return img if mode == "RGB" else img.convert(mode)


def encode(img: Image.Image, fmt: str = "PNG", **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def free_port() -> int:
    """A port that was free a moment ago (racy: another process may take it). Prefer ``--port 0`` and
    :func:`announced_url` / :func:`url_in_log`, which read the port the server really bound."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ANNOUNCED = re.compile(r"irpe serve: listening on (http://[0-9.]+:[0-9]+)")


def announced_url(proc: subprocess.Popen, lines: list[str] | None = None) -> str:
    """Read ``proc.stdout`` (text) until ``irpe serve`` announces its bound address; lines read go to ``lines``."""
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, ""):
        if lines is not None:
            lines.append(line)
        if m := ANNOUNCED.search(line):
            return m.group(1)
    raise RuntimeError(f"server exited ({proc.wait(10)}) without announcing its address: {''.join(lines or [])}")


def url_in_log(proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> str:
    """Poll ``log`` (the server's stdout/stderr file) until the 'listening on' line appears."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if m := ANNOUNCED.search(log.read_text(errors="replace")):
            return m.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    raise TimeoutError(f"no 'listening on' line within {timeout}s:\n{log.read_text(errors='replace')}")


def wait_ready(url: str, timeout: float = 20.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready within {timeout}s")


def wait_every_front_end_ready(url: str, timeout: float = 60.0) -> None:
    """10 new connections in a row answered /readyz 200: with --frontends the kernel spreads connections over
    the front ends, and one may still be warming up when another already answers 200."""
    wait_for_readyz(url, 200, timeout=timeout)


def wait_for_readyz(url: str, status: int, *, timeout: float, check: Callable[[Any], None] | None = None,
                    retry_errors: bool = True) -> None:
    """Wait until 10 new connections in a row answer /readyz ``status`` (with --frontends each front end
    turns on its own: warming up, or draining after SIGTERM).

    Args:
        url: the server's base URL.
        status: the status every front end must answer.
        timeout: seconds to wait.
        check: called with each answer of ``status`` (an assertion on its body).
        retry_errors: a request that gets no answer (not listening yet) counts as a miss; False: it fails.

    Raises:
        TimeoutError: no such streak within ``timeout``.
        httpx.HTTPError: a request got no answer and ``retry_errors`` is False.
    """
    import httpx

    streak, deadline = 0, time.monotonic() + timeout
    while streak < 10:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}: /readyz not {status} on 10 connections in a row within {timeout}s")
        try:
            answer = httpx.get(url + "/readyz", timeout=5)
        except httpx.HTTPError:
            if not retry_errors:
                raise
            answer = None
        if answer is not None and answer.status_code == status:
            if check is not None:
                check(answer)
            streak += 1
        else:
            streak = 0
            time.sleep(0.02)


@contextlib.contextmanager
def serving_app(app: object) -> Iterator[str]:
    """A real uvicorn server for ``app`` on 127.0.0.1 in a thread; yields its base URL once bound (maybe not
    ready yet). Port 0: the OS picks a free port and the test reads back the one really bound (no race)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)


@contextlib.contextmanager
def running_server(artifact_dir: Path, **settings: object) -> Iterator[str]:
    """A real uvicorn server on 127.0.0.1 in a thread; yields its base URL once /readyz answers 200 (within
    60 s: a slow test model's warm-up runs each batch size for seconds, longer on a loaded CI machine)."""
    from irpe.server.config import Settings
    from irpe.server.http.app import create_app

    cfg = Settings.from_env(env={}, artifact_dir=str(artifact_dir), port=0, log_level="warning", **settings)
    with serving_app(create_app(cfg)) as url:
        wait_ready(url, timeout=60)
        yield url


@contextlib.contextmanager
def client_shm_region(tag: str, size: int = 64 * 1024) -> Iterator[tuple[str, object]]:
    """A POSIX shared-memory region made with tritonclient's ``shared_memory`` utilities, as a client makes
    one: (its key, its handle); destroyed on exit."""
    import uuid

    from tritonclient.utils import shared_memory as shm

    key = f"/{tag}_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(tag, key, size)
    try:
        yield key, handle
    finally:
        shm.destroy_shared_memory_region(handle)


async def protocol_over_socketpair(app: object, settings: object | None = None) -> tuple[object, object, object]:
    """irpe serve's HTTP protocol (:func:`irpe.server.http.protocol.protocol_factory`) serving the ASGI ``app``
    on one end of a real socket pair, in the running loop: (the protocol, its transport, the peer socket,
    non-blocking)."""
    import asyncio
    import socket

    import uvicorn
    from uvicorn.server import ServerState

    from irpe.server.config import Settings
    from irpe.server.http.protocol import protocol_factory

    config = uvicorn.Config(app, http=protocol_factory(settings or Settings()), log_level="warning", lifespan="off")
    config.load()
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    proto = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: proto, ours)
    return proto, transport, theirs


def listeners(port: int) -> int:
    """How many sockets listen on ``port`` (IPv4 and IPv6 tables: gRPC binds v4-mapped v6)."""
    rows = [line.split() for table in ("tcp", "tcp6")
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]]
    return len([r for r in rows if r[1].endswith(f":{port:04X}") and r[3] == "0A"])


def connections_spread(pids: list[int], port: int, count: int) -> dict[int, int]:
    """Open ``count`` connections to 127.0.0.1:``port`` at once; how many each of ``pids`` accepted (their socket
    inodes in /proc), once all ``count`` are accepted or 5 s have passed. The connections are closed after."""
    clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]
    try:
        held: dict[int, int] = {}
        for _ in range(50):
            held = _connections_by_pid(pids, port)
            if sum(held.values()) == count:
                break
            time.sleep(0.1)
        return held
    finally:
        for client in clients:
            client.close()


def _connections_by_pid(pids: list[int], port: int) -> dict[int, int]:
    """Established TCP connections on local ``port`` held by each of ``pids``."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            row = line.split()
            if row[1].endswith(f":{port:04X}") and row[3] == "01":
                inodes.add(f"socket:[{row[9]}]")
    return {pid: sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if _link(fd) in inodes) for pid in pids}


def _link(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:
        return ""
