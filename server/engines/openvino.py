"""OpenVINO CPU engine: the artifact's model.onnx (fp32 or int8 QDQ) compiled by OpenVINO, imported lazily.

Same interface as :class:`irpe.server.engine.OrtEngine`: ``run(float32 [N,3,H,W]) -> float32 [N,classes]``.
No separate IR: OpenVINO reads the ONNX file, its iRPE q/k lookups are rewritten into OpenVINO's fast form
(:mod:`irpe.artifact.openvino_graph`, same answers); compiled blobs are cached in ``IRPE_OV_CACHE_DIR`` when set.

Precision (``--precision``): ``fp32`` runs float parts in f32; ``bf16`` sets OpenVINO's inference-precision
hint to bf16 (only where the CPU has native bf16, else fp32 and a log line); ``auto`` is bf16 where the CPU has
it and the export verified bf16 on held-out images (model.json ``fidelity.bf16.passed``), else fp32: precision
is never lowered without a fidelity check. An int8 QDQ artifact runs its quantized MatMuls in int8 and the
rest in the chosen float precision.

``--backend auto`` on a CPU picks OpenVINO (see :func:`preferred`) when it is installed and the artifact is
int8 or runs in bf16: measured in ``irpe bench cpu``, OpenVINO runs an fp32 graph as fast as ONNX Runtime,
bf16 in about half the time and our int8 QDQ graph about 2x faster than ONNX Runtime runs it.

Thread safety: the batcher calls ``run`` from several worker threads; each thread has its own infer request
on a model compiled with one stream per worker.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ModelArtifact
from irpe.artifact.openvino_graph import read_model

from .base import Engine, EngineError, EngineInfo, batch_sizes

log = logging.getLogger("irpe.server")
MISSING = ("--backend openvino needs OpenVINO, which is not installed: pip install '.[cpu]' from the irpe-deploy "
           "checkout's root (or use --backend onnxruntime)")


def import_openvino() -> Any:
    """The ``openvino`` module, or EngineError naming the ``[cpu]`` extra."""
    try:
        import openvino
    except ImportError:
        raise EngineError(MISSING) from None
    return openvino


def openvino_available() -> bool:
    """True when ``import openvino`` works (used by ``--backend auto``)."""
    try:
        import_openvino()
    except EngineError:
        return False
    return True


def cpu_has_bf16(core: Any) -> bool:
    """Whether OpenVINO's CPU plugin reports native bf16 (AVX512-BF16 or AMX)."""
    return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def resolve_precision(requested: str, artifact: ModelArtifact, has_bf16: bool) -> str:
    """The float precision actually used: fp32 or bf16 (see the module docstring)."""
    if requested == "fp32":
        return "fp32"
    if not has_bf16:
        if requested == "bf16":
            log.warning("--precision bf16: this CPU has no native bf16 (AVX512-BF16/AMX); running fp32")
        return "fp32"
    if requested == "auto" and fidelity_report(artifact, "bf16").get("passed") is not True:
        return "fp32"
    return "bf16"


def preferred(artifact: ModelArtifact, precision: str) -> bool:
    """Whether ``--backend auto`` should run ``artifact`` on OpenVINO rather than ONNX Runtime on this CPU."""
    if artifact.rpe_plugin or not openvino_available():
        return False
    if str(quantization_of(artifact).get("precision", "")) == "int8" or precision == "bf16":
        return True
    import openvino as ov

    return resolve_precision(precision, artifact, cpu_has_bf16(ov.Core())) == "bf16"


def fidelity_report(artifact: ModelArtifact, key: str) -> dict[str, Any]:
    """``model.json`` fidelity report ``key`` (``int8``, ``bf16``), or {} when absent."""
    report = getattr(artifact, "fidelity", None) or {}
    value = report.get(key) if isinstance(report, dict) else None
    return value if isinstance(value, dict) else {}


