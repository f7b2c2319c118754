"""Open Inference Protocol (KServe v2 / Triton HTTP) routes: health, metadata, configuration, statistics,
repository index and ``infer``.

``infer`` takes the FP32 tensor ``images`` [N,3,H,W] (already preprocessed) as JSON ``data`` or with the
binary tensor extension (``Inference-Header-Content-Length``), and returns ``logits``. An output asking
for ``parameters.classification: k`` gets Triton's classification extension instead: BYTES
``"score:index:label"`` strings (score = the raw logit, as Triton reports), shape [N, k]. Bodies may be
gzip/deflate compressed (``Content-Encoding``; the body limit applies to the inflated size) and answers
are compressed on ``Accept-Encoding``. Requests go through the same batcher as ``/classify``. Every error
under /v2 is ``{"error": "message"}`` (see :mod:`.errors`); the wire format lives in :mod:`.kserve_codec`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

import irpe
from irpe.artifact import ModelArtifact

from ..errors import APIError
from ..hosting.host import ModelVersion
from ..pipeline.service import Service
from . import kserve_codec as codec
from .body import read_limited
from .errors import v2_error_responses
from .routes import service_of

router = APIRouter(prefix="/v2", tags=["kserve-v2"])
HEADER_LEN = "inference-header-content-length"
EXTENSIONS = ["classification", "binary_tensor_data", "model_configuration", "model_repository", "statistics",
              "parameters"]


def _request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "") or uuid.uuid4().hex


def _decode(raw: bytes, encoding: str, header_len: str | None, art: ModelArtifact, limit: int,
            max_images: int) -> tuple[dict[str, Any], np.ndarray]:
    """Inflate, parse and validate (in the decode pool): every check before any inference."""
    body = codec.inflate(raw, encoding, limit)
    split = codec.header_length(header_len, len(body))
    req, spec = codec.parse_request(body[:split], art)
    codec.requested_outputs(req, art)  # bad or repeated outputs are refused before inference
    return req, codec.input_array(spec, body, split, max_images)


async def _infer(request: Request, name: str, version: str | None) -> Response:
    started = time.perf_counter()
    service = service_of(request)
    if not service.host.knows(name):
        service.model(name, version)  # 404 before 503: an unknown model is unknown while warming up too
    with service.use(name, version) as mv:
        return await _infer_on(request, service, mv, started)


async def _infer_on(request: Request, service: Service, mv: ModelVersion, started: float) -> Response:
    art = mv.art
    assert art is not None
    s = service.settings
    raw = await read_limited(request, s.max_body_bytes)
    loop = asyncio.get_running_loop()
    req, images = await loop.run_in_executor(
        service.pool, _decode, raw, request.headers.get("content-encoding", ""), request.headers.get(HEADER_LEN),
        art, s.max_body_bytes, s.max_queue)
    results = await service.with_deadline(service.infer(list(images), mv), started)
    logits = np.stack([r.logits for r in results])  # type: ignore[attr-defined]
    if not np.isfinite(logits).all():  # finite but extreme input can overflow inside the model
        raise codec.ProtocolError("the model output is not finite for this input (values too large?)")
    body, json_len = await loop.run_in_executor(service.pool, codec.render, req, _request_id(request), logits, art,
                                                mv.name, str(mv.version))
    headers = {"Inference-Header-Content-Length": str(json_len)} if json_len is not None else {}
    encoding = codec.negotiate(request.headers.get("accept-encoding"))
    if encoding:
        body = await loop.run_in_executor(service.pool, codec.compress, body, encoding)
        headers["Content-Encoding"] = encoding
    media = "application/json" if json_len is None else "application/octet-stream"
    return Response(body, media_type=media, headers=headers)


_MODEL_ERRORS = v2_error_responses(401, 404, 503)
_INFER_ERRORS = v2_error_responses(400, 401, 404, 413, 415, 500, 503, 504)
_READY_503 = {503: {"description": "not ready (body says ready: false)"}}


@router.get("", responses=v2_error_responses(401))
async def server_metadata() -> dict[str, Any]:
    """Server name, version and protocol extensions."""
    return {"name": "irpe-deploy", "version": irpe.__version__, "extensions": EXTENSIONS}


@router.get("/health/live")
async def live() -> dict[str, bool]:
    """Liveness."""
    return {"live": True}


@router.get("/health/ready", responses=_READY_503)
async def ready(request: Request) -> JSONResponse:
    """Readiness (503 until warmed up, or once an inference thread has died)."""
    service = service_of(request)
    service.check_workers()
    ok = service.ready
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("/models", responses=v2_error_responses(401))
async def list_models(request: Request) -> dict[str, list[str]]:
    """KServe's model list: the names of the served models."""
    return {"models": sorted({mv.name for mv in service_of(request).host.versions()})}


def _stats(service: Service, name: str | None = None, version: str | None = None) -> dict[str, Any]:
    if name is not None:
        mine = [service.model(name, version)] if version else \
            [mv for mv in service.host.versions() if mv.name == service.model(name).name]
    else:
        mine = service.host.versions()
    return {"model_stats": [mv.batcher.stats.to_triton(mv.name, str(mv.version)) for mv in mine
                            if mv.batcher is not None]}


@router.get("/models/stats", responses=v2_error_responses(401))
async def all_stats(request: Request) -> dict[str, Any]:
    """Triton's statistics extension for every model (counters and nanosecond durations of the batcher)."""
    return _stats(service_of(request))


