"""Native TensorRT engine (TensorRT 10 tensor API + cuda-python), imported only for ``--backend tensorrt``.

Not exercised on CPU-only machines (the GPU tests are marked ``gpu``); without the packages it raises an
EngineError that names the install command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ModelArtifact

from .engine import EngineError, EngineInfo, batch_sizes


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


class TensorRTEngine:
    """Deserialises ``model.plan`` and runs it on one CUDA stream with preallocated buffers."""

    def __init__(self, plan: Path, art: ModelArtifact, *, max_batch: int):
        if not plan.is_file():
            raise EngineError(f"{plan}: no TensorRT plan; run `irpe export --format tensorrt` on a GPU host")
        trt, self.cudart = _import_runtime()
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
        if self.engine is None:
            raise EngineError(f"{plan}: TensorRT could not deserialise it (built for another GPU or "
                              "TensorRT version?); rebuild it on this host")
        self.context = self.engine.create_execution_context()
        self.input_name, self.output_name = art.input_name, art.output_name
        profile_max = int(self.engine.get_tensor_profile_shape(self.input_name, 0)[2][0])
        limit = min(max_batch, profile_max)
        self.in_dtype = trt.nptype(self.engine.get_tensor_dtype(self.input_name))
        self.out_dtype = trt.nptype(self.engine.get_tensor_dtype(self.output_name))
        crop, classes = art.preprocess.crop, art.num_classes
        self.stream = _check(self.cudart.cudaStreamCreate())
        self.d_in = _check(self.cudart.cudaMalloc(limit * 3 * crop * crop * np.dtype(self.in_dtype).itemsize))
        self.d_out = _check(self.cudart.cudaMalloc(limit * classes * np.dtype(self.out_dtype).itemsize))
        self.classes = classes
        self.info = EngineInfo("tensorrt", "cuda", ["TensorRT"], [-1, 3, crop, crop], limit, batch_sizes(limit))

    def run(self, images: np.ndarray) -> np.ndarray:
        """float32 [N,3,H,W] -> float32 [N,classes] through the plan."""
        cudart, n = self.cudart, images.shape[0]
        feed = np.ascontiguousarray(images, dtype=self.in_dtype)
        out = np.empty((n, self.classes), dtype=self.out_dtype)
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.context.set_input_shape(self.input_name, tuple(feed.shape))
        self.context.set_tensor_address(self.input_name, int(self.d_in))
        self.context.set_tensor_address(self.output_name, int(self.d_out))
        _check(cudart.cudaMemcpyAsync(int(self.d_in), feed.ctypes.data, feed.nbytes, h2d, self.stream))
        if not self.context.execute_async_v3(int(self.stream)):
            raise EngineError("TensorRT execution failed")
        _check(cudart.cudaMemcpyAsync(out.ctypes.data, int(self.d_out), out.nbytes, d2h, self.stream))
        _check(cudart.cudaStreamSynchronize(self.stream))
        return out.astype(np.float32)