def compile_config(precision: str, threads: int, streams: int) -> dict[str, Any]:
    """OpenVINO CPU properties: latency-oriented, ``streams`` streams sharing ``threads`` x ``streams`` threads."""
    return {"INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": str(max(1, streams)),
            "INFERENCE_NUM_THREADS": str(max(1, threads) * max(1, streams)),
            "ENABLE_CPU_PINNING": "NO"}


def compile_onnx(onnx_path: str | Path, *, precision: str = "fp32", threads: int = 0, streams: int = 1) -> Any:
    """An OpenVINO CompiledModel of ``onnx_path`` on the CPU (no artifact needed; used by benches and tests)."""
    ov = import_openvino()
    core = ov.Core()
    cache = os.environ.get("IRPE_OV_CACHE_DIR")
    if cache:
        core.set_property({"CACHE_DIR": cache})
    threads = threads or max(1, (os.cpu_count() or 1) // max(1, streams))
    try:
        return core.compile_model(read_model(core, onnx_path), "CPU", compile_config(precision, threads, streams))
    except Exception as e:  # OpenVINO raises RuntimeError subclasses with multi-line messages
        raise EngineError(f"{onnx_path}: OpenVINO cannot compile it ({str(e).strip().splitlines()[0][:200]}); "
                          "re-run `irpe export` or use --backend onnxruntime") from None


class OpenVINOEngine(Engine):
    """An OpenVINO CompiledModel on the CPU, one infer request per calling thread."""

    def __init__(self, onnx_path: Path, artifact: ModelArtifact, *, precision: str = "auto", threads: int = 0,
                 streams: int = 1, max_batch: int = 16):
        ov = import_openvino()
        if artifact.rpe_plugin:
            raise EngineError("this artifact's ONNX graph uses irpe:: plugin ops, which OpenVINO cannot run; "
                              "re-export without --rpe-plugin")
        self.float_precision = resolve_precision(precision, artifact, cpu_has_bf16(ov.Core()))
        self.compiled = compile_onnx(onnx_path, precision=self.float_precision, threads=threads, streams=streams)
        inputs = {i.get_any_name(): i for i in self.compiled.inputs}
        if artifact.input_name not in inputs:
            raise EngineError(f"{onnx_path}: no input {artifact.input_name!r} (has {sorted(inputs)}); re-export")
        shape = inputs[artifact.input_name].get_partial_shape()
        found = [d.get_length() if d.is_static else -1 for d in shape]
        crop = artifact.preprocess.crop
        if len(found) != 4 or any(f not in (-1, w) for f, w in zip(found[1:], [3, crop, crop], strict=True)):
            raise EngineError(f"{onnx_path}: the graph takes {found}, but model.json says crop {crop}; "
                              "re-export the artifact")
        self.input_name = artifact.input_name
        try:
            self.output_port = self.compiled.output(artifact.output_name)
        except RuntimeError:
            raise EngineError(f"{onnx_path}: no output {artifact.output_name!r}; re-export the artifact") from None
        self._local = threading.local()
        int8 = str(quantization_of(artifact).get("precision", "")) == "int8"
        precision_name = ("int8+" if int8 else "") + self.float_precision
        limit = max_batch if found[0] == -1 else min(max_batch, found[0])
        self.info = EngineInfo("openvino", "cpu", [f"OpenVINO {ov.get_version().split('-')[0]} CPU"],
                               found, limit, batch_sizes(limit), precision=precision_name)

    def _request(self) -> Any:
        req = getattr(self._local, "request", None)
        if req is None:
            req = self._local.request = self.compiled.create_infer_request()
        return req

    def run(self, images: np.ndarray) -> np.ndarray:
        """float32 [N,3,H,W] -> float32 [N,classes]."""
        out = self._request().infer({self.input_name: np.ascontiguousarray(images, dtype=np.float32)})
        return np.array(out[self.output_port], dtype=np.float32)  # a copy: the request reuses its buffer


def quantization_of(artifact: ModelArtifact) -> dict[str, Any]:
    """``model.json`` ``quantization`` (empty for a float artifact)."""
    quantization = getattr(artifact, "quantization", None)
    return quantization if isinstance(quantization, dict) else {}
