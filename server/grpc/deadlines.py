"""The request messages' deadlines of the call gate (:mod:`.gate`): a unary call's message within
``--body-timeout-s`` of the call's start, a stream's next message within ``--grpc-idle-timeout-s`` (the keyless
lane's shorter, :mod:`.lanes`), DEADLINE_EXCEEDED naming the flag past it; and the parse of a message (in a thread
from :data:`OFF_LOOP_BYTES`; one that does not parse is INVALID_ARGUMENT with one log line).

One sweep every :data:`SWEEP_S`, while any message is awaited, ends the late ones (a timer per call cost ~15 us).
A message is awaited in one of two ways:

- by a handler of the gate (streams, the keyless lane): ``context.read()`` under :meth:`Deadlines.read`; the
  sweep cancels that read, and the handler ends the call;
- by grpc.aio itself, for a keyed unary call: grpc.aio reads a unary call's message after the interceptors and
  before the handler, so until it is there no code of this server runs for the call, and grpcio offers no handle
  to end it. The task serving the call is ``asyncio.current_task()`` in the interceptor, and its coroutine
  (grpcio's ``_handle_exceptions``) holds the call's state (``cygrpc.RPCState``), reached through the coroutine's
  closure (:func:`call_state`: ``gc.get_referents``, the objects one object refers to, not a walk of the heap).
  The sweep sends that call's status with the function ``context.abort`` sends it with (:func:`end_call`);
  grpc.aio's pending read then ends empty, and its task ends without running the handler (``context.abort``
  itself would leave the call marked aborted, which grpc.aio logs as an error when the task ends without
  raising). These are grpcio internals: where they are not found (another grpcio), :func:`call_state` answers
  None and the gate reads the message itself, as for a stream (``tests/server/grpc/test_deadlines.py`` says which
  of the two the installed grpcio takes). Measured: 8% less server CPU per ModelInfer call than the gate's read.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger("irpe.server")
SWEEP_S = 0.25  # how often late request messages are looked for (a deadline is kept to within this)
OFF_LOOP_BYTES = 1 << 20  # messages at least this large are parsed in a thread

try:
    from grpc._cython import cygrpc

    _STATE: type | None = cygrpc.RPCState
    _SEND_STATUS: Any = cygrpc._send_error_status_from_server
    _HEADERS: Any = cygrpc.SendInitialMetadataOperation
except (ImportError, AttributeError):  # another grpcio: the gate's own read of the message
    _STATE = _SEND_STATUS = _HEADERS = None


class MessageError(Exception):
    """A request message that did not arrive in time, or does not parse: the call ends with ``code``."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def call_state(task: asyncio.Task[Any] | None) -> Any | None:
    """The state of the call ``task`` serves (the task running a grpc.aio interceptor).

    Args:
        task: the current task.

    Returns:
        grpcio's ``RPCState`` of the call, or None where it is not found (no task, another grpcio).
    """
    if _SEND_STATUS is None or task is None:
        return None
    for scope in gc.get_referents(task.get_coro()):
        for held in gc.get_referents(scope):
            if type(held) is _STATE:
                return held
    return None


async def end_call(state: Any, code: grpc.StatusCode, message: str) -> None:
    """End the call of ``state``, whose handler has not started, with ``code`` and ``message`` (headers and
    status in one batch, as ``context.abort`` sends them before any answer).

    Args:
        state: the call's state (:func:`call_state`).
        code: the status.
        message: its details.
    """
    try:
        await _SEND_STATUS(state, code.value[0], message, (), _HEADERS((), 0), asyncio.get_running_loop())
    except Exception as e:  # the call went away meanwhile (the client left, the server stops)
        log.debug("ending a gRPC call with %s failed: %s", code.name, e)


class Deadlines:
    """The calls waiting for a request message, each with its deadline, and their sweep (module docstring)."""

    def __init__(self) -> None:
        self._due: dict[asyncio.Task[Any], float] = {}
        self._cancelled: set[asyncio.Task[Any]] = set()
        self._starts: dict[asyncio.Task[Any], tuple[float, Any, str]] = {}
        self._ending: set[asyncio.Task[None]] = set()  # calls the sweep is ending
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

    def watch_start(self, task: asyncio.Task[Any], seconds: float, state: Any, message: str) -> None:
        """Start the deadline of a unary call whose handler has not started: the call of ``state``
        (:func:`call_state`) ends DEADLINE_EXCEEDED with ``message`` unless :meth:`started` comes
        within ``seconds``; ``task`` serves it (:meth:`ended` once it is done)."""
        loop = task.get_loop()
        self._starts[task] = (loop.time() + seconds, state, message)
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())

    def started(self, task: asyncio.Task[Any] | None) -> bool:
        """The handler of ``task``'s call starts: False when the sweep has ended the call already."""
        return self._starts.pop(task, None) is not None  # type: ignore[arg-type]

    def ended(self, task: asyncio.Task[Any]) -> None:
        """``task`` is done (its call may have ended before its handler started: the client left)."""
        self._starts.pop(task, None)

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
            while self._due or self._starts:
                await asyncio.sleep(SWEEP_S)
                loop = asyncio.get_running_loop()
                now = loop.time()
                for task in [t for t, due in self._due.items() if due <= now and t not in self._cancelled]:
                    self._cancelled.add(task)
                    task.cancel()
                for task in [t for t, (due, _, _) in self._starts.items() if due <= now]:
                    _, state, message = self._starts.pop(task)
                    if task.done():  # its call ended meanwhile (the client left, the server stops)
                        continue
                    ending = loop.create_task(end_call(state, grpc.StatusCode.DEADLINE_EXCEEDED, message))
                    self._ending.add(ending)
                    ending.add_done_callback(self._ending.discard)
        finally:
            self._sweeper = None

    async def read(self, context: grpc.aio.ServicerContext, parse: Callable[[bytes], Any] | None,
                           timeout_s: float, flag: str) -> Any:
        """The call's next message within ``timeout_s`` (``flag`` sets it), parsed with ``parse``; ``grpc.aio.EOF``
        when the client sent no more. (``context.read()`` costs less than the request iterator, and the
        sweep less than a timer per call.)

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
        task = self.watch(timeout_s)
        try:
            raw = await context.read()
        except asyncio.CancelledError:
            if not self.expired(task):
                raise
            raise MessageError(grpc.StatusCode.DEADLINE_EXCEEDED, f"request message not received within "
                               f"{timeout_s:g}s ({flag})") from None
        finally:
            self.forget(task)
        if parse is None or raw is grpc.aio.EOF:
            return raw
        try:
            return await asyncio.to_thread(parse, raw) if len(raw) >= OFF_LOOP_BYTES else parse(raw)
        except Exception as e:  # a deserializer's error: DecodeError for protobuf
            raise unparsed(raw, e) from None


def unparsed(raw: bytes, error: Exception) -> MessageError:
    """The refusal of a request message ``raw`` that did not parse (``error``: the deserializer's), logged.

    Args:
        raw: the message.
        error: why it did not parse.

    Returns:
        The error (INVALID_ARGUMENT) the call ends with.
    """
    log.info("refusing a gRPC request message of %d bytes: %s", len(raw), error)
    return MessageError(grpc.StatusCode.INVALID_ARGUMENT, f"request message of {len(raw)} bytes refused: "
                        f"{error or 'not a protobuf message of this RPC'}")
