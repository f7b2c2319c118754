"""Start and stop the gRPC server of one front-end process, on the event loop that serves HTTP.

Messages are limited to ``--max-body-mb`` (a larger one is refused by gRPC with RESOURCE_EXHAUSTED before
it is read whole). The connection limits are gRPC core's (:mod:`.limits`); every call passes the call gate
(:mod:`.gate`: the size of its headers and its key at call start, message deadlines, parsing) whichever service
answers it, and runs in one of its lanes (:mod:`.lanes`): keyed calls at most ``--max-connections`` at once,
calls without the key in a small lane of their own. gRPC's own ``maximum_concurrent_rpcs`` is not used: it
counts every call, keyless and refused ones included, so keyless calls could take the room of keyed ones. With
``--frontends`` every front end binds the same port with ``SO_REUSEPORT`` (the kernel spreads connections).
"""

from __future__ import annotations

import grpc

from ..pipeline.peer import listening_endpoint
from ..pipeline.service import Service
from ..pipeline.sysshm import SharedMemoryRegistry
from .gate import CallGate
from .handlers import service_handler
from .health import add_standard_services, end_standard_services
from .limits import GrpcLimits
from .servicer import InferenceServicer


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc(service: Service, shm: SharedMemoryRegistry, port: int,
                     reuse_port: bool = False) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server on ``--host`` and ``port`` (0: a free one) and the port it bound; RuntimeError
    when it cannot bind. ``shm``: the process's client shared memory (the HTTP app's); ``reuse_port``: share
    the port with the other front ends."""
    s = service.settings
    limits = GrpcLimits.from_settings(s)
    servicer = InferenceServicer(service, shm)
    gate = CallGate(s, limits, servicer.observe)
    server = grpc.aio.server(options=limits.channel_options(reuse_port), interceptors=(gate,))
    add_services(server, servicer)
    bound = server.add_insecure_port(address(s.host, port))
    if not bound:
        raise RuntimeError(f"cannot listen for gRPC on {address(s.host, port)}")
    servicer.endpoint = listening_endpoint(s.host, bound)  # client shared memory's peer lookup
    await server.start()
    return server, bound


def add_services(server: grpc.aio.Server, servicer: InferenceServicer) -> None:
    """Register the services the listener answers (every one behind the call gate and the limits).

    Args:
        server: the gRPC server, not started yet.
        servicer: ``inference.GRPCInferenceService``'s RPCs.
    """
    server.add_generic_rpc_handlers((service_handler(servicer),))
    add_standard_services(server, servicer.service)  # grpc.health.v1.Health and reflection


async def stop_grpc(server: grpc.aio.Server, grace: float) -> None:
    """Refuse new RPCs, let running ones finish within ``grace`` seconds, then cancel the rest."""
    end_standard_services(server)  # open health Watch streams end now, not after the grace
    await server.stop(grace)
