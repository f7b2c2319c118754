"""The gRPC status of an :class:`~..errors.APIError`, as Triton answers the same condition."""

from __future__ import annotations

import grpc

# HTTP status of the APIError -> gRPC status code
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,  # a malformed or mismatched request; a failed model load
    401: grpc.StatusCode.UNAUTHENTICATED,  # missing or wrong API key
    403: grpc.StatusCode.PERMISSION_DENIED,  # client shm while --allow-client-shm is off; control without admin key
    404: grpc.StatusCode.NOT_FOUND,  # unknown model or version
    413: grpc.StatusCode.INVALID_ARGUMENT,  # more images than max_batch_size (--max-queue), as Triton's batch check
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    431: grpc.StatusCode.RESOURCE_EXHAUSTED,  # headers over --max-header-kb
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,  # queue full, warming up, model not ready, shutting down
    504: grpc.StatusCode.DEADLINE_EXCEEDED,  # --timeout-s passed
}


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC code for an APIError's HTTP ``status`` (INTERNAL for anything unlisted)."""
    return CODES.get(status, grpc.StatusCode.INTERNAL)
