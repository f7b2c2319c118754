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
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from irpe.artifact import ModelArtifact

from ..errors import APIError
from ..hosting.host import ModelVersion, clip, parse_version
from ..pipeline import oip
from ..pipeline.service import Service
from ..pipeline.sysshm import OwnedRegions
from . import control, known_headers, shm_access
from . import kserve_codec as codec
from .body import read_body
from .errors import v2_error_responses
from .routes import service_of

router = APIRouter(prefix="/v2", tags=["kserve-v2"])
HEADER_LEN = "inference-header-content-length"


def _request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "") or oip.random_id()


class InferHeaders(NamedTuple):
    """The request headers an infer reads, each the first of its name as ``request.headers.get`` gives it."""

    content_length: str = ""
    content_encoding: str = ""
    header_length: str | None = None  # Inference-Header-Content-Length
    accept_encoding: str | None = None

    @classmethod
    def of(cls, request: Request) -> InferHeaders:
        """The headers of a Starlette request."""
        h = request.headers
        return cls(h.get("content-length", ""), h.get("content-encoding", ""), h.get(HEADER_LEN),
                   h.get("accept-encoding"))


class Answer(NamedTuple):
    """An infer's 200: the body, the JSON header's length when binary outputs follow it, the content encoding."""

    body: bytes
    json_len: int | None
    encoding: str | None

    def headers(self) -> dict[str, str]:
        """Its headers besides Content-Type and Content-Length."""
        headers = {"Inference-Header-Content-Length": str(self.json_len)} if self.json_len is not None else {}
        if self.encoding:
            headers["Content-Encoding"] = self.encoding
        return headers

    @property
    def media_type(self) -> str:
        return "application/json" if self.json_len is None else "application/octet-stream"


class Decoded(NamedTuple):
    """A parsed and checked inference request: the images, or where they lie in a client region."""

    req: dict[str, Any]
    spec: dict[str, Any]
    images: np.ndarray | None  # None: the input is in shared memory (input_ref)
    input_ref: oip.ShmRef | None
    output_refs: list[oip.ShmRef]
    outputs: list[codec.Output]


def _decode(raw: bytes, encoding: str, header_len: str | None, artifact: ModelArtifact, limit: int,
            max_images: int) -> Decoded:
    """Inflate, parse and validate (in the decode pool): every check before any inference. An input in a client
    shared-memory region is not read here (:func:`_shm_images`)."""
    body = codec.inflate(raw, encoding, limit)
    split = codec.header_length(header_len, len(body))
    binary = body is raw and header_len is not None  # uncompressed, the binary tensor extension
    if binary and (seen := known_headers.known(body, split, artifact)) is not None:
        return Decoded(seen.req, seen.spec, oip.check_images(seen.images(body, split), max_images), None, [],
                       seen.outputs)
    req, spec = codec.parse_request(body[:split], artifact)
    outputs = codec.requested_outputs(req, artifact)  # checked before
    ref = codec.input_region(spec)
    images = None if ref is not None else codec.input_array(spec, body, split, max_images)
    output_refs = [out.shm for out in outputs if out.shm is not None]
    if binary and images is not None and not output_refs and "binary_data_size" in (spec.get("parameters") or {}):
        known_headers.remember(body, split, known_headers.KnownHeader(
            artifact, len(body), req, spec, outputs, tuple(images.shape)))
    return Decoded(req, spec, images, ref, output_refs, outputs)


async def _shm_images(request: Request, service: Service, decoded: Decoded) -> tuple[np.ndarray, OwnedRegions]:
    """For a request that names a client shared-memory region: the refusals of :func:`.shm_access.client_regions`,
    every named region checked, and the input read in the decode pool (never on the event loop)."""
    regions = await shm_access.client_regions(request, "an inference request that names a shared memory region")
    for ref in decoded.output_refs:
        regions.check(*ref)
    images = decoded.images
    if decoded.input_ref is not None:
        images = await asyncio.get_running_loop().run_in_executor(
            service.pool, oip.shm_input, regions, decoded.input_ref, decoded.spec["name"], decoded.spec["shape"],
            oip.max_images(service))
    assert images is not None
    return images, regions


