"""Triton's HTTP extensions beyond inference: system (and CUDA) shared memory, trace and logging settings.

Shared memory goes through the process's :class:`~..pipeline.sysshm.SharedMemoryRegistry` (off unless
``--allow-client-shm``), for local clients only, each seeing its own regions (:mod:`.shm_access`). CUDA shared
memory has no registry here (status: none; registering: 400). Trace
settings report Triton's ``OFF``: this server traces through its access log and W3C ``traceparent``
(:mod:`.tracing`), so a request to turn Triton's trace files on is refused. Logging settings map onto the
log level of this process.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from ..errors import APIError
from . import kserve_codec as codec
from . import shm_access
from .body import read_limited
from .control import check_admin_call
from .errors import v2_error_responses
from .routes import service_of

router = APIRouter(prefix="/v2", tags=["kserve-v2"])
_ERRORS = v2_error_responses(400, 401, 404)
MAX_SETTINGS_BYTES = 64 * 1024
TRACE = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0", "trace_file": "",
         "trace_mode": "triton"}


async def _json(request: Request) -> dict[str, Any]:
    raw = await read_limited(request, MAX_SETTINGS_BYTES)
    body = codec.loads(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise codec.ProtocolError("the request body must be a JSON object")
    return body


@router.get("/systemsharedmemory/status", responses=v2_error_responses(401, 403, 404))
@router.get("/systemsharedmemory/region/{name}/status", responses=v2_error_responses(401, 403, 404))
async def shm_status(request: Request, name: str | None = None) -> list[dict[str, Any]]:
    """The caller's registered regions (name, key, offset, byte_size); 404 for a region it has not registered.
    With client shared memory off: none (``[]``)."""
    registry = shm_access.client_memory(request)
    if not registry.enabled:
        if name is not None:
            raise APIError(404, "not_found", f"Unable to find system shared memory region: {name!r}")
        return []
    regions = await shm_access.client_regions(request, "shared memory status", ("application/json",))
    return registry.status(name, owner=regions.owner)


@router.post("/systemsharedmemory/region/{name}/register", responses=v2_error_responses(400, 401, 403, 415))
async def shm_register(request: Request, name: str) -> dict[str, Any]:
    """Register ``{"key", "offset", "byte_size"}`` of ``/dev/shm`` as the caller's region ``name``
    (``--allow-client-shm``; a segment the calling local user owns: :mod:`.shm_access`)."""
    regions = await shm_access.client_regions(request, "registering shared memory", ("application/json",))
    body = await _json(request)
    regions.registry.register(name, body.get("key"), body.get("offset", 0), body.get("byte_size"),  # type: ignore[arg-type]
                              owner=regions.owner)
    return {}


@router.post("/systemsharedmemory/unregister", responses=v2_error_responses(401, 403, 415))
@router.post("/systemsharedmemory/region/{name}/unregister", responses=v2_error_responses(401, 403, 415))
async def shm_unregister(request: Request, name: str | None = None) -> dict[str, Any]:
    """Unregister one of the caller's regions (an unknown name is no error, as in Triton) or all of the caller's
    regions (other clients' stay)."""
    registry = shm_access.client_memory(request)
    if registry.enabled:
        regions = await shm_access.client_regions(request, "unregistering shared memory", ("application/json",))
        registry.unregister(name, owner=regions.owner)
    return {}


@router.get("/cudasharedmemory/status", responses=_ERRORS)
@router.get("/cudasharedmemory/region/{name}/status", responses=_ERRORS)
async def cuda_shm_status(name: str | None = None) -> list[dict[str, Any]]:
    """No CUDA shared memory regions: ``[]`` (404 for a named one)."""
    if name is not None:
        raise APIError(404, "not_found", f"Unable to find cuda shared memory region: '{name}'")
    return []


@router.post("/cudasharedmemory/region/{name}/register", responses=_ERRORS)
async def cuda_shm_register(name: str) -> dict[str, Any]:
    """Refused: this server takes client tensors in system shared memory only."""
    raise APIError(400, "unsupported", f"cannot register CUDA shared memory region '{name}': this server does "
                   "not support CUDA shared memory; use system shared memory (--allow-client-shm)")


@router.post("/cudasharedmemory/unregister", responses=v2_error_responses(401))
@router.post("/cudasharedmemory/region/{name}/unregister", responses=v2_error_responses(401))
async def cuda_shm_unregister(name: str | None = None) -> dict[str, Any]:
    """Nothing registered, nothing to do."""
    return {}


@router.get("/trace/setting", responses=_ERRORS)
@router.get("/models/{model}/trace/setting", responses=_ERRORS)
async def trace_get(request: Request, model: str | None = None) -> dict[str, Any]:
    """Triton's trace settings: OFF (tracing here is the access log and ``traceparent``)."""
    if model is not None:
        service_of(request).model(model)
    return dict(TRACE)


@router.post("/trace/setting", responses=_ERRORS)
@router.post("/models/{model}/trace/setting", responses=_ERRORS)
async def trace_set(request: Request, model: str | None = None) -> dict[str, Any]:
    """Accepts only settings that keep Triton's trace files off; anything else is a 400 naming why."""
    if model is not None:
        service_of(request).model(model)
    body = await _json(request)
    level = body.get("trace_level")
    if level not in (None, ["OFF"], []):
        raise APIError(400, "unsupported", f"trace_level {level!r}: this server writes no Triton trace files; it "
                       "traces every request in the access log, with the W3C traceparent header")
    return dict(TRACE)


def _logging_state() -> dict[str, Any]:
    level = logging.getLogger().getEffectiveLevel()
    return {"log_file": "", "log_info": level <= logging.INFO, "log_warning": level <= logging.WARNING,
            "log_error": level <= logging.ERROR, "log_verbose_level": 1 if level <= logging.DEBUG else 0,
            "log_format": "default"}


@router.get("/logging", responses=v2_error_responses(401))
async def logging_get() -> dict[str, Any]:
    """Triton's logging settings, from this process's log level."""
    return _logging_state()


@router.post("/logging", responses=v2_error_responses(400, 401, 403, 415))
async def logging_set(request: Request) -> dict[str, Any]:
    """Change the log level (``log_verbose_level`` > 0: debug; else the lowest of info, warning, error on).
    An administrative call: the admin key where one is set, else loopback only (:mod:`.control`)."""
    check_admin_call(request, service_of(request), "changing the log settings")
    state = {**_logging_state(), **await _json(request)}
    if state["log_file"] != "" or state["log_format"] != "default":
        raise APIError(400, "unsupported", "log_file and log_format cannot be changed here (logs go to stderr)")
    flags = [state[k] for k in ("log_info", "log_warning", "log_error")]
    if not all(isinstance(f, bool) for f in flags) or type(state["log_verbose_level"]) is not int:
        raise APIError(400, "invalid_input", "log_info/log_warning/log_error must be true or false and "
                       "log_verbose_level an integer")
    levels = [lv for lv, on in zip((logging.INFO, logging.WARNING, logging.ERROR), flags, strict=True) if on]
    level = logging.DEBUG if state["log_verbose_level"] > 0 else min(levels, default=logging.CRITICAL)
    logging.getLogger().setLevel(level)
    return _logging_state()
