"""The call gate: every gRPC call of the listener (every service registered on it) passes here at call start,
before any request message is read.

- The size of the call's headers (its method and every metadata entry, each counted as HTTP/2 counts a header
  field: name + value + 32 bytes) is checked first, against ``--max-header-kb`` (RESOURCE_EXHAUSTED past it):
  gRPC core checks the same limit only once the client has acknowledged the server's SETTINGS. grpcio keeps
  each call's metadata in a reference cycle (its handler lookup's closure), freed only by Python's cyclic
  collector, which this server runs rarely (:func:`..memory.tune_gc`): every :data:`COLLECT_BYTES` of headers
  received, the gate has the young generations collected (measured: 1 MB headers were otherwise kept, 53 MB per
  connection of refused calls, without end).
- The key is checked on the call's metadata next (``authorization: Bearer <key>``); a call without it is
  answered UNAUTHENTICATED at once, its message never read nor parsed. ServerLive, ServerReady and the
  ``grpc.health.v1.Health`` service need no key (as HTTP's health routes: Kubernetes' gRPC probe sends none);
  reflection needs it where one is set; model load/unload need the admin key where one is set
  (:func:`..pipeline.control.check_admin`).
- Every admitted call runs in one of two lanes with caps of their own (:mod:`.lanes`): keyed calls at most
  ``--max-connections`` at once, calls without the key a few (probes a small reserve more), per process and per
  connection, with short deadlines and a lifetime, never taking the room of keyed calls.
- A keyed unary request's message must arrive within ``--body-timeout-s`` of the call's start, a stream's next
  message within ``--grpc-idle-timeout-s`` of the previous one (DEADLINE_EXCEEDED after: :mod:`.deadlines`). A
  keyed unary call is counted into its lane here, at call start, and its message read by grpc.aio as for any
  unary handler (the deadline kept by :mod:`.deadlines`); a stream's messages, and a keyless call's, are read by
  the gate's handler (also a unary call's where grpcio's call state is not found).
- Messages are parsed by the gate's handlers, not by gRPC: a large one (:data:`~.deadlines.OFF_LOOP_BYTES`) in a
  thread, off the event loop; one that does not parse is INVALID_ARGUMENT with one log line.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ..auth import bearer_matches
from ..config import Settings
from ..errors import APIError
from ..pipeline.control import check_admin
from .deadlines import OFF_LOOP_BYTES, Deadlines, MessageError, call_state, unparsed
from .lanes import KeylessLane, Lane, ProbeLane
from .limits import GrpcLimits
from .status import grpc_code

log = logging.getLogger("irpe.server")
SERVICE = "/inference.GRPCInferenceService/"
KEYLESS = frozenset({SERVICE + "ServerLive", SERVICE + "ServerReady"})
HEALTH = "/grpc.health.v1.Health/"  # the standard health service, keyless as HTTP /healthz
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/"  # the protocol's schema (grpcurl): keyed where a key is set
COLLECT_BYTES = 16 << 20  # headers received between two collections of the garbage they leave (module docstring)
HEADER_FIELD_BYTES = 32  # what HTTP/2 adds to each header field's name and value when it counts a header list
ADMIN = frozenset({SERVICE + "RepositoryModelLoad", SERVICE + "RepositoryModelUnload"})
Observe = Callable[[str, grpc.StatusCode, float], None]


def authorization(metadata: Any) -> str:
    """The call's ``authorization`` metadata value.

    Args:
        metadata: the call's invocation metadata, ``(name, value)`` pairs.

    Returns:
        The value, or '' when the call sends none.
    """
    return next((v for k, v in metadata or () if k == "authorization" and isinstance(v, str)), "")


def header_bytes(method: str, metadata: Any) -> int:
    """The size of a call's headers as the gate counts them (module docstring).

    Args:
        method: the call's full method name (its ``:path``).
        metadata: the call's invocation metadata, ``(name, value)`` pairs.

    Returns:
        The size in bytes.
    """
    metadata = metadata or ()
    return len(method) + sum([len(k) + len(v) for k, v in metadata]) + HEADER_FIELD_BYTES * len(metadata)


class CallGate(grpc.aio.ServerInterceptor):
    """The gate (see the module docstring); ``observe(route, code, seconds)`` counts the calls it refuses."""

    def __init__(self, settings: Settings, limits: GrpcLimits, observe: Observe):
        self.settings, self.limits, self.observe = settings, limits, observe
        self.keyed, self.keyless = Lane(limits), KeylessLane(limits)
        self.probes = dict.fromkeys((*KEYLESS, HEALTH + "Check"), ProbeLane(limits, self.keyless))  # unary probes
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}  # each method's, found at its first call
        self._bounded: dict[str, grpc.RpcMethodHandler] = {}
        self._keyless: dict[str, grpc.RpcMethodHandler] = {}
        self._read_by_grpc: dict[str, grpc.RpcMethodHandler] = {}
        self.deadlines = Deadlines()
        self._late = (f"request message not received within {self.keyed.message_timeout_s:g}s "
                      f"({self.keyed.message_flag})")
        self.headers_uncollected = 0  # bytes of headers received since the last collection they asked for
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the calls (current_task)

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[grpc.RpcMethodHandler]],
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The handler of the call: a refusal when its headers are too large or its key does not fit, else the
        bounded handler of its lane.

        Args:
            continuation: the next handler lookup.
            handler_call_details: the call's method and metadata.

        Returns:
            The handler, or None for an unknown method (gRPC answers UNIMPLEMENTED).
        """
        method, metadata = handler_call_details.method, handler_call_details.invocation_metadata
        size = self.received(method, metadata)
        handler = self._handlers.get(method)
        if handler is None:  # the first call of a method, looked up once (an unknown name is not kept)
            if (handler := await continuation(handler_call_details)) is None:
                return None
            self._handlers[method] = handler
        try:
            self.check_headers(size)
            keyless = self.check(method, metadata)
        except APIError as e:
            self.observe(method, grpc_code(e.status), 0.0)
            return refusal(handler, grpc_code(e.status), e.message)
        if keyless:
            if (form := self._keyless.get(method)) is None:
                form = self._keyless[method] = self.keyless_form(method, handler)
            return form
        if not (handler.request_streaming or handler.response_streaming):
            task = self.current_task()
            state = call_state(task)
            if state is not None:  # the call can be ended before its handler starts: grpc.aio reads the message
                return self.admitted_unary(method, handler, task, state)  # type: ignore[arg-type]
        if (form := self._bounded.get(method)) is None:
            form = self._bounded[method] = self.bounded(handler, self.keyed)
        return form

    def admitted_unary(self, method: str, handler: grpc.RpcMethodHandler, task: asyncio.Task[Any],
                       state: Any) -> grpc.RpcMethodHandler:
        """A keyed unary call whose message grpc.aio reads: counted into the keyed lane now (until ``task``, which
        serves it, is done), its message due within ``--body-timeout-s`` (:meth:`.deadlines.Deadlines.watch_start`).

        Args:
            method: the call's full method name.
            handler: the service's handler of the method.
            task: the task serving the call.
            state: the call's state (:func:`.deadlines.call_state`).

        Returns:
            The handler the call runs (a refusal when the lane is full).
        """
        refused = self.keyed.enter(None)
        if refused is not None:
            return refusal(handler, grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        task.add_done_callback(self._unary_done)
        self.deadlines.watch_start(task, self.keyed.message_timeout_s, state, self._late)
        if (form := self._read_by_grpc.get(method)) is None:
            form = self._read_by_grpc[method] = self.read_by_grpc(handler)
        return form

    def _unary_done(self, task: asyncio.Task[Any]) -> None:
        self.deadlines.ended(task)
        self.keyed.leave(None)

    def read_by_grpc(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` (unary) given its message as grpc.aio reads it, parsed here: off the loop when large, a
        message that does not parse INVALID_ARGUMENT (module docstring).

        Args:
            handler: the service's handler of the method.

        Returns:
            The handler the call runs (gRPC passes it the raw message).
        """
        behavior, parse, started = handler.unary_unary, handler.request_deserializer, self.deadlines.started

        async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            if not started(self.current_task()):
                raise asyncio.CancelledError  # too late: the sweep is ending the call DEADLINE_EXCEEDED
            try:
                request = raw if parse is None else \
                    await asyncio.to_thread(parse, raw) if len(raw) >= OFF_LOOP_BYTES else parse(raw)
            except Exception as e:  # a deserializer's error: DecodeError for protobuf
                await _end(context, unparsed(raw, e))
            return await behavior(request, context)
        return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)

    def current_task(self) -> asyncio.Task[Any] | None:
        """The running task of the calls' loop, without ``asyncio.get_running_loop`` (a getpid system call each
        time on Python 3.11); the loop is found again when it runs no task (the first call, another loop)."""
        if self._loop is None or (task := asyncio.current_task(self._loop)) is None:
            self._loop = asyncio.get_running_loop()
            task = asyncio.current_task(self._loop)
        return task

    def received(self, method: str, metadata: Any) -> int:
        """The size of a call's headers (:func:`header_bytes`), counted towards the next collection of the garbage
        they leave (grpcio keeps each call's metadata in a reference cycle: module docstring)."""
        size = header_bytes(method, metadata)
        self.headers_uncollected += size
        if self.headers_uncollected >= COLLECT_BYTES:
            self.headers_uncollected = 0
            asyncio.get_running_loop().call_soon(gc.collect, 1)
        return size

    def check_headers(self, size: int) -> None:
        """Whether the call's headers fit ``--max-header-kb``.

        Args:
            size: their size (:func:`header_bytes`).

        Raises:
            APIError: 431 (RESOURCE_EXHAUSTED) past the limit.
        """
        most = self.limits.max_metadata_bytes
        if size > most:
            raise APIError(431, "headers_too_large", f"the call's headers take {size} bytes, over the limit of "
                           f"{most} (--max-header-kb {most // 1024})")

    def check(self, method: str, metadata: Any) -> bool:
        """Whether the call's metadata may call ``method`` (module docstring: which methods need which key), and
        in which lane it runs.

        Args:
            method: the call's full method name, ``/package.Service/Method``.
            metadata: the call's invocation metadata.

        Returns:
            True for a call of the keyless lane: a keyless method without the key, or reflection where no key
            is set; False for a keyed call.

        Raises:
            APIError: 401 without the key; 401 or 403 for model control without the admin key.
        """
        key = self.settings.api_key
        if method in KEYLESS or method.startswith(HEALTH):
            return not (key and bearer_matches(authorization(metadata), key))
        if method in ADMIN:
            check_admin(self.settings, authorization(metadata))
            return False
        if not key:
            return method.startswith(REFLECTION)
        if not bearer_matches(authorization(metadata), key):
            raise APIError(401, "unauthorized", "missing or wrong API key; send the metadata "
                           "'authorization: Bearer <key>'")
        return False

    def keyless_form(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` as the keyless lane runs it (small messages, a lifetime; probes: :class:`.lanes.ProbeLane`).

        Args:
            method: the call's full method name.
            handler: the service's handler of the method.

        Returns:
            The handler the call runs, bounded (:meth:`bounded`) by its lane.
        """
        return self.bounded(self.keyless.form(handler), self.probes.get(method, self.keyless))

    def bounded(self, handler: grpc.RpcMethodHandler, lane: Lane) -> grpc.RpcMethodHandler:
        """``handler`` as a request-streaming handler that runs in ``lane`` and reads its messages itself: in
        time, parsed off the loop when large (module docstring).

        Args:
            handler: the service's handler of the method.
            lane: the lane its calls run in (their cap and message deadlines).

        Returns:
            The handler the call runs (gRPC passes it the raw messages).
        """
        parse = handler.request_deserializer
        if handler.request_streaming:
            behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary

            async def requests_of(context: Any) -> Any:
                return self.each(context, parse, lane)
        else:
            behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary

            async def requests_of(context: Any) -> Any:
                return await self.first(context, parse, lane)
            if not handler.response_streaming:  # the common case, with one coroutine less
                return self._unary(behavior, parse, handler.response_serializer, lane)
        return self._streaming(behavior, requests_of, handler, lane)

    @staticmethod
    def _streaming(behavior: Callable[..., Any], requests_of: Callable[[Any], Awaitable[Any]],
                   handler: grpc.RpcMethodHandler, lane: Lane) -> grpc.RpcMethodHandler:
        """The bounded handler of a streaming RPC: ``behavior`` given ``requests_of(context)``, in ``lane``."""
        if inspect.isasyncgenfunction(behavior):
            async def answers(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
                await _enter(lane, context)
                try:
                    async for answer in behavior(await requests_of(context), context):
                        yield answer
                except MessageError as e:
                    await _end(context, e)
                finally:
                    lane.leave(context)
            return grpc.stream_stream_rpc_method_handler(answers, None, handler.response_serializer)

        async def answer(requests: AsyncIterator[bytes], context: Any) -> Any:
            await _enter(lane, context)
            try:
                return await behavior(await requests_of(context), context)
            except MessageError as e:
                await _end(context, e)
            finally:
                lane.leave(context)
        make = grpc.stream_stream_rpc_method_handler if handler.response_streaming else \
            grpc.stream_unary_rpc_method_handler
        return make(answer, None, handler.response_serializer)

    def _unary(self, behavior: Callable[..., Awaitable[Any]], parse: Callable[[bytes], Any] | None,
               serialize: Callable[[Any], bytes] | None, lane: Lane) -> grpc.RpcMethodHandler:
        async def unary(requests: AsyncIterator[bytes], context: Any) -> Any:
            refused = lane.enter(context)
            if refused is not None:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            try:
                try:
                    request = await self.first(context, parse, lane)
                except MessageError as e:
                    await _end(context, e)
                return await behavior(request, context)
            finally:
                lane.leave(context)
        return grpc.stream_unary_rpc_method_handler(unary, None, serialize)

    async def first(self, context: grpc.aio.ServicerContext, parse: Callable[[bytes], Any] | None,
                    lane: Lane) -> Any:
        """A unary call's request, parsed.

        Args:
            context: the call.
            parse: the method's request deserializer (None: the raw bytes).
            lane: the call's lane (the message's deadline).

        Returns:
            The request.

        Raises:
            MessageError: late, not parseable, or missing.
        """
        request = await self.deadlines.read(context, parse, *lane.message_deadline(context))
        if request is grpc.aio.EOF:
            raise MessageError(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
        return request

    async def each(self, context: grpc.aio.ServicerContext, parse: Callable[[bytes], Any] | None,
                   lane: Lane) -> AsyncIterator[Any]:
        """A stream's requests, parsed, each in time.

        Args:
            context: the call.
            parse: the method's request deserializer (None: the raw bytes).
            lane: the call's lane (each message's deadline).

        Yields:
            Each request, until the client ends its side.

        Raises:
            MessageError: a request late or not parseable.
        """
        while (request := await self.deadlines.read(context, parse, lane.stream_timeout_s,
                                                  lane.stream_flag)) is not grpc.aio.EOF:
            yield request

async def _end(context: grpc.aio.ServicerContext, error: MessageError) -> None:
    await context.abort(error.code, error.message)


async def _enter(lane: Lane, context: grpc.aio.ServicerContext) -> None:
    """Count the call into ``lane``, or end it RESOURCE_EXHAUSTED (then it never entered)."""
    refused = lane.enter(context)
    if refused is not None:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)


def refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s RPC that ends the call at once, reading no message.

    Args:
        handler: the service's handler of the method (its response kind and serializer are kept).
        code: the status the call ends with.
        message: the status details.

    Returns:
        The refusing handler.
    """

    async def refuse(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, None, handler.response_serializer)
    return grpc.stream_unary_rpc_method_handler(refuse, None, handler.response_serializer)
