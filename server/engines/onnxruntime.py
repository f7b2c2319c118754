"""ONNX Runtime (CPU or CUDA), the default backend.

ONNX Runtime silently falls back to CPU when the CUDA libraries are missing, so the providers actually in
use are checked after the session is built and a GPU request that ended on CPU is an error.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ModelArtifact
from irpe.artifact.ort_graph import DOMAIN, prepare

from ..config import usable_cpus
from .base import Engine, EngineError, EngineInfo, batch_sizes

log = logging.getLogger("irpe.server")
INT8_ON_CPU = ("int8 artifact on ONNX Runtime (CPU): it runs no faster than the fp32 graph here (1.15-1.3x slower "
               "measured); OpenVINO is its fast path: pip install '.[cpu]' from the irpe-deploy checkout's root and "
               "serve with --backend auto")


class OrtEngine(Engine):
    """An ONNX Runtime session; a static batch dimension is honoured by padding.

    ``solo_threads`` > ``threads`` (on a CPU whose cores are split between inference threads) adds a second
    session with that many intra-op threads for :meth:`run_solo`: a batch that runs while the engine is
    otherwise idle gets every core instead of its share (a lone request's latency; the batcher asks for it
    on a slow engine only). The warm-up keeps it only where it is faster (:meth:`keep_solo`)."""

    def __init__(self, onnx_path: Path, artifact: ModelArtifact, *, device: str, threads: int, max_batch: int,
                 solo_threads: int = 0):
        import onnxruntime as ort
        if device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            _require_cuda_driver()  # before ONNX Runtime prints its own fallback errors

        if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise EngineError("--device cuda: this onnxruntime has no CUDAExecutionProvider "
                              f"(available: {ort.get_available_providers()}); install the [gpu] extra: "
                              "pip install '.[gpu]' from the irpe-deploy checkout's root (onnxruntime-gpu)")
        graph = prepare(onnx_path) if device == "cpu" else (str(onnx_path), None)
        self.session, graph = _session(ort, onnx_path, threads, device, graph=graph)
        solo = device == "cpu" and solo_threads > (threads or usable_cpus())
        self.solo_session = _session(ort, onnx_path, solo_threads, device, True, graph)[0] if solo else None
        used = self.session.get_providers()
        if device == "cuda" and "CUDAExecutionProvider" not in used:
            raise EngineError("--device cuda: ONNX Runtime fell back to CPU (providers in use: "
                              f"{used}); check the CUDA and cuDNN libraries onnxruntime-gpu was built for are on the "
                              "library path")
        spec = _checked_input(self.session, onnx_path, artifact)
        self.input_name = artifact.input_name
        self.output_name = artifact.output_name
        self.dtype = np.float16 if spec.type == "tensor(float16)" else np.float32
        self.static_batch = spec.shape[0] if isinstance(spec.shape[0], int) else 0
        limit = min(max_batch, self.static_batch) if self.static_batch else max_batch
        precision = "int8+fp32" if artifact.quantization.get("precision") == "int8" else "fp32"
        if precision == "int8+fp32" and device == "cpu":
            log.warning(INT8_ON_CPU)
        self.info = EngineInfo("onnxruntime", device, list(used), list(spec.shape), limit, batch_sizes(limit),
                               precision="fp16" if self.dtype == np.float16 else precision,
                               custom_ops=[DOMAIN] if graph[1] else [])

    def run(self, images: np.ndarray) -> np.ndarray:
        """float32 [N,3,H,W] -> float32 [N,classes]."""
        return self._run(self.session, images)

    def run_solo(self, images: np.ndarray) -> np.ndarray:
        """:meth:`run` on every core (the solo session; the shared one when there is none)."""
        return self._run(self.solo_session or self.session, images)

    def keep_solo(self, images: np.ndarray, rounds: int = 8, gain: float = 0.8, budget_s: float = 2.0) -> bool:
        """Time ``images`` on both sessions (interleaved, fastest of ``rounds``); keep the solo session only
        when it takes at most ``gain`` of the shared one's time. The fastest, not the median: a new session's
        first runs can take a single-thread time until the scheduler has put its threads on separate cores.
        A model whose runs take seconds stops after the round that spends ``budget_s`` (its start-up stays
        seconds, not minutes; a run that long outlasts the scheduler's placement anyway).

        Args:
            images: a warm-up batch.
            rounds: timed runs per session, at most.
            gain: the largest solo/shared time ratio that keeps the solo session.
            budget_s: no further round starts once the rounds so far have taken this long (at least one runs).

        Returns:
            Whether the solo session is kept.
        """
        if self.solo_session is None:
            return False
        times: dict[str, list[float]] = {"shared": [], "solo": []}
        for _ in range(rounds):
            for name, session in (("shared", self.session), ("solo", self.solo_session)):
                start = time.perf_counter()
                self._run(session, images)
                times[name].append(time.perf_counter() - start)
            if sum(times["shared"]) + sum(times["solo"]) >= budget_s:
                break
        if min(times["solo"]) > gain * min(times["shared"]):
            self.solo_session = None
        return self.solo_session is not None

    def _run(self, session: Any, images: np.ndarray) -> np.ndarray:
        n = images.shape[0]
        feed = images.astype(self.dtype, copy=False)
        if self.static_batch and n != self.static_batch:
            pad = np.zeros((self.static_batch - n, *feed.shape[1:]), dtype=self.dtype)
            feed = np.concatenate([feed, pad])
        (out,) = session.run([self.output_name], {self.input_name: feed})
        return np.asarray(out[:n], dtype=np.float32)


def _checked_input(session: Any, onnx_path: Path, artifact: ModelArtifact) -> Any:
    """The graph's image input, once its shape and the output's classes agree with model.json (else EngineError)."""
    inputs = {i.name: i for i in session.get_inputs()}
    if artifact.input_name not in inputs:
        raise EngineError(f"{onnx_path}: no input {artifact.input_name!r} (has {sorted(inputs)}); re-export")
    spec = inputs[artifact.input_name]
    want = [3, artifact.preprocess.crop, artifact.preprocess.crop]
    found = list(spec.shape[1:])
    outputs = {o.name: list(o.shape) for o in session.get_outputs()}
    out_shape = outputs.get(artifact.output_name, [None, None])
    shape_differs = all(isinstance(d, int) for d in found) and found != want
    classes_differ = isinstance(out_shape[-1], int) and out_shape[-1] != artifact.num_classes
    if shape_differs or classes_differ:
        raise EngineError(f"{onnx_path}: the graph takes {spec.shape} and gives {out_shape}, but model.json "
                          f"says crop {artifact.preprocess.crop} and {artifact.num_classes} classes; "
                          "re-export the artifact")
    return spec


def _session(ort: Any, onnx_path: Path, threads: int, device: str, spin: bool = False,
             graph: tuple[str | bytes, str | None] | None = None) -> tuple[Any, tuple[str | bytes, str | None]]:
    """(a session, the graph it runs): ``graph`` (:func:`irpe.artifact.ort_graph.prepare`: on a CPU, the iRPE
    lookups as custom ops), or the file as exported where that graph does not load (said in one line)."""
    source, library = graph or (str(onnx_path), None)
    try:
        if library:
            try:
                so = _session_options(ort, threads, spin)
                so.register_custom_ops_library(library)
                return ort.InferenceSession(source, so, providers=_providers(device)), (source, library)
            except Exception as e:  # onnxruntime's own types; the file as exported still serves
                log.warning("%s: the iRPE custom ops do not load here (%s); running the lookups in standard ONNX "
                            "ops", onnx_path, str(e).strip().splitlines()[-1][:200])
                source = str(onnx_path)
        so = _session_options(ort, threads, spin)
        return ort.InferenceSession(source, so, providers=_providers(device)), (source, None)
    except Exception as e:  # onnxruntime's own types (InvalidProtobuf, Fail, ...) for a bad file
        raise EngineError(f"{onnx_path}: ONNX Runtime cannot load it ({str(e).strip().splitlines()[-1][:200]}); "
                          "re-run `irpe export` or restore the file") from None


def _session_options(ort: Any, threads: int, spin: bool = False) -> Any:
    """``spin``: intra-op threads spin between the graph's parallel sections instead of sleeping. The solo
    session needs it (it runs only while the engine is idle): without it a 2-thread DeiT-Tiny batch 1 took
    32.6 ms, as long as one thread (32.8), against 20.1 ms spinning. It stops spinning when a run ends
    (``session.force_spinning_stop``): the answer, and the next request, need the cores then. The shared
    sessions run beside image decoding on the same cores, where idle ORT threads must not spin."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or usable_cpus()
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if spin:  # spin inside a run only: after it the event loop must answer and read the next request
        so.add_session_config_entry("session.force_spinning_stop", "1")
    return so


def _providers(device: str) -> list[Any]:
    if device == "cuda":
        return [("CUDAExecutionProvider", {"device_id": int(os.environ.get("IRPE_CUDA_DEVICE", "0"))}),
                "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _require_cuda_driver() -> None:
    """Without the NVIDIA driver, ONNX Runtime prints its own errors and falls back to CPU: say it in one line."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise EngineError("--device cuda: no NVIDIA driver here (libcuda.so.1 not found); on a GPU host run the "
                          "container with --gpus all (NVIDIA container toolkit), or serve on the CPU with "
                          "--device cpu (the CPU image)") from None
