"""The call gate: every gRPC call of the listener (every service registered on it) passes here at call start,
before any request message is read.

- The key is checked on the call's metadata first (``authorization: Bearer <key>``); a call without it is
  answered UNAUTHENTICATED at once, its message never read nor parsed. ServerLive, ServerReady and the
  ``grpc.health.v1.Health`` service need no key (as HTTP's health routes); model load/unload need the admin
  key where one is set (:func:`..pipeline.control.check_admin`).
- A unary request's message must arrive within ``--body-timeout-s`` of the call's start, a stream's next
  message within ``--grpc-idle-timeout-s`` of the previous one (DEADLINE_EXCEEDED after).
- Messages are parsed here, not by gRPC: a large one (:data:`OFF_LOOP_BYTES`) in a thread, off the event loop;
  one that does not parse is INVALID_ARGUMENT with one log line.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ..auth import bearer_matches
from ..config import Settings
from ..errors import APIError
from ..pipeline.control import check_admin
from .limits import GrpcLimits
from .status import grpc_code

log = logging.getLogger("irpe.server")
SERVICE = "/inference.GRPCInferenceService/"
KEYLESS = frozenset({SERVICE + "ServerLive", SERVICE + "ServerReady"})
KEYLESS_SERVICES = ("/grpc.health.v1.Health/",  # the standard health service, as HTTP /healthz
                    "/grpc.reflection.v1alpha.ServerReflection/")  # the protocol's schema (grpcurl)
ADMIN = frozenset({SERVICE + "RepositoryModelLoad", SERVICE + "RepositoryModelUnload"})
OFF_LOOP_BYTES = 1 << 20  # messages at least this large are parsed in a thread
SWEEP_S = 0.25  # how often late request messages are looked for (a deadline is kept to within this)
Observe = Callable[[str, grpc.StatusCode, float], None]


class MessageError(Exception):
    """A request message that did not arrive in time, or does not parse: the call ends with ``code``."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def authorization(metadata: Any) -> str:
    """The call's ``authorization`` metadata value.

    Args:
        metadata: the call's invocation metadata, ``(name, value)`` pairs.

    Returns:
        The value, or '' when the call sends none.
    """
    return next((v for k, v in metadata or () if k == "authorization" and isinstance(v, str)), "")


