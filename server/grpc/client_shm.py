"""Client shared memory over gRPC (Triton's system shared memory RPCs): the same rules as over HTTP
(:mod:`..http.shm_access`), with the caller found from ``context.peer()``.

A call is refused (PERMISSION_DENIED) unless ``--allow-client-shm`` is on and the peer is a loopback TCP
connection whose client socket belongs to one local user (:func:`..pipeline.peer.loopback_uid`). That uid owns
what it registers, and sees, uses and unregisters only its own regions (:mod:`..pipeline.sysshm`). An inference
request reads the peer from :data:`PEER`, which ``ModelInfer`` and ``ModelStreamInfer`` set for their task (the
stream's requests run in tasks of their own, which inherit it).

The uid is looked up on every call that needs it (gRPC does not tell a handler which connection a call came
over, and a client's port may belong to another connection, of another user, once the first has closed). With
the listener on one address (``server``: :func:`..pipeline.peer.listening_endpoint`) that is one socket of a
known 4-tuple, a hash lookup in the kernel whatever the number of sockets; on a wildcard address, the sockets
of the client's port.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from ..errors import APIError
from ..pipeline.peer import Endpoint, grpc_peer, loopback_uid
from ..pipeline.sysshm import OwnedRegions, SharedMemoryRegistry

PEER: ContextVar[str] = ContextVar("irpe_grpc_peer", default="")  # context.peer() of the running call


async def client_regions(registry: SharedMemoryRegistry, peer: str, what: str,
                         server: Endpoint | None = None) -> OwnedRegions:
    """The regions of the local user on the other end of a call.

    Args:
        registry: the process's client shared memory (the HTTP front end's too).
        peer: the call's ``context.peer()``.
        what: what the call asks, for the error message.
        server: the listener's one local address (None: on a wildcard address, or unknown).

    Returns:
        The registry as that user's :class:`OwnedRegions`.

    Raises:
        APIError: 403 when client shared memory is off or the peer is not a local user.
    """
    registry.require_enabled()
    endpoint = grpc_peer(peer)
    uid = await asyncio.to_thread(loopback_uid, endpoint, server) if endpoint is not None else None
    if uid is None:
        raise APIError(403, "forbidden", f"{what} refused: client shared memory is for local clients, and the peer "
                       f"{peer[:80]!r} is not a loopback TCP connection of one local user (connect to 127.0.0.1 or "
                       "[::1] from the machine that holds the segment)")
    return registry.owned_by(uid)


async def request_regions(registry: SharedMemoryRegistry, req: pb.ModelInferRequest,
                          server: Endpoint | None = None) -> OwnedRegions | None:
    """The caller's regions for an inference request that names one (the peer from :data:`PEER`; ``server``
    as :func:`client_regions`); None for a request that names none (403 as :func:`client_regions`)."""
    if not any("shared_memory_region" in t.parameters for t in (*req.inputs, *req.outputs)):
        return None
    return await client_regions(registry, PEER.get(), "an inference request that names a shared memory region",
                                server)


async def register(registry: SharedMemoryRegistry, request: pb.SystemSharedMemoryRegisterRequest, peer: str,
                   server: Endpoint | None = None) -> None:
    """SystemSharedMemoryRegister: ``request.key``'s bytes as the caller's region ``request.name``."""
    regions = await client_regions(registry, peer, "registering shared memory", server)
    registry.register(request.name, request.key, request.offset, request.byte_size, owner=regions.owner)


async def status(registry: SharedMemoryRegistry, name: str | None, peer: str,
                 server: Endpoint | None = None) -> list[dict[str, Any]]:
    """SystemSharedMemoryStatus: the caller's regions, or the one named (NOT_FOUND when it has none of that
    name); none while client shared memory is off."""
    if not registry.enabled:
        if name is not None:
            raise APIError(404, "not_found", f"Unable to find system shared memory region: {name!r}")
        return []
    regions = await client_regions(registry, peer, "shared memory status", server)
    return registry.status(name, owner=regions.owner)


async def unregister(registry: SharedMemoryRegistry, name: str | None, peer: str,
                     server: Endpoint | None = None) -> None:
    """SystemSharedMemoryUnregister: the caller's region ``name``, or all the caller's regions (None)."""
    if registry.enabled:
        regions = await client_regions(registry, peer, "unregistering shared memory", server)
        registry.unregister(name, owner=regions.owner)
