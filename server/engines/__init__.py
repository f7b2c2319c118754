"""Inference engines behind one interface (:mod:`.base`), one module per backend; this package chooses.

ONNX Runtime (:mod:`.onnxruntime`, CPU or CUDA) is the default; OpenVINO (:mod:`.openvino`) on a CPU for
bf16 and int8 artifacts; a native TensorRT engine (:mod:`.tensorrt`, ``model.plan``) with ``--backend
tensorrt`` (or ``auto`` on a GPU when the artifact has a plan and TensorRT is installed).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

import numpy as np

from irpe.artifact import ModelArtifact

from .base import Engine, EngineError, EngineInfo, batch_sizes

__all__ = ["Engine", "EngineError", "EngineInfo", "batch_sizes", "choose_backend", "load_engine", "plan_path",
           "warm_up"]
log = logging.getLogger("irpe.server")


def plan_path(directory: Path, artifact: ModelArtifact) -> Path:
    """Where the artifact's TensorRT plan is (named by model.json ``engines.tensorrt.file``)."""
    entry = artifact.engines.get("tensorrt", {})
    return directory / str(entry.get("file") or entry.get("path") or "model.plan")


def choose_backend(directory: Path, artifact: ModelArtifact, backend: str, device: str, precision: str = "auto") -> str:
    """Resolve ``auto``: TensorRT on a GPU when the plan and the package exist; on a CPU, OpenVINO when it is
    installed and the artifact is int8 or runs in bf16 (``openvino_engine.preferred``: at fp32 both runtimes
    are equally fast, measured in ``irpe bench cpu``); else ONNX Runtime."""
    if backend != "auto":
        return backend
    if device == "cuda" and plan_path(directory, artifact).is_file() and importlib.util.find_spec("tensorrt"):
        return "tensorrt"
    if device == "cpu":
        from .openvino import preferred

        if preferred(artifact, precision):
            return "openvino"
    return "onnxruntime"


def load_engine(directory: str | Path, artifact: ModelArtifact, *, backend: str = "auto", device: str = "cpu",
                threads: int = 0, max_batch: int = 16, precision: str = "auto", streams: int = 1,
                solo_threads: int = 0) -> Engine:
    """Build the engine for an artifact directory; raises EngineError with the fix on failure.

    ``precision`` (auto, fp32, bf16) is the float precision OpenVINO runs; ``streams`` the number of threads
    that call ``run`` concurrently (OpenVINO compiles one stream each); ``solo_threads``: ONNX Runtime on a
    CPU also gets a session with that many threads for a batch that runs alone (``run_solo``)."""
    directory = Path(directory)
    backend = choose_backend(directory, artifact, backend, device, precision)
    if backend == "openvino":
        if device != "cpu":
            raise EngineError("--backend openvino runs on the CPU; use --device cpu")
        from .openvino import OpenVINOEngine

        return OpenVINOEngine(directory / artifact.onnx_file, artifact, precision=precision, threads=threads,
                              streams=streams, max_batch=max_batch)
    if precision == "bf16":
        raise EngineError(f"--precision bf16 needs --backend openvino ({backend} runs fp32 here); "
                          "pip install '.[cpu]' from the irpe-deploy checkout's root and pass --backend openvino")
    if backend == "tensorrt":
        if device != "cuda":
            raise EngineError("--backend tensorrt needs --device cuda")
        from .tensorrt import TensorRTEngine

        return TensorRTEngine(plan_path(directory, artifact), artifact, max_batch=max_batch)
    if artifact.rpe_plugin:
        raise EngineError("this artifact's ONNX graph uses irpe:: plugin ops, which the torch-free server "
                          "cannot run in ONNX Runtime; re-export without --rpe-plugin (or serve its TensorRT "
                          "plan with --backend tensorrt)")
    from .onnxruntime import OrtEngine

    return OrtEngine(directory / artifact.onnx_file, artifact, device=device, threads=threads, max_batch=max_batch,
                     solo_threads=solo_threads)


def warm_up(engine: Engine, artifact: ModelArtifact) -> float:
    """Run every batch size the batcher will use once; returns the seconds spent."""
    start = time.perf_counter()
    shape = (3, artifact.preprocess.crop, artifact.preprocess.crop)
    solo = getattr(engine, "run_solo", None)
    runs = [(engine.run, n) for n in engine.info.batch_sizes] + ([(solo, 1)] if solo else [])
    for run, n in runs:
        out = run(np.zeros((n, *shape), dtype=np.float32))
        if out.shape != (n, artifact.num_classes):
            raise EngineError(f"model output shape {out.shape} != ({n}, {artifact.num_classes}) from model.json; "
                              "re-export the artifact")
    keep = getattr(engine, "keep_solo", None)
    if keep is not None:
        keep(np.zeros((1, *shape), dtype=np.float32))
    return time.perf_counter() - start
