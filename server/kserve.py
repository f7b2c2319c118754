"""Open Inference Protocol (KServe v2 / Triton HTTP): health, model metadata and ``infer``.

``infer`` takes the FP32 tensor ``images`` [N,3,H,W] (already preprocessed) as JSON ``data`` or with the
binary tensor extension (``Inference-Header-Content-Length``), and returns ``logits``. An output asking
for ``parameters.classification: k`` gets Triton's classification extension instead: BYTES
``"score:index:label"`` strings (score = the raw logit, as Triton reports), shape [N, k].
Requests go through the same batcher as ``/classify``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

import irpe
from irpe.artifact import ModelArtifact

from .body import read_limited
from .errors import APIError, error_responses
from .state import ServerState, get_state

router = APIRouter(prefix="/v2", tags=["kserve-v2"])
HEADER_LEN = "inference-header-content-length"
_DTYPES = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64}


def _bad(message: str) -> APIError:
    return APIError(400, "invalid_input", message)


def _model(state: ServerState, name: str, version: str | None = None) -> ModelArtifact:
    if state.art is None or name != state.art.name or version not in (None, "1"):
        raise APIError(404, "model_not_found", f"no model {name!r} version {version or '1'}; see /v1/models")
    return state.art


def parse_infer(body: bytes, header_len: str | None, art: ModelArtifact) -> tuple[dict[str, Any], np.ndarray]:
    """Request JSON and the ``images`` array (JSON data or binary tensor extension)."""
    split = int(header_len) if header_len and header_len.isdigit() else len(body)
    try:
        req = json.loads(body[:split])
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise _bad(f"request header is not valid JSON ({e})") from None
    inputs = req.get("inputs") if isinstance(req, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise _bad(f"expected exactly one input {art.input_name!r}")
    spec = inputs[0]
    want = [3, art.preprocess.crop, art.preprocess.crop]
    shape = spec.get("shape")
    if spec.get("name") != art.input_name or not isinstance(spec.get("datatype"), str) \
            or spec["datatype"] not in _DTYPES:
        raise _bad(f"input must be named {art.input_name!r} with datatype FP32")
    if not (isinstance(shape, list) and len(shape) == 4 and shape[1:] == want and isinstance(shape[0], int)
            and shape[0] >= 1):
        raise _bad(f"input shape {shape} must be [N, {want[0]}, {want[1]}, {want[2]}]")
    dtype = _DTYPES[spec["datatype"]]
    try:
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            flat = np.frombuffer(body[split:split + int(size)], dtype=dtype)
        else:
            flat = np.asarray(spec.get("data"), dtype=dtype)
        with np.errstate(over="ignore"):  # FP64 beyond the FP32 range becomes inf, refused below
            images = flat.reshape(shape).astype(np.float32)
    except (ValueError, TypeError, AttributeError, RecursionError) as e:
        raise _bad(f"input data does not match shape {shape} ({e})") from None
    if not np.isfinite(images).all():
        raise _bad(f"input data has {int((~np.isfinite(images)).sum())} non-finite value(s) (NaN or +-Inf, "
                   "or beyond the FP32 range); send finite numbers")
    return req, images


def _outputs(req: dict[str, Any], logits: np.ndarray, art: ModelArtifact) -> list[dict[str, Any]]:
    wanted = req.get("outputs") or [{"name": art.output_name}]
    if not isinstance(wanted, list) or not all(isinstance(o, dict) for o in wanted):
        raise _bad(f'outputs must be a list of objects like {{"name": "{art.output_name}"}}')
    outs = []
    for o in wanted:
        if o.get("name") != art.output_name:
            raise _bad(f"unknown output {o.get('name')!r}; the model has {art.output_name!r}")
        params = o.get("parameters") or {}
        try:
            k = int(params.get("classification", 0) or 0)
        except (AttributeError, TypeError, ValueError):
            k = -1
        if k < 0:
            raise _bad(f"output parameters must be an object with classification >= 0, got {params!r}")
        if k:
            k = min(k, art.num_classes)
            order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
            data = [f"{logits[n, i]:f}:{i}:{art.labels[i]}" for n in range(len(logits)) for i in order[n]]
            outs.append({"name": o["name"], "datatype": "BYTES", "shape": [len(logits), k], "data": data,
                         "_binary": bool(params.get("binary_data"))})
        else:
            outs.append({"name": o["name"], "datatype": "FP32", "shape": list(logits.shape),
                         "data": logits, "_binary": bool(params.get("binary_data"))})
    return outs


def _encode(out: dict[str, Any]) -> bytes:
    if out["datatype"] == "BYTES":
        return b"".join(len(s.encode()).to_bytes(4, "little") + s.encode() for s in out["data"])
    return np.ascontiguousarray(out["data"], dtype=np.float32).tobytes()


def render_response(req: dict[str, Any], logits: np.ndarray, art: ModelArtifact) -> Response:
    """JSON response, or JSON header + binary tensors when any output asked for binary_data."""
    outs = _outputs(req, logits, art)
    head: dict[str, Any] = {"model_name": art.name, "model_version": "1", "outputs": []}
    if "id" in req:
        head["id"] = req["id"]
    blobs = []
    for out in outs:
        binary = out.pop("_binary")
        if binary:
            blob = _encode(out)
            blobs.append(blob)
            out["parameters"] = {"binary_data_size": len(blob)}
            del out["data"]
        elif out["datatype"] == "FP32":
            out["data"] = out["data"].reshape(-1).tolist()
        head["outputs"].append(out)
    text = json.dumps(head, allow_nan=False).encode()
    if not blobs:
        return Response(text, media_type="application/json")
    return Response(text + b"".join(blobs), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(text))})


async def _infer(request: Request, name: str, version: str | None) -> Response:
    started = time.perf_counter()
    state = get_state(request)
    art = _model(state, name, version)
    state.require_ready()
    body = await read_limited(request, state.settings.max_body_bytes)
    loop = asyncio.get_running_loop()
    req, images = await loop.run_in_executor(state.pool, parse_infer, body, request.headers.get(HEADER_LEN), art)
    if len(images) > state.settings.max_queue:
        raise APIError(413, "too_many_images", f"{len(images)} images; the limit is {state.settings.max_queue}")
    results = await state.with_deadline(state.infer(list(images)), started)
    logits = np.stack([r.logits for r in results])  # type: ignore[attr-defined]
    if not np.isfinite(logits).all():  # finite but extreme input can overflow inside the model
        raise _bad("the model output is not finite for this input (values too large?)")
    return await loop.run_in_executor(state.pool, render_response, req, logits, art)


_MODEL_ERRORS = error_responses(401, 404)
_INFER_ERRORS = error_responses(400, 401, 404, 413, 500, 503, 504)
_READY_503 = {503: {"description": "not ready (body says ready: false)"}}


@router.get("", responses=error_responses(401))
async def server_metadata() -> dict[str, Any]:
    """Server name, version and protocol extensions."""
    return {"name": "irpe-deploy", "version": irpe.__version__,
            "extensions": ["classification", "binary_tensor_data"]}


@router.get("/health/live")
async def live() -> dict[str, bool]:
    """Liveness."""
    return {"live": True}


@router.get("/health/ready", responses=_READY_503)
async def ready(request: Request) -> JSONResponse:
    """Readiness (503 until warmed up)."""
    ok = get_state(request).ready
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


def _metadata(state: ServerState, art: ModelArtifact) -> dict[str, Any]:
    crop = art.preprocess.crop
    info = state.engine.info if state.engine else None
    backend, precision = (info.backend, info.precision) if info else ("", None)
    platform = {"tensorrt": "tensorrt_plan", "openvino": "openvino"}.get(backend, "onnxruntime_onnx")
    return {"name": art.name, "versions": ["1"], "platform": platform,
            "parameters": {"backend": backend or None, "precision": precision},
            "inputs": [{"name": art.input_name, "datatype": "FP32", "shape": [-1, 3, crop, crop]}],
            "outputs": [{"name": art.output_name, "datatype": "FP32", "shape": [-1, art.num_classes]}]}


@router.get("/models/{name}", responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}", responses=_MODEL_ERRORS)
async def model_metadata(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Inputs, outputs and platform of the model."""
    state = get_state(request)
    return _metadata(state, _model(state, name, version))


@router.get("/models/{name}/ready", responses={**_MODEL_ERRORS, **_READY_503})
@router.get("/models/{name}/versions/{version}/ready", responses={**_MODEL_ERRORS, **_READY_503})
async def model_ready(request: Request, name: str, version: str | None = None) -> JSONResponse:
    """Model readiness (503 until warmed up)."""
    state = get_state(request)
    _model(state, name, version)
    return JSONResponse({"name": name, "ready": state.ready}, status_code=200 if state.ready else 503)


@router.post("/models/{name}/infer", responses=_INFER_ERRORS)
@router.post("/models/{name}/versions/{version}/infer", responses=_INFER_ERRORS)
async def infer(request: Request, name: str, version: str | None = None) -> Response:
    """Run ``images`` [N,3,H,W] FP32 through the model (batched with /classify traffic)."""
    return await _infer(request, name, version)
