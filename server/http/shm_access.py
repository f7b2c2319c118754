"""Who may use client shared memory over HTTP (Triton's system shared memory extension).

Every shared-memory route, and every ``/v2`` inference request that names a region, is refused:

- (403) unless ``--allow-client-shm``;
- (403 / 415) when a browser sends it from another site, or with a body that is not JSON (or, for inference,
  binary tensor data): the rules of model control (:func:`.control.check_same_site`). A web page can make a
  browser send a "simple" cross-site POST to a loopback server, but never one with these headers left out;
- (403) unless the connection is a loopback TCP connection whose client socket belongs to one local user
  (:func:`..pipeline.peer.loopback_uid`). The peer is the socket's own, recorded by the HTTP protocol
  (:mod:`.protocol`) before any ``X-Forwarded-For`` could rewrite the ASGI ``client``.

That uid then owns what the request registers, and sees and uses only its own regions (:mod:`..pipeline.sysshm`).
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from ..errors import APIError
from ..pipeline.peer import Endpoint, loopback_uid
from ..pipeline.sysshm import OwnedRegions, SharedMemoryRegistry
from .control import check_same_site

PEER_KEY = "irpe.peer"  # the scope's {"socket": (client, server), "uid": ...} of the connection, from the protocol
INFER_TYPES = ("application/json", "application/octet-stream")  # JSON, or the binary tensor extension


def client_memory(request: Request) -> SharedMemoryRegistry:
    """The client shared memory registry of the app serving ``request`` (the gRPC front end holds the same one).

    Args:
        request: the HTTP request.

    Returns:
        The process's registry.
    """
    return request.app.state.shm


async def client_regions(request: Request, what: str,
                         media_types: tuple[str, ...] = INFER_TYPES) -> OwnedRegions:
    """The regions of the local user on the other end of ``request``, once it passes the refusals above.

    Args:
        request: the HTTP request.
        what: what the request asks, for the error messages.
        media_types: the body content types accepted (besides none).

    Returns:
        The registry as that user's :class:`OwnedRegions`.

    Raises:
        APIError: 403 when client shared memory is off, the request is cross-site or the peer is not a local
            user; 415 for another body type.
    """
    registry = client_memory(request)
    registry.require_enabled()
    check_same_site(request, what, media_types)
    return registry.owned_by(await peer_uid(request, what))


async def peer_uid(request: Request, what: str) -> int:
    """The uid of the local user whose socket sent a request. The lookup reads the kernel's socket tables in a
    thread, once per connection: a socket's owner never changes.

    Args:
        request: the HTTP request.
        what: what the request asks, for the error message.

    Returns:
        The uid.

    Raises:
        APIError: 403 when the connection is not a loopback TCP connection of one local user.
    """
    peer = request.scope.get(PEER_KEY) or {"socket": (None, None), "uid": None}
    if "uid" not in peer:
        client, server = peer["socket"]
        peer["uid"] = await asyncio.to_thread(loopback_uid, Endpoint(*client), Endpoint(*server)) \
            if client and server else None
    uid: int | None = peer["uid"]
    if uid is None:
        raise APIError(403, "forbidden", f"{what} refused: client shared memory is for local clients, and this "
                       "connection is not a loopback TCP connection of one local user (connect to 127.0.0.1 or "
                       "[::1] from the machine that holds the segment)")
    return uid
