"""Start and stop the gRPC server of one front-end process, on the event loop that serves HTTP.

Messages are limited to ``--max-body-mb`` (a larger one is refused by gRPC with RESOURCE_EXHAUSTED before
it is read whole), and concurrent RPCs to ``--max-connections`` (more: RESOURCE_EXHAUSTED). With
``--frontends`` every front end binds the same port with ``SO_REUSEPORT`` (the kernel spreads connections).
"""

from __future__ import annotations

import grpc

from ..pipeline.service import Service
from .handlers import service_handler
from .servicer import InferenceServicer


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc(service: Service, port: int, reuse_port: bool = False) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server on ``--host`` and ``port`` (0: a free one) and the port it bound; RuntimeError
    when it cannot bind. ``reuse_port``: share the port with the other front ends."""
    s = service.settings
    options = [("grpc.max_receive_message_length", s.max_body_bytes),
               ("grpc.max_send_message_length", s.max_body_bytes),
               ("grpc.so_reuseport", 1 if reuse_port else 0)]
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=s.max_connections)
    server.add_generic_rpc_handlers((service_handler(InferenceServicer(service)),))
    bound = server.add_insecure_port(address(s.host, port))
    if not bound:
        raise RuntimeError(f"cannot listen for gRPC on {address(s.host, port)}")
    await server.start()
    return server, bound


async def stop_grpc(server: grpc.aio.Server, grace: float) -> None:
    """Refuse new RPCs, let running ones finish within ``grace`` seconds, then cancel the rest."""
    await server.stop(grace)