INLINE_BYTES = oip.INLINE_BYTES  # an uncompressed binary-tensor body up to this size is parsed on the event loop
INLINE_HEADER = 16 << 10  # ... when its JSON header is at most this long (JSON "data" goes to the pool)
INLINE_VALUES = 4096  # an answer of up to this many logits is rendered on the event loop


def _inline(raw: bytes, encoding: str, header_len: str | None) -> bool:
    """Whether parsing costs less than a hop to the pool: uncompressed, binary tensor data, small."""
    return (encoding.strip().lower() in ("", "identity") and len(raw) <= INLINE_BYTES and header_len is not None
            and header_len.isascii() and header_len.isdigit() and len(header_len) <= 6
            and int(header_len) <= INLINE_HEADER)


async def infer_answer(request: Request, service: Service, name: str, version: str | None) -> Answer:
    """The answer to ``POST /v2/models/{name}[/versions/{version}]/infer`` (APIError for every error answer)."""
    return await answer(service, name, version, request.receive, InferHeaders.of(request), _request_id(request),
                        lambda: request)


async def answer(service: Service, name: str, version: str | None, receive: Any, headers: InferHeaders,
                 request_id: str, request: Callable[[], Request]) -> Answer:
    """The answer to an infer request, shared by the route and the ASGI path in front of FastAPI
    (:mod:`.infer_fast`).

    Args:
        service: the process's service.
        name: the model.
        version: the version (None: the newest ready one).
        receive: the request's ASGI ``receive``.
        headers: the request headers an infer reads.
        request_id: the answer's ``id`` when the request names none.
        request: the Starlette request, made only for a request that names client shared memory.

    Returns:
        The 200 answer.

    Raises:
        APIError: every error answer (ClientDisconnect when the client leaves mid-body).
    """
    started = time.perf_counter()
    if not service.host.knows(name):
        service.model(name, version)  # 404 before 503: an unknown model is unknown while warming up too
    with service.use(name, version) as model_version:
        return await _infer_on(service, model_version, started, receive, headers, request_id, request)


async def _infer_on(service: Service, model_version: ModelVersion, started: float, receive: Any,
                    headers: InferHeaders, request_id: str, request: Callable[[], Request]) -> Answer:
    """Parse and render on the event loop when small and uncompressed (a thread hop each costs more than the
    work: the GIL changes hands twice), in the decode pool otherwise."""
    artifact = model_version.artifact
    assert artifact is not None
    limit = service.settings.max_body_bytes
    raw = await read_body(receive, limit, headers.content_length)
    loop = asyncio.get_running_loop()
    args = (raw, headers.content_encoding, headers.header_length, artifact, limit, oip.max_images(service))
    decoded = _decode(*args) if _inline(raw, headers.content_encoding, headers.header_length) else \
        await loop.run_in_executor(service.pool, _decode, *args)
    images = decoded.images
    regions = None
    if decoded.input_ref is not None or decoded.output_refs:
        images, regions = await _shm_images(request(), service, decoded)
    assert images is not None
    logits = await oip.infer(service, model_version, images, started)
    render = (decoded.req, request_id, logits, artifact, model_version.name, str(model_version.version), regions,
              decoded.outputs)
    body, json_len = codec.render(*render) if logits.size <= INLINE_VALUES else \
        await loop.run_in_executor(service.pool, codec.render, *render)
    encoding = codec.negotiate(headers.accept_encoding)
    if encoding:
        body = await loop.run_in_executor(service.pool, codec.compress, body, encoding)
    return Answer(body, json_len, encoding)


_MODEL_ERRORS = v2_error_responses(400, 401, 404, 503)
_INFER_ERRORS = v2_error_responses(400, 401, 404, 413, 415, 500, 503, 504)
_READY_503 = {503: {"description": "not ready (body says ready: false)"}}


@router.get("", responses=v2_error_responses(401))
async def server_metadata() -> dict[str, Any]:
    """Server name, version and protocol extensions."""
    return oip.server_metadata()


@router.get("/health/live")
async def live() -> dict[str, bool]:
    """Liveness."""
    return {"live": True}