class CallGate(grpc.aio.ServerInterceptor):
    """The gate (see the module docstring); ``observe(route, code, seconds)`` counts the calls it refuses."""

    def __init__(self, settings: Settings, limits: GrpcLimits, observe: Observe):
        self.settings, self.limits, self.observe = settings, limits, observe
        self._bounded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        self.deadlines = Deadlines()

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[grpc.RpcMethodHandler]],
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The handler of the call: a refusal when the key does not fit, else the bounded handler.

        Args:
            continuation: the next handler lookup.
            handler_call_details: the call's method and metadata.

        Returns:
            The handler, or None for an unknown method (gRPC answers UNIMPLEMENTED).
        """
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        try:
            self.check(method, handler_call_details.invocation_metadata)
        except APIError as e:
            self.observe(method, grpc_code(e.status), 0.0)
            return refusal(handler, grpc_code(e.status), e.message)
        cached = self._bounded.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._bounded[method] = (handler, self.bounded(handler))
        return cached[1]

    def check(self, method: str, metadata: Any) -> None:
        """Whether the call's metadata may call ``method`` (module docstring: which methods need which key).

        Args:
            method: the call's full method name, ``/package.Service/Method``.
            metadata: the call's invocation metadata.

        Raises:
            APIError: 401 without the key; 401 or 403 for model control without the admin key.
        """
        if method in KEYLESS or method.startswith(KEYLESS_SERVICES):
            return
        if method in ADMIN:
            check_admin(self.settings, authorization(metadata))
            return
        key = self.settings.api_key
        if key and not bearer_matches(authorization(metadata), key):
            raise APIError(401, "unauthorized", "missing or wrong API key; send the metadata "
                           "'authorization: Bearer <key>'")

    def bounded(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` as a request-streaming handler that reads its messages itself: in time, parsed off the
        loop when large (module docstring).

        Args:
            handler: the service's handler of the method.

        Returns:
            The handler the call runs (gRPC passes it the raw messages).
        """
        parse = handler.request_deserializer
        if handler.request_streaming:
            behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary

            async def requests_of(context: Any) -> Any:
                return self.each(context, parse)
        else:
            behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary

            async def requests_of(context: Any) -> Any:
                return await self.first(context, parse)
            if not handler.response_streaming:  # the common case, with one coroutine less
                return self._unary(behavior, parse, handler.response_serializer)
        if inspect.isasyncgenfunction(behavior):
            async def answers(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
                try:
                    async for answer in behavior(await requests_of(context), context):
                        yield answer
                except MessageError as e:
                    await _end(context, e)
            return grpc.stream_stream_rpc_method_handler(answers, None, handler.response_serializer)

        async def answer(requests: AsyncIterator[bytes], context: Any) -> Any:
            try:
                return await behavior(await requests_of(context), context)
            except MessageError as e:
                await _end(context, e)
        make = grpc.stream_stream_rpc_method_handler if handler.response_streaming else \
            grpc.stream_unary_rpc_method_handler
        return make(answer, None, handler.response_serializer)

    def _unary(self, behavior: Callable[..., Awaitable[Any]], parse: Callable[[bytes], Any] | None,
               serialize: Callable[[Any], bytes] | None) -> grpc.RpcMethodHandler:
        async def unary(requests: AsyncIterator[bytes], context: Any) -> Any:
            try:
                request = await self.first(context, parse)
            except MessageError as e:
                await _end(context, e)
            return await behavior(request, context)
        return grpc.stream_unary_rpc_method_handler(unary, None, serialize)

    async def first(self, context: grpc.aio.ServicerContext, parse: Callable[[bytes], Any] | None) -> Any:
        """A unary call's request, parsed.

        Args:
            context: the call.
            parse: the method's request deserializer (None: the raw bytes).

        Returns:
            The request.

        Raises:
            MessageError: late, not parseable, or missing.
        """
        request = await self.next_message(context, parse, self.limits.message_timeout_s, "--body-timeout-s")
        if request is grpc.aio.EOF:
            raise MessageError(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
        return request

    async def each(self, context: grpc.aio.ServicerContext,
                   parse: Callable[[bytes], Any] | None) -> AsyncIterator[Any]:
        """A stream's requests, parsed, each in time.

        Args:
            context: the call.
            parse: the method's request deserializer (None: the raw bytes).

        Yields:
            Each request, until the client ends its side.

        Raises:
            MessageError: a request late or not parseable.
        """
        while (request := await self.next_message(context, parse, self.limits.idle_timeout_s,
                                                  "--grpc-idle-timeout-s")) is not grpc.aio.EOF:
            yield request

    async def next_message(self, context: grpc.aio.ServicerContext, parse: Callable[[bytes], Any] | None,
                           timeout_s: float, flag: str) -> Any:
        """The call's next message within ``timeout_s`` (``flag`` sets it), parsed with ``parse``; ``grpc.aio.EOF``
        when the client sent no more. (``context.read()`` costs less than the request iterator, and the
        :class:`Deadlines` sweep less than a timer per call.)

        Args:
            context: the call.
            parse: the method's request deserializer (None: the raw bytes).
            timeout_s: how long the message may take.
            flag: the setting of ``timeout_s``, named in the error.

        Returns:
            The request, or ``grpc.aio.EOF``.

        Raises:
            MessageError: late (DEADLINE_EXCEEDED) or not parseable (INVALID_ARGUMENT).
        """
        task = self.deadlines.watch(timeout_s)
        try:
            raw = await context.read()
        except asyncio.CancelledError:
            if not self.deadlines.expired(task):
                raise
            raise MessageError(grpc.StatusCode.DEADLINE_EXCEEDED, f"request message not received within "
                               f"{timeout_s:g}s ({flag})") from None
        finally:
            self.deadlines.forget(task)
        if parse is None or raw is grpc.aio.EOF:
            return raw
        try:
            return await asyncio.to_thread(parse, raw) if len(raw) >= OFF_LOOP_BYTES else parse(raw)
        except Exception as e:  # a deserializer's error: DecodeError for protobuf
            log.info("refusing a gRPC request message of %d bytes: %s", len(raw), e)
            raise MessageError(grpc.StatusCode.INVALID_ARGUMENT, f"request message of {len(raw)} bytes refused: "
                               f"{e or 'not a protobuf message of this RPC'}") from None


class Deadlines:
    """The calls waiting for a request message, each with its deadline. One sweep every :data:`SWEEP_S` (while
    any wait) cancels the late ones, instead of a timer per call (measured: a timer per call cost ~15 us)."""

    def __init__(self) -> None:
        self._due: dict[asyncio.Task[Any], float] = {}
        self._cancelled: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def watch(self, seconds: float) -> asyncio.Task[Any]:
        """Start the deadline of the current task's wait; returns the task."""
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        self._due[task] = loop.time() + seconds
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())
        return task

    def forget(self, task: asyncio.Task[Any]) -> None:
        """The wait of ``task`` ended."""
        self._due.pop(task, None)
        self._cancelled.discard(task)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether the sweep cancelled ``task`` (then its cancellation is taken back: the call goes on to end
        with DEADLINE_EXCEEDED)."""
        if task not in self._cancelled:
            return False
        task.uncancel()
        return True

    async def _sweep(self) -> None:
        try:
            while self._due:
                await asyncio.sleep(SWEEP_S)
                now = asyncio.get_running_loop().time()
                for task in [t for t, due in self._due.items() if due <= now and t not in self._cancelled]:
                    self._cancelled.add(task)
                    task.cancel()
        finally:
            self._sweeper = None


async def _end(context: grpc.aio.ServicerContext, error: MessageError) -> None:
    await context.abort(error.code, error.message)


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