@router.get("/models/{name}/stats", responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}/stats", responses=_MODEL_ERRORS)
async def model_stats(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Triton's statistics extension for one model."""
    return _stats(service_of(request), name, version)


def _metadata(service: Service, mv: ModelVersion) -> dict[str, Any]:
    art = mv.art
    assert art is not None
    crop = art.preprocess.crop
    info = mv.info
    backend, precision = (info.backend, info.precision) if info else ("", None)
    versions = sorted(m.version for m in service.host.versions() if m.name == mv.name) or [mv.version]
    return {"name": mv.name, "versions": [str(v) for v in versions], "platform": _platform(mv)[0],
            "parameters": {"backend": backend or None, "precision": precision},
            "inputs": [{"name": art.input_name, "datatype": codec.DATATYPE, "shape": [-1, 3, crop, crop]}],
            "outputs": [{"name": art.output_name, "datatype": codec.DATATYPE, "shape": [-1, art.num_classes]}]}


def _platform(mv: ModelVersion) -> tuple[str, str]:
    if mv.info and mv.info.backend == "tensorrt":
        return "tensorrt_plan", "tensorrt"
    if mv.info and mv.info.backend == "openvino":
        return "openvino", "openvino"
    return "onnxruntime_onnx", "onnxruntime"


def model_config(service: Service, mv: ModelVersion) -> dict[str, Any]:
    """Triton's JSON form of config.pbtxt, from model.json and what is running: ``max_batch_size`` is the
    most images one request may carry; the engine's batch sizes are the preferred batch sizes."""
    art = mv.art
    assert art is not None
    s, info = service.settings, mv.info
    platform, backend = _platform(mv)
    gpu = bool(info and info.device == "cuda")
    policy = service.host.policy_config(mv.name)
    return {
        "name": mv.name, "platform": platform, "backend": backend, "runtime": "",
        "version_policy": policy, "max_batch_size": mv.batcher.max_queue if mv.batcher else s.max_queue,
        "input": [{"name": art.input_name, "data_type": "TYPE_FP32", "format": "FORMAT_NONE",
                   "dims": [3, art.preprocess.crop, art.preprocess.crop], "is_shape_tensor": False,
                   "allow_ragged_batch": False, "optional": False, "is_non_linear_format_io": False}],
        "output": [{"name": art.output_name, "data_type": "TYPE_FP32", "dims": [art.num_classes],
                    "label_filename": "", "is_shape_tensor": False, "is_non_linear_format_io": False}],
        "batch_input": [], "batch_output": [],
        "dynamic_batching": {"preferred_batch_size": info.batch_sizes if info else [],
                             "max_queue_delay_microseconds": int(s.max_wait_ms * 1000), "preserve_ordering": False,
                             "priority_levels": 0, "default_priority_level": 0, "priority_queue_policy": {}},
        "instance_group": [{"name": mv.name, "kind": "KIND_GPU" if gpu else "KIND_CPU",
                            "count": s.resolved_inference_threads(), "gpus": [0] if gpu else [],
                            "secondary_devices": [], "profile": [], "passive": False, "host_policy": ""}],
        "default_model_filename": "model.plan" if backend == "tensorrt" else art.onnx_file,
        "cc_model_filenames": {}, "metric_tags": {}, "parameters": {}, "model_warmup": []}


@router.get("/models/{name}", responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}", responses=_MODEL_ERRORS)
async def model_metadata(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Inputs, outputs and platform of the model."""
    service = service_of(request)
    return _metadata(service, service.model(name, version))


@router.get("/models/{name}/config", responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}/config", responses=_MODEL_ERRORS)
async def get_model_config(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Triton's model configuration extension (the JSON form of config.pbtxt)."""
    service = service_of(request)
    return model_config(service, service.model(name, version))


@router.get("/models/{name}/ready", responses={**_MODEL_ERRORS, **_READY_503})
@router.get("/models/{name}/versions/{version}/ready", responses={**_MODEL_ERRORS, **_READY_503})
async def model_ready(request: Request, name: str, version: str | None = None) -> JSONResponse:
    """Model readiness: 200 once that model (version) is loaded and warm; 503 while it loads or after a
    failed load; 404 for a model the repository does not hold."""
    service = service_of(request)
    try:
        ok = service.model(name, version).ready
    except APIError:
        if name not in service.host.catalog():
            raise
        ok = False
    return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)


@router.post("/repository/index", responses=v2_error_responses(401))
async def repository_index(request: Request) -> list[dict[str, str]]:
    """Triton's model repository extension: every model and version, its state and the reason."""
    return service_of(request).host.index()


@router.post("/repository/models/{name}/load", responses=v2_error_responses(400, 401, 404))
async def load_model(request: Request, name: str) -> dict[str, Any]:
    """Load (or reload) a model's versions from the repository (``--model-control explicit``): the new
    version is warmed before traffic moves to it; a failed load leaves the old one serving (400 + reason)."""
    await asyncio.to_thread(service_of(request).control, name, True)
    return {}


@router.post("/repository/models/{name}/unload", responses=v2_error_responses(400, 401, 404))
async def unload_model(request: Request, name: str) -> dict[str, Any]:
    """Unload every version of a model (``--model-control explicit``): requests already running finish,
    then the engines are freed; later requests for it get 404."""
    await asyncio.to_thread(service_of(request).control, name, False)
    return {}


@router.post("/models/{name}/infer", responses=_INFER_ERRORS)
@router.post("/models/{name}/versions/{version}/infer", responses=_INFER_ERRORS)
async def infer(request: Request, name: str, version: str | None = None) -> Response:
    """Run ``images`` [N,3,H,W] FP32 through the model (batched with /classify traffic)."""
    return await _infer(request, name, version)
