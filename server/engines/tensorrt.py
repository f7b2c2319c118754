"""Native TensorRT engine (TensorRT 10/11 tensor API + cuda-python), imported only for ``--backend tensorrt``.

Concurrency: the batcher may call :meth:`TensorRTEngine.run` from several inference threads at once. An
execution context, its stream and its device buffers are used by one call at a time: the engine keeps one
*slot* (context + stream + buffers) per optimization profile and a call takes a free slot, waiting when none
is free. One slot per profile because "if the engine supports dynamic shapes, each execution context in
concurrent use must use a separate optimization profile" (NVIDIA TensorRT include/NvInferRuntime.h,
``createExecutionContext``); a plan with one profile therefore runs one batch at a time, never two batches
in one set of buffers.

Before deserialising, the TensorRT version and GPU compute capability recorded in model.json next to the plan
are compared with this host's: a plan only loads on the TensorRT version and GPU it was built for.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ModelArtifact

from .base import Engine, EngineError, EngineInfo, batch_sizes


def _import_runtime() -> tuple[Any, Any]:
    try:
        import tensorrt as trt
    except ImportError:
        raise EngineError("--backend tensorrt needs the TensorRT Python package: pip install tensorrt "
                          "(or build the GPU image with --build-arg TENSORRT=1), or use --backend "
                          "onnxruntime") from None
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python layout
        except ImportError:
            raise EngineError("--backend tensorrt needs cuda-python: pip install cuda-python") from None
    return trt, cudart


def _check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise EngineError(f"CUDA runtime error {err}")
    return rest[0] if len(rest) == 1 else rest


def device_capability(cudart: Any) -> str:
    """Compute capability of the current CUDA device, e.g. ``"9.0"``."""
    dev = _check(cudart.cudaGetDevice())
    attr = cudart.cudaDeviceAttr
    major = _check(cudart.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMajor, dev))
    minor = _check(cudart.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMinor, dev))
    return f"{int(major)}.{int(minor)}"


def check_build_environment(entry: dict[str, Any], trt_version: str, capability: str, plan: Path) -> None:
    """EngineError when model.json says the plan was built with another TensorRT or for another GPU."""
    built_trt = entry.get("tensorrt_version")
    built_cc = entry.get("compute_capability")
    problems = []
    if built_trt and built_trt.split(".")[:3] != trt_version.split(".")[:3]:
        problems.append(f"TensorRT {built_trt}, this host has {trt_version}")
    if built_cc and str(built_cc) != capability:
        problems.append(f"a GPU of compute capability {built_cc}, this GPU is {capability}")
    if problems:
        raise EngineError(f"{plan}: the plan was built with {' and for '.join(problems)}; rebuild it here with "
                          "`irpe export CHECKPOINT -o DIR --format tensorrt` (plans are not portable)")


@dataclass
class _Slot:
    """One execution context with its own stream and device buffers (one optimization profile)."""

    context: Any
    stream: Any
    d_in: Any
    d_out: Any
    limit: int


class TensorRTEngine(Engine):
    """Deserialises ``model.plan``; runs batches on a pool of per-profile contexts (see module doc)."""

    def __init__(self, plan: Path, artifact: ModelArtifact, *, max_batch: int):
        if not plan.is_file():
            raise EngineError(f"{plan}: no TensorRT plan; run `irpe export --format tensorrt` on a GPU host")
        trt, self.cudart = _import_runtime()
        check_build_environment(dict(artifact.engines.get("tensorrt", {})), trt.__version__,
                                device_capability(self.cudart), plan)
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
        if self.engine is None:
            raise EngineError(f"{plan}: TensorRT could not deserialise it (built for another GPU or "
                              "TensorRT version?); rebuild it on this host")
        self.input_name = artifact.input_name
        self.output_name = artifact.output_name
        self.in_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(self.input_name)))
        self.out_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(self.output_name)))
        self.classes = artifact.num_classes
        crop = artifact.preprocess.crop
        self._slots: queue.Queue[_Slot] = queue.Queue()
        profiles = max(1, int(getattr(self.engine, "num_optimization_profiles", 1)))
        for profile in range(profiles):
            self._slots.put(self._make_slot(profile, max_batch, crop))
        limit = min(slot.limit for slot in list(self._slots.queue))
        self.info = EngineInfo("tensorrt", "cuda", ["TensorRT"], [-1, 3, crop, crop], limit, batch_sizes(limit))

    def _make_slot(self, profile: int, max_batch: int, crop: int) -> _Slot:
        cudart = self.cudart
        limit = min(max_batch, int(self.engine.get_tensor_profile_shape(self.input_name, profile)[2][0]))
        context = self.engine.create_execution_context()
        stream = _check(cudart.cudaStreamCreate())
        if profile:
            context.set_optimization_profile_async(profile, int(stream))
        d_in = _check(cudart.cudaMalloc(limit * 3 * crop * crop * self.in_dtype.itemsize))
        d_out = _check(cudart.cudaMalloc(limit * self.classes * self.out_dtype.itemsize))
        return _Slot(context, stream, d_in, d_out, limit)

    def run(self, images: np.ndarray) -> np.ndarray:
        """float32 [N,3,H,W] -> float32 [N,classes] through the plan (thread-safe)."""
        slot = self._slots.get()
        try:
            return self._run(slot, images)
        finally:
            self._slots.put(slot)

    def _run(self, slot: _Slot, images: np.ndarray) -> np.ndarray:
        cudart = self.cudart
        n = images.shape[0]
        if n > slot.limit:
            raise EngineError(f"batch of {n} exceeds the plan's maximum batch {slot.limit}")
        feed = np.ascontiguousarray(images, dtype=self.in_dtype)
        out = np.empty((n, self.classes), dtype=self.out_dtype)
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        ctx = slot.context
        ctx.set_input_shape(self.input_name, tuple(feed.shape))
        ctx.set_tensor_address(self.input_name, int(slot.d_in))
        ctx.set_tensor_address(self.output_name, int(slot.d_out))
        _check(cudart.cudaMemcpyAsync(int(slot.d_in), feed.ctypes.data, feed.nbytes, h2d, slot.stream))
        if not ctx.execute_async_v3(int(slot.stream)):
            raise EngineError("TensorRT execution failed")
        _check(cudart.cudaMemcpyAsync(out.ctypes.data, int(slot.d_out), out.nbytes, d2h, slot.stream))
        _check(cudart.cudaStreamSynchronize(slot.stream))
        return out.astype(np.float32)
