"""Inference engines behind one interface: ``run(float32 [N,3,H,W]) -> float32 [N,classes]``.

ONNX Runtime (CPU or CUDA) is the default; a native TensorRT engine (``model.plan``) is used with
``--backend tensorrt`` (or ``auto`` on a GPU when the artifact has a plan and TensorRT is installed).
ONNX Runtime silently falls back to CPU when the CUDA libraries are missing, so the providers actually
in use are checked after the session is built and a GPU request that ended on CPU is an error.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from irpe.artifact import ModelArtifact

from .config import usable_cpus

log = logging.getLogger("irpe.server")


class EngineError(RuntimeError):
    """The engine cannot be built as asked (missing runtime, GPU fallback, bad model); names the fix."""


@dataclass
class EngineInfo:
    """What is actually running, reported by /v1/models and the startup log."""

    backend: str
    device: str
    providers: list[str]
    input_shape: list[Any]
    max_batch: int
    batch_sizes: list[int] = field(default_factory=list)


class Engine(Protocol):
    info: EngineInfo

    """float32 [N,3,H,W] -> float32 [N,classes]."""
    def run(self, images: np.ndarray) -> np.ndarray: ...


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes the batcher uses (and warm-up runs): powers of two below max_batch, and max_batch."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if (1 << i) < max_batch]
    return sizes + [max_batch]


class OrtEngine:
    """An ONNX Runtime session; a static batch dimension is honoured by padding."""

    def __init__(self, onnx_path: Path, art: ModelArtifact, *, device: str, threads: int, max_batch: int):
        import onnxruntime as ort

        if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise EngineError("--device cuda: this onnxruntime has no CUDAExecutionProvider "
                              f"(available: {ort.get_available_providers()}); install the [gpu] extra: "
                              "pip install 'irpe-deploy[gpu]' (onnxruntime-gpu)")
        try:
            self.session = ort.InferenceSession(str(onnx_path), _session_options(ort, threads),
                                                providers=_providers(device))
        except Exception as e:  # onnxruntime's own types (InvalidProtobuf, Fail, ...) for a bad file
            raise EngineError(f"{onnx_path}: ONNX Runtime cannot load it ({str(e).strip().splitlines()[-1][:200]}); "
                              "re-run `irpe export` or restore the file") from None
        used = self.session.get_providers()
        if device == "cuda" and "CUDAExecutionProvider" not in used:
            raise EngineError("--device cuda: ONNX Runtime fell back to CPU (providers in use: "
                              f"{used}); check the CUDA 12 / cuDNN 9 libraries are on the library path")
        inputs = {i.name: i for i in self.session.get_inputs()}
        if art.input_name not in inputs:
            raise EngineError(f"{onnx_path}: no input {art.input_name!r} (has {sorted(inputs)}); re-export")
        spec = inputs[art.input_name]
        want, found = [3, art.preprocess.crop, art.preprocess.crop], list(spec.shape[1:])
        outputs = {o.name: list(o.shape) for o in self.session.get_outputs()}
        out_shape = outputs.get(art.output_name, [None, None])
        if all(isinstance(d, int) for d in found) and found != want or \
                isinstance(out_shape[-1], int) and out_shape[-1] != art.num_classes:
            raise EngineError(f"{onnx_path}: the graph takes {spec.shape} and gives {out_shape}, but model.json "
                              f"says crop {art.preprocess.crop} and {art.num_classes} classes; re-export the artifact")
        self.input_name, self.output_name = art.input_name, art.output_name
        self.dtype = np.float16 if spec.type == "tensor(float16)" else np.float32
        self.static_batch = spec.shape[0] if isinstance(spec.shape[0], int) else 0
        limit = min(max_batch, self.static_batch) if self.static_batch else max_batch
        self.info = EngineInfo("onnxruntime", device, list(used), list(spec.shape), limit, batch_sizes(limit))

    def run(self, images: np.ndarray) -> np.ndarray:
        """float32 [N,3,H,W] -> float32 [N,classes]."""
        n = images.shape[0]
        feed = images.astype(self.dtype, copy=False)
        if self.static_batch and n != self.static_batch:
            pad = np.zeros((self.static_batch - n, *feed.shape[1:]), dtype=self.dtype)
            feed = np.concatenate([feed, pad])
        (out,) = self.session.run([self.output_name], {self.input_name: feed})
        return np.asarray(out[:n], dtype=np.float32)


def _session_options(ort: Any, threads: int) -> Any:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or usable_cpus()
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Image decoding runs beside inference on the same cores: idle ORT threads must not spin.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def _providers(device: str) -> list[Any]:
    if device == "cuda":
        return [("CUDAExecutionProvider", {"device_id": int(os.environ.get("IRPE_CUDA_DEVICE", "0"))}),
                "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def plan_path(directory: Path, art: ModelArtifact) -> Path:
    """Where the artifact's TensorRT plan is (named by model.json ``engines.tensorrt.file``)."""
    entry = art.engines.get("tensorrt", {})
    return directory / str(entry.get("file") or entry.get("path") or "model.plan")


def choose_backend(directory: Path, art: ModelArtifact, backend: str, device: str) -> str:
    """Resolve ``auto``: TensorRT on a GPU when the plan and the package exist, else ONNX Runtime."""
    if backend != "auto":
        return backend
    if device == "cuda" and plan_path(directory, art).is_file() and importlib.util.find_spec("tensorrt"):
        return "tensorrt"
    return "onnxruntime"


def load_engine(directory: str | Path, art: ModelArtifact, *, backend: str = "auto", device: str = "cpu",
                threads: int = 0, max_batch: int = 16) -> Engine:
    """Build the engine for an artifact directory; raises EngineError with the fix on failure."""
    directory = Path(directory)
    backend = choose_backend(directory, art, backend, device)
    if backend == "tensorrt":
        if device != "cuda":
            raise EngineError("--backend tensorrt needs --device cuda")
        from .tensorrt_engine import TensorRTEngine

        return TensorRTEngine(plan_path(directory, art), art, max_batch=max_batch)
    if art.rpe_plugin:
        raise EngineError("this artifact's ONNX graph uses irpe:: plugin ops, which the torch-free server "
                          "cannot run in ONNX Runtime; re-export without --rpe-plugin (or serve its TensorRT "
                          "plan with --backend tensorrt)")
    return OrtEngine(directory / art.onnx_file, art, device=device, threads=threads, max_batch=max_batch)


def warm_up(engine: Engine, art: ModelArtifact) -> float:
    """Run every batch size the batcher will use once; returns the seconds spent."""
    start = time.perf_counter()
    shape = (3, art.preprocess.crop, art.preprocess.crop)
    for n in engine.info.batch_sizes:
        out = engine.run(np.zeros((n, *shape), dtype=np.float32))
        if out.shape != (n, art.num_classes):
            raise EngineError(f"model output shape {out.shape} != ({n}, {art.num_classes}) from model.json; "
                              "re-export the artifact")
    return time.perf_counter() - start
