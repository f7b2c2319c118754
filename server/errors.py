"""The one error type of the request path: what is answered to the client, whatever the protocol.

Raised anywhere below the front ends (pipeline, hosting, decoding); each front end renders it in its
protocol's shape (:mod:`.http.errors` for HTTP, the engine link's error frames in :mod:`.ipc.wire`).
"""

from __future__ import annotations


class APIError(Exception):
    """An error answered to the client: HTTP status, a stable machine code and a human message."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def not_ready(message: str) -> APIError:
    """The 503 a request gets while what it needs is not serving (clients retry after a second).

    Args:
        message: what is not ready, for the client.

    Returns:
        The error to raise.
    """
    return APIError(503, "not_ready", message, {"Retry-After": "1"})


def timed_out(timeout_s: float) -> APIError:
    """The 504 of a request not answered within --timeout-s.

    Args:
        timeout_s: the request deadline, in seconds.

    Returns:
        The error to raise.
    """
    return APIError(504, "timeout", f"request not answered within {timeout_s:g}s (--timeout-s)")
