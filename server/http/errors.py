"""HTTP rendering of errors: every error leaves the server as JSON ``{"error": {"code", "message"}}`` with a
fitting status; under ``/v2`` (the Open Inference Protocol) as ``{"error": "message"}``, the shape Triton's and
KServe's clients read."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import APIError

log = logging.getLogger("irpe.server")

_STATUS_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 413: "payload_too_large", 415: "unsupported_media_type",
                 422: "validation_error", 429: "too_many_requests", 500: "internal_error",
                 503: "unavailable", 504: "timeout"}

_DESCRIPTIONS = {400: "Bad request: empty, truncated or corrupt image, bad multipart, bad or non-finite tensor",
                 401: "Missing or wrong API key (only when IRPE_API_KEY is set)",
                 403: "Model control refused (another site, or no admin key); client shared memory off "
                      "(--allow-client-shm)",
                 404: "No such model (or route)",
                 413: "Body over --max-body-mb, image over --max-pixels, or too many files/images",
                 415: "Not an image, or an unsupported content type",
                 422: "Invalid parameter (e.g. top_k)",
                 500: "Unexpected server or inference error (logged)",
                 503: "Not ready, queue full or shutting down (see Retry-After)",
                 504: "Request deadline (--timeout-s) passed"}


class ErrorDetail(BaseModel):
    """What went wrong: a stable machine code and a human message."""

    model_config = ConfigDict(extra="forbid")
    code: str = Field(min_length=1, description="stable machine code, e.g. invalid_input")
    message: str = Field(min_length=1, description="human-readable explanation")


class ErrorResponse(BaseModel):
    """The body of every error answer."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring :class:`ErrorResponse` for ``statuses``."""
    return {status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]} for status in statuses}


class V2ErrorResponse(BaseModel):
    """The body of every error answer under /v2 (Open Inference Protocol)."""

    model_config = ConfigDict(extra="forbid")
    error: str = Field(min_length=1, description="human-readable explanation")


def v2_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring :class:`V2ErrorResponse` for ``statuses``."""
    return {status: {"model": V2ErrorResponse, "description": _DESCRIPTIONS[status]} for status in statuses}


def is_v2(path: str) -> bool:
    """Whether ``path`` is an Open Inference Protocol route (its errors are ``{"error": "message"}``)."""
    return path == "/v2" or path.startswith("/v2/")


def drop_default_validation_error(schema: dict[str, Any]) -> dict[str, Any]:
    """Remove FastAPI's default 422 (``HTTPValidationError``, never sent here) from an OpenAPI schema."""
    default = "#/components/schemas/HTTPValidationError"
    for operations in schema.get("paths", {}).values():
        for op in operations.values():
            resp = op.get("responses", {}).get("422", {})
            if resp.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref") == default:
                del op["responses"]["422"]
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    return schema


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON error shape."""
    return {"error": {"code": code, "message": message}}


def error_body_for(path: str, code: str, message: str) -> dict[str, Any]:
    """The error shape of the route at ``path``: ``{"error": message}`` under /v2, else ``error_body``."""
    return {"error": message} if is_v2(path) else error_body(code, message)


def error_response(status: int, code: str, message: str,
                   headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
    """A JSONResponse carrying the error shape (of the route at ``path``)."""
    return JSONResponse(error_body_for(path, code, message), status_code=status, headers=headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc.status, exc.code, exc.message, exc.headers, request.url.path)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = "no such route; see /docs for the API"
    return error_response(exc.status_code, code, message, dict(exc.headers or {}), request.url.path)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return error_response(422, "validation_error", "; ".join(parts) or "invalid request", path=request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    """Route APIError, HTTP errors (404, 405, ...) and validation errors to the JSON shape."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
