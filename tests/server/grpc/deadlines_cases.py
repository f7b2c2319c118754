"""The cases of test_deadlines.py, run there in a child interpreter: with the installed grpcio the gate lets
grpc.aio read a keyed unary call's message and still ends the call DEADLINE_EXCEEDED when the message does not
come, with no error logged, and every call leaves the keyed lane (answered, late, refused unparsed, or given up
by the client). A real grpc.aio server on 127.0.0.1 behind the real CallGate; a raw method whose handler echoes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from irpe.server.config import Settings
from irpe.server.grpc import deadlines
from irpe.server.grpc.gate import CallGate
from irpe.server.grpc.limits import GrpcLimits

BODY_TIMEOUT_S = 0.5
SERVICE = "irpe.test.Echo"


class Found(grpc.aio.ServerInterceptor):
    """Records what :func:`deadlines.call_state` finds at call start."""

    def __init__(self) -> None:
        self.states: list[Any] = []

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        self.states.append(deadlines.call_state(asyncio.current_task()))
        return await continuation(details)


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request == b"slow":
        await asyncio.sleep(0.2)
    return request


def _strict(raw: bytes) -> bytes:
    if raw.startswith(b"bad"):
        raise ValueError("not an echo message")
    return raw


async def _server(interceptor: grpc.aio.ServerInterceptor) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(interceptors=(interceptor,))
    handler = grpc.unary_unary_rpc_method_handler(_echo, request_deserializer=_strict)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _never(release: asyncio.Event) -> AsyncIterator[bytes]:
    await release.wait()
    return
    yield b""  # an async generator that sends nothing


def test_the_installed_grpcio_gives_the_call_state_at_call_start() -> None:
    async def run() -> list[Any]:
        found = Found()
        server, address = await _server(found)
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                assert await channel.unary_unary(f"/{SERVICE}/Echo")(b"hi") == b"hi"
        finally:
            await server.stop(0)
        return found.states

    states = asyncio.run(run())
    assert len(states) == 1 and type(states[0]).__name__ == "RPCState", states


def test_no_state_outside_a_call() -> None:
    async def run() -> Any:
        return deadlines.call_state(asyncio.current_task())

    assert asyncio.run(run()) is None
    assert deadlines.call_state(None) is None


def test_the_gate_ends_a_late_unary_message_and_every_call_leaves_its_lane(caplog: pytest.LogCaptureFixture) -> None:
    """Three calls that never send their message end DEADLINE_EXCEEDED naming --body-timeout-s within a sweep of
    it (the bound allows 2 s for a loaded machine); answered, unparseable and abandoned calls leave the lane."""
    gate = CallGate(Settings(body_timeout_s=BODY_TIMEOUT_S), GrpcLimits.from_settings(Settings(
        body_timeout_s=BODY_TIMEOUT_S)), lambda *_: None)

    async def run() -> dict[str, Any]:
        server, address = await _server(gate)
        out: dict[str, Any] = {}
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                echo = channel.unary_unary(f"/{SERVICE}/Echo")
                assert await echo(b"hi") == b"hi"
                release = asyncio.Event()
                start = time.perf_counter()
                held = [channel.stream_unary(f"/{SERVICE}/Echo")(_never(release)) for _ in range(3)]
                out["late"] = [await _status(call) for call in held]
                out["late_s"] = time.perf_counter() - start
                release.set()
                out["bad"] = await _status(echo(b"bad message"))
                slow = echo(b"slow")
                await asyncio.sleep(0.05)
                out["running_slow"] = gate.keyed.running
                slow.cancel()
                gone = channel.stream_unary(f"/{SERVICE}/Echo")(_never(release := asyncio.Event()))
                await asyncio.sleep(0.05)
                out["running_waiting"] = gate.keyed.running
                gone.cancel()
                await asyncio.sleep(0.3)
                out["running_after"] = gate.keyed.running
        finally:
            await server.stop(0)
        return out

    with caplog.at_level(logging.DEBUG, logger="grpc"):
        out = asyncio.run(run())
    assert all(code == grpc.StatusCode.DEADLINE_EXCEEDED and "--body-timeout-s" in details
               for code, details in out["late"]), out["late"]
    assert BODY_TIMEOUT_S <= out["late_s"] < 2.0, out
    assert out["bad"][0] == grpc.StatusCode.INVALID_ARGUMENT and "not an echo message" in out["bad"][1], out
    assert out["running_slow"] == 1 and out["running_waiting"] == 1 and out["running_after"] == 0, out
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("grpc")], \
        [r.getMessage() for r in caplog.records]


async def _status(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_call_waiting_for_its_message_when_the_server_stops_ends_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """The server stops while a keyed unary call waits for its message: the call ends, the sweep sends nothing
    after (its task is done), nothing is logged as a warning, and the lane is empty."""
    settings = Settings(body_timeout_s=BODY_TIMEOUT_S)
    gate = CallGate(settings, GrpcLimits.from_settings(settings), lambda *_: None)

    async def run() -> tuple[Any, int]:
        server, address = await _server(gate)
        release = asyncio.Event()
        async with grpc.aio.insecure_channel(address) as channel:
            held = channel.stream_unary(f"/{SERVICE}/Echo")(_never(release))
            await asyncio.sleep(0.1)
            await server.stop(0)
            status = await _status(held)
            await asyncio.sleep(BODY_TIMEOUT_S + 0.5)  # past the deadline: the sweep has run
            release.set()
        return status, gate.keyed.running

    with caplog.at_level(logging.DEBUG, logger="grpc"):
        status, running = asyncio.run(run())
    assert status[0] != grpc.StatusCode.OK and running == 0, (status, running)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("grpc")], \
        [r.getMessage() for r in caplog.records]
