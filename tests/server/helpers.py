"""Test helpers: a torch-free handmade artifact, images, and a real uvicorn server in a thread."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from irpe.artifact import ModelArtifact, Preprocess, file_sha256, save_artifact

NUM_CLASSES = 10
CROP = 32
LABELS = [f"class_{i}" for i in range(NUM_CLASSES)]
RNG = np.random.default_rng(1234)
WEIGHT = RNG.normal(size=(3, NUM_CLASSES)).astype(np.float32) * 4
BIAS = RNG.normal(size=(NUM_CLASSES,)).astype(np.float32)


def make_artifact(directory: Path, name: str = "tiny-mean") -> Path:
    """images [N,3,32,32] -> ReduceMean over H,W -> MatMul -> Add -> logits [N,10], plus model.json."""
    from onnx import TensorProto, helper, numpy_helper, save

    nodes = [helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, CROP, CROP])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        initializer=[numpy_helper.from_array(WEIGHT, "W"), numpy_helper.from_array(BIAS, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory.mkdir(parents=True, exist_ok=True)
    save(model, str(directory / "model.onnx"))
    art = ModelArtifact(name=name, architecture={"kind": "handmade"}, img_size=CROP, num_classes=NUM_CLASSES,
                        preprocess=Preprocess(resize=36, crop=CROP), labels=list(LABELS),
                        onnx_sha256=file_sha256(directory / "model.onnx"))
    save_artifact(art, directory)
    return directory


def make_failing_artifact(directory: Path) -> Path:
    """Like :func:`make_artifact`, but inference fails at run time (a Gather index out of range) for any
    input whose maximum exceeds 0.01, i.e. every real image, while the all-zero warm-up passes."""
    from onnx import TensorProto, helper, numpy_helper, save

    nodes = [helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["mm"]),
             helper.make_node("ReduceMax", ["images"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "scale"], ["scaled"]),
             helper.make_node("Cast", ["scaled"], ["index"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "index"], ["offset"]),
             helper.make_node("Add", ["mm", "offset"], ["logits"])]
    inits = [numpy_helper.from_array(WEIGHT, "W"), numpy_helper.from_array(np.float32(1000.0), "scale"),
             numpy_helper.from_array(np.zeros(10, np.float32), "table")]
    graph = helper.make_graph(
        nodes, "failing", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, CROP, CROP])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory.mkdir(parents=True, exist_ok=True)
    save(model, str(directory / "model.onnx"))
    art = ModelArtifact(name="failing", architecture={"kind": "handmade"}, img_size=CROP, num_classes=NUM_CLASSES,
                        preprocess=Preprocess(resize=36, crop=CROP), labels=list(LABELS),
                        onnx_sha256=file_sha256(directory / "model.onnx"))
    save_artifact(art, directory)
    return directory


def expected_logits(x: np.ndarray) -> np.ndarray:
    """What the handmade model computes for preprocessed input [N,3,32,32]."""
    return x.mean(axis=(2, 3)) @ WEIGHT + BIAS


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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float = 20.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready within {timeout}s")


@contextlib.contextmanager
def running_server(artifact_dir: Path, **settings: object) -> Iterator[str]:
    """A real uvicorn server on 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn

    from irpe.server.app import create_app
    from irpe.server.config import Settings

    port = free_port()
    cfg = Settings.from_env(env={}, artifact_dir=str(artifact_dir), port=port, log_level="warning", **settings)
    server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(15)
