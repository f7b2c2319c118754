"""The two lanes of the call gate (:mod:`.gate`): every admitted call runs in one, and each lane has caps of its
own, so calls without the key can never take the room of calls with it.

- **Keyed** calls (the key fits, or the server has none and the method is not a keyless one): at most
  ``--max-connections`` at once in the process (RESOURCE_EXHAUSTED past it); a unary call's message within
  ``--body-timeout-s``, a stream's next message within ``--grpc-idle-timeout-s``.
- **Keyless** calls (``grpc.health.v1.Health``, ``ServerLive``, ``ServerReady`` without the key; reflection on a
  server without a key): at most :data:`~.limits.KEYLESS_CALLS` at once in the process and
  :data:`~.limits.KEYLESS_PER_CONNECTION` on one connection (RESOURCE_EXHAUSTED past either); every message,
  a stream's next one included, within ``--header-timeout-s`` (at most ``--body-timeout-s``) and of at most
  :data:`~.limits.KEYLESS_MESSAGE_BYTES`; the whole call within ``--grpc-idle-timeout-s`` (then
  DEADLINE_EXCEEDED: a health Watch or a reflection stream is called again).
- **Probes** without the key (the unary health ``Check``, ``ServerLive``, ``ServerReady``: what Kubernetes' gRPC
  probe and ``grpc_health_probe`` call) run in the keyless lane while it has room, and in a reserve of their own
  once the keyless lane is full (:class:`ProbeLane`): at most :data:`~.limits.PROBE_RESERVE` at once in the
  process and :data:`~.limits.PROBE_PER_CONNECTION` on one connection, each message within
  :data:`~.limits.PROBE_MESSAGE_S` (a probe sends it with its headers). Keyless streams (a ``Watch``, reflection)
  and slow or silent calls filling the keyless lane thus leave an orchestrator's probe its answer; calls that
  stall in the reserve hold it at most that second, and the reserve is as anonymous as the lane (a client that
  keeps it full with probes of its own can fill it too).

A call's connection is told by its peer address (``ipv4:127.0.0.1:54321``: one per TCP connection).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from .limits import (
    KEYLESS_CALLS,
    KEYLESS_MESSAGE_BYTES,
    KEYLESS_PER_CONNECTION,
    PROBE_MESSAGE_S,
    PROBE_PER_CONNECTION,
    PROBE_RESERVE,
    GrpcLimits,
)

Behavior = Callable[..., Any]


class Lane:
    """The keyed lane: a count of the calls running in it, and the deadlines of their messages."""

    def __init__(self, limits: GrpcLimits):
        self.message_timeout_s, self.message_flag = limits.message_timeout_s, "--body-timeout-s"
        self.stream_timeout_s, self.stream_flag = limits.idle_timeout_s, "--grpc-idle-timeout-s"
        self.most = limits.max_connections
        self.running = 0
        self.full = (f"{self.most} calls are running, the most this server runs at once (--max-connections); "
                     "retry later")

    def enter(self, context: grpc.aio.ServicerContext) -> str | None:
        """Count the call in, or say why it has no room.

        Args:
            context: the call.

        Returns:
            None when the call runs (then :meth:`leave` must follow), else the reason it may not.
        """
        if self.running >= self.most:
            return self.full
        self.running += 1
        return None

    def leave(self, context: grpc.aio.ServicerContext) -> None:
        """The call :meth:`enter` let in has ended."""
        self.running -= 1

    def message_deadline(self, context: grpc.aio.ServicerContext) -> tuple[float, str]:
        """The seconds the call's (unary) message may take, and the flag that sets them."""
        return self.message_timeout_s, self.message_flag


