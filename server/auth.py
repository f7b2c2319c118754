"""The bearer-token check every protocol uses (HTTP API key, gRPC metadata, the model-control admin key)."""

from __future__ import annotations

import hmac


def bearer_matches(authorization: str, key: str) -> bool:
    """``authorization`` is ``Bearer <key>`` (scheme case-insensitive, surrounding spaces ignored; constant-time
    comparison of the token)."""
    scheme, _, token = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