@router.get("/health/ready", responses=_READY_503)
async def ready(request: Request) -> JSONResponse:
    """Readiness (503 until warmed up, while draining, or once an inference thread has died)."""
    service = service_of(request)
    service.check_workers()
    ok = service.routable
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("/models", responses=v2_error_responses(401))
async def list_models(request: Request) -> dict[str, list[str]]:
    """KServe's model list: the names of the served models."""
    return {"models": sorted({model_version.name for model_version in service_of(request).host.versions()})}


@router.get("/models/stats", responses=v2_error_responses(401))
async def all_stats(request: Request) -> dict[str, Any]:
    """Triton's statistics extension for every model (counters and nanosecond durations of the batcher); in a
    thread, as over gRPC: with ``--frontends`` the engine process is asked (up to 2 s when it is stalled)."""
    return await asyncio.to_thread(oip.statistics, service_of(request))


@router.get("/models/{name}/stats", responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}/stats", responses=_MODEL_ERRORS)
async def model_stats(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Triton's statistics extension for one model (in a thread: see :func:`all_stats`)."""
    return await asyncio.to_thread(oip.statistics, service_of(request), name, version)


@router.get("/models/{name}", responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}", responses=_MODEL_ERRORS)
async def model_metadata(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Inputs, outputs and platform of the model."""
    service = service_of(request)
    return oip.model_metadata(service, service.model(name, version))


@router.get("/models/{name}/config", responses=_MODEL_ERRORS)
@router.get("/models/{name}/versions/{version}/config", responses=_MODEL_ERRORS)
async def get_model_config(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Triton's model configuration extension (the JSON form of config.pbtxt)."""
    service = service_of(request)
    return oip.model_config(service, service.model(name, version))


@router.get("/models/{name}/ready", responses={**_MODEL_ERRORS, **_READY_503})
@router.get("/models/{name}/versions/{version}/ready", responses={**_MODEL_ERRORS, **_READY_503})
async def model_ready(request: Request, name: str, version: str | None = None) -> JSONResponse:
    """Model readiness: 200 once that model (version) is loaded and warm; 503 while it loads or after a
    failed load; 400 for a model (version) the repository does not hold, as Triton answers over HTTP."""
    service = service_of(request)
    try:
        ok = oip.model_ready(service, name, version)
    except APIError as e:
        raise APIError(400, "not_found", f"Model version not ready: {e.message}") from None
    if not ok and version and parse_version(version) not in service.host.records.get(name, {}):
        raise APIError(400, "not_found", f"Model version not ready: '{clip(name)}' has no version {clip(version)}")
    return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)


@router.post("/repository/index", responses=v2_error_responses(401))
async def repository_index(request: Request) -> list[dict[str, str]]:
    """Triton's model repository extension: every model and version, its state and the reason."""
    return oip.repository_index(service_of(request))


@router.post("/repository/models/{name}/load", responses=v2_error_responses(400, 401, 403, 404, 415, 503))
async def load_model(request: Request, name: str) -> dict[str, Any]:
    """Load (or reload) a model's versions from the repository (``--model-control explicit``): the new
    version is warmed before traffic moves to it; a failed load leaves the old one serving (400 + reason)."""
    await control.run(request, service_of(request), name, True)
    return {}


@router.post("/repository/models/{name}/unload", responses=v2_error_responses(400, 401, 403, 404, 415, 503))
async def unload_model(request: Request, name: str) -> dict[str, Any]:
    """Unload every version of a model (``--model-control explicit``): requests already running finish,
    then the engines are freed; later requests for it get 404."""
    await control.run(request, service_of(request), name, False)
    return {}


@router.post("/models/{name}/infer", responses=_INFER_ERRORS)
@router.post("/models/{name}/versions/{version}/infer", responses=_INFER_ERRORS)
async def infer(request: Request, name: str, version: str | None = None) -> Response:
    """Run ``images`` [N,3,H,W] FP32 through the model (batched with /classify traffic)."""
    answered = await infer_answer(request, service_of(request), name, version)
    return Response(answered.body, media_type=answered.media_type, headers=answered.headers())