class KeylessLane(Lane):
    """The keyless lane (module docstring): caps per process and per connection, short message deadlines, small
    messages, a lifetime."""

    def __init__(self, limits: GrpcLimits):
        super().__init__(limits)
        self.message_timeout_s = self.stream_timeout_s = limits.keyless_message_timeout_s
        self.message_flag = self.stream_flag = "--header-timeout-s, for a call without the key"
        self.lifetime_s = limits.idle_timeout_s
        self.most = KEYLESS_CALLS
        self.per_connection: dict[str, int] = {}
        self.full = (f"{KEYLESS_CALLS} calls without the key are running, the most this server runs at once; retry "
                     "later, or send the key (authorization: Bearer <key>)")

    def enter(self, context: grpc.aio.ServicerContext) -> str | None:
        """Count the call in (on its connection too), or say why it has no room (see :meth:`Lane.enter`)."""
        peer = context.peer()
        held = self.per_connection.get(peer, 0)
        if held >= KEYLESS_PER_CONNECTION:
            return (f"{held} calls without the key are running on this connection, the most one connection may "
                    "hold; end one, or send the key (authorization: Bearer <key>)")
        refused = super().enter(context)
        if refused is None:
            self.per_connection[peer] = held + 1
        return refused

    def leave(self, context: grpc.aio.ServicerContext) -> None:
        """The call :meth:`enter` let in has ended."""
        super().leave(context)
        left_connection(self.per_connection, context.peer())

    def crowded(self) -> bool:
        """Whether the process-wide cap is reached (not just a connection's)."""
        return self.running >= self.most

    def form(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` with small messages only (:meth:`parse`), within the lane's lifetime (:meth:`timed`)."""
        behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
        return rebuilt(handler, self.timed(behavior), self.parse(handler.request_deserializer))

    def parse(self, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        """``parse`` refusing, unparsed, a message over :data:`~.limits.KEYLESS_MESSAGE_BYTES`."""
        def small(raw: bytes) -> Any:
            if len(raw) > KEYLESS_MESSAGE_BYTES:
                raise DecodeError(f"a call without the key sends at most {KEYLESS_MESSAGE_BYTES} bytes")
            return raw if parse is None else parse(raw)
        return small

    def timed(self, behavior: Behavior) -> Behavior:
        """``behavior`` ended with DEADLINE_EXCEEDED once the call has run :attr:`lifetime_s` (an async generator
        becomes a coroutine that writes its answers, so the deadline covers the writes too)."""
        lifetime, message = self.lifetime_s, (f"a call without the key lasts at most {self.lifetime_s:g}s "
                                              "(--grpc-idle-timeout-s); call again")
        if inspect.isasyncgenfunction(behavior):
            async def run(request: Any, context: grpc.aio.ServicerContext) -> None:
                answers: AsyncIterator[Any] = behavior(request, context)
                async for answer in answers:
                    await context.write(answer)
        else:
            run = behavior

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async with asyncio.timeout(lifetime):
                    return await run(request, context)
            except TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, message)
        return timed


class ProbeLane(Lane):
    """Unary probes without the key (module docstring): the keyless lane while it has room, else the reserve."""

    def __init__(self, limits: GrpcLimits, keyless: KeylessLane):
        super().__init__(limits)
        self.keyless = keyless
        self.message_timeout_s, self.message_flag = keyless.message_timeout_s, keyless.message_flag
        self.stream_timeout_s, self.stream_flag = keyless.stream_timeout_s, keyless.stream_flag
        self.reserve_timeout_s = min(PROBE_MESSAGE_S, keyless.message_timeout_s)
        self.most = PROBE_RESERVE
        self.per_connection: dict[str, int] = {}
        self._reserved: set[int] = set()  # the calls (id of their context) running in the reserve
        self.full = (f"{KEYLESS_CALLS} calls without the key and {PROBE_RESERVE} probes beyond them are running, "
                     "the most this server runs at once; retry later, or send the key (authorization: Bearer <key>)")

    def enter(self, context: grpc.aio.ServicerContext) -> str | None:
        """Count the call into the keyless lane, or into the reserve when that lane is full in the process (a
        connection that holds its share of the keyless lane gets no reserve); see :meth:`Lane.enter`."""
        refused = self.keyless.enter(context)
        peer = context.peer()
        if refused is None or not self.keyless.crowded() or \
                self.keyless.per_connection.get(peer, 0) >= KEYLESS_PER_CONNECTION:
            return refused
        held = self.per_connection.get(peer, 0)
        if held >= PROBE_PER_CONNECTION or self.running >= self.most:
            return self.full
        self.running += 1
        self.per_connection[peer] = held + 1
        self._reserved.add(id(context))
        return None

    def leave(self, context: grpc.aio.ServicerContext) -> None:
        """The call :meth:`enter` let in has ended (in the lane it entered)."""
        if id(context) not in self._reserved:
            self.keyless.leave(context)
            return
        self._reserved.discard(id(context))
        self.running -= 1
        left_connection(self.per_connection, context.peer())

    def message_deadline(self, context: grpc.aio.ServicerContext) -> tuple[float, str]:
        """A call in the reserve waits :data:`~.limits.PROBE_MESSAGE_S` at most for its message."""
        if id(context) in self._reserved:
            return self.reserve_timeout_s, "a probe without the key beyond a full keyless lane"
        return self.message_timeout_s, self.message_flag


def left_connection(per_connection: dict[str, int], peer: str) -> None:
    """One call of ``peer``'s connection has ended: its count in ``per_connection`` less one (gone at zero)."""
    held = per_connection.pop(peer, 1) - 1
    if held > 0:
        per_connection[peer] = held


def rebuilt(handler: grpc.RpcMethodHandler, behavior: Callable[..., Awaitable[Any]],
            parse: Callable[[bytes], Any] | None) -> grpc.RpcMethodHandler:
    """``handler`` with another behavior and request parser (its streaming kinds and serializer kept).

    Args:
        handler: the service's handler.
        behavior: the new behavior, of ``handler``'s kind (an async generator stays one only if it was).
        parse: the new request deserializer.

    Returns:
        The handler.
    """
    makers = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
              (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    make = makers[(handler.request_streaming, handler.response_streaming)]
    return make(behavior, request_deserializer=parse, response_serializer=handler.response_serializer)
