"""The standard gRPC services beside ``inference.GRPCInferenceService``: ``grpc.health.v1.Health`` and server
reflection (:mod:`.reflection`).

Health answers from the readiness ``/readyz`` answers from (:attr:`Service.routable
<..pipeline.service.Service.routable>` after :meth:`~..pipeline.service.Service.check_workers`), read at the time
of each call: SERVING while the default model has a READY version, NOT_SERVING while it warms up, is unloaded or
its inference cannot go on, while the server drains (``--drain-s``), and from the moment the server stops. The
service names it knows are ``""`` (the server) and ``inference.GRPCInferenceService``; Check with any other name
answers NOT_FOUND, Watch answers SERVICE_UNKNOWN, as the health protocol says.

Watch sends the status when the call starts and then only when it changes. It holds no queue: a stream wakes
on every change of what the host serves and, between changes, every :data:`WATCH_POLL_S` seconds (a dead
inference thread is found by looking, as ``/readyz`` finds it). When the server stops, every Watch sends
NOT_SERVING and ends, so an open Watch does not hold the shutdown for its grace period.

Health is keyless, as the HTTP health probes are: Kubernetes' gRPC probe and ``grpc_health_probe`` send no
metadata. A call without the key runs in the call gate's keyless lane (:mod:`.lanes`): a few at once per process
and per connection, so keyless streams cannot take the room of inference, and a Watch lasts at most
``--grpc-idle-timeout-s`` (the client watches again); a keyless Check finds a small reserve of its own when
that lane is full, so anonymous streams cannot make a probe fail. Reflection needs the key where one is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..pipeline.service import Service
from .handlers import SERVICE, GenericOnly
from .reflection import add_reflection

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name  # grpc.health.v1.Health
SERVER = ""  # the health protocol's name for the whole server
WATCH_POLL_S = 1.0  # how often an open Watch reads readiness again between changes of the host
Status = health_pb2.HealthCheckResponse.ServingStatus
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

_health_of: weakref.WeakKeyDictionary[grpc.aio.Server, HealthServicer] = weakref.WeakKeyDictionary()


class HealthServicer(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health`` over a :class:`Service`'s readiness (see the module docstring).

    Create it on the event loop that runs the gRPC server: host changes arrive on any thread and are handed
    to that loop.
    """

    def __init__(self, service: Service, poll_s: float = WATCH_POLL_S):
        self.service, self.poll_s = service, poll_s
        self.names = frozenset({SERVER, SERVICE})
        self.stopping = False
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()  # replaced on every change: set wakes every Watch waiting on it
        service.host.subscribe(self._on_host_change)

    def status(self, name: str) -> Status | None:
        """The serving status of ``name`` now; None for a name this server does not know.

        Args:
            name: the service name of a HealthCheckRequest ("" for the server).

        Returns:
            SERVING or NOT_SERVING, or None when ``name`` is unknown.
        """
        if name not in self.names:
            return None
        if self.stopping:
            return NOT_SERVING
        self.service.check_workers()
        return SERVING if self.service.routable else NOT_SERVING

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"unknown service {request.service!r}: this server reports its health as '' "
                                f"(the server) and {SERVICE!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        """Send the status of ``request.service`` now and on every change until the server stops."""
        name = request.service
        last: Status | None = None
        while True:
            changed = self._changed  # taken before the read: a change during the write below still wakes us
            status = self.status(name)
            status = SERVICE_UNKNOWN if status is None else status
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self.stopping:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), self.poll_s)

    def close(self) -> None:
        """NOT_SERVING from now on: every open Watch sends it and ends (call it on the server's loop)."""
        if self.stopping:
            return
        self.stopping = True
        with contextlib.suppress(ValueError):
            self.service.host.unsubscribe(self._on_host_change)
        self._wake()

    def _on_host_change(self, leaving: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is watching
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        woken, self._changed = self._changed, asyncio.Event()
        woken.set()


def add_standard_services(server: grpc.aio.Server, service: Service) -> None:
    """Add ``grpc.health.v1.Health`` and server reflection to a gRPC server not yet started.

    Args:
        server: the gRPC server that also serves ``inference.GRPCInferenceService``.
        service: the request pipeline whose readiness the health service reports.
    """
    health = HealthServicer(service)
    health_pb2_grpc.add_HealthServicer_to_server(health, GenericOnly(server))
    add_reflection(server, [SERVICE, HEALTH_SERVICE])
    _health_of[server] = health


def end_standard_services(server: grpc.aio.Server) -> None:
    """Report NOT_SERVING and end every open Watch of ``server`` (before it stops, so none holds the stop).

    Args:
        server: a server :func:`add_standard_services` was given (any other: nothing happens).
    """
    health = _health_of.pop(server, None)
    if health is not None:
        health.close()
