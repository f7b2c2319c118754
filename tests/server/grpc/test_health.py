"""``grpc.health.v1.Health`` and server reflection on ``irpe serve --grpc-port``, proven by grpcio's own health
stub and reflection client against a real ``irpe serve`` on 127.0.0.1: Check follows readiness (the default
model unloaded and loaded again over HTTP), Watch sends only changes and ends when the server stops, unknown
services are NOT_FOUND, health needs no key while inference and reflection do (where a key is set), calls
without the key are capped per connection, and reflection resolves the KServe v2 messages."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from irpe.server.grpc.limits import KEYLESS_PER_CONNECTION
from tests.reliability.procs import ServerProcess, server_env, serving, start_server
from tests.server.grpc.test_servicer import grpc_address

KEY = "health-test-key"
MODEL = "tiny-mean"
SERVICE = "inference.GRPCInferenceService"
HEALTH = "grpc.health.v1.Health"
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
GRACE_S = 30  # --timeout-s: how long a stop would wait for an open Watch that did not end by itself
MAX_CONNECTIONS = 4  # --max-connections: keyed calls running at once


@pytest.fixture(scope="module")
def server(tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, "--grpc-port", "0", "--model-control", "explicit", "--timeout-s", str(GRACE_S),
                 "--max-connections", str(MAX_CONNECTIONS), env=server_env(IRPE_API_KEY=KEY)) as proc:
        yield proc


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(grpc_address(server)) as chan:
        yield chan


def check(channel: grpc.Channel, service: str = "") -> int:
    """Check's status for ``service``, called without any metadata (no key)."""
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def control(server: ServerProcess, action: str) -> None:
    """Load or unload the default model over HTTP (a loopback bind: the API key suffices)."""
    r = httpx.post(f"{server.url}/v2/repository/models/{MODEL}/{action}", json={},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text


class Watcher:
    """A Watch stream read on a thread into a queue (each status with its arrival time); its final code."""

    def __init__(self, channel: grpc.Channel, service: str = ""):
        self.call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=120)
        self.seen: queue.Queue[tuple[int, float]] = queue.Queue()
        self.code: grpc.StatusCode | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for answer in self.call:
                self.seen.put((answer.status, time.monotonic()))
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code = e.code()

    def next(self, timeout: float = 15.0) -> int:
        return self.seen.get(timeout=timeout)[0]

    def quiet_for(self, seconds: float) -> bool:
        """True when nothing arrives within ``seconds``."""
        try:
            self.seen.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


def test_check_is_serving_when_ready_without_a_key(channel: grpc.Channel) -> None:
    assert check(channel) == SERVING
    assert check(channel, SERVICE) == SERVING


def test_check_of_an_unknown_service_is_not_found(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as e:
        check(channel, "no.such.Service")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no.such.Service" in e.value.details() and SERVICE in e.value.details()


def test_inference_needs_the_key_while_health_does_not(channel: grpc.Channel) -> None:
    metadata = channel.unary_unary(f"/{SERVICE}/ServerMetadata")  # raw bytes: an empty message is b""
    with pytest.raises(grpc.RpcError) as e:
        metadata(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert metadata(b"", timeout=10, metadata=[("authorization", f"Bearer {KEY}")])
    assert check(channel) == SERVING


def test_watch_sends_changes_only_and_check_follows_readiness(server: ServerProcess, channel: grpc.Channel) -> None:
    watch = Watcher(channel)
    try:
        assert watch.next() == SERVING
        assert watch.quiet_for(2.5)  # more than two of the server's re-reads: nothing sent without a change
        control(server, "unload")
        assert watch.next() == NOT_SERVING
        assert check(channel) == NOT_SERVING and check(channel, SERVICE) == NOT_SERVING
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 503  # the same readiness
        control(server, "load")
        assert watch.next() == SERVING
        assert check(channel) == SERVING
    finally:
        watch.call.cancel()
        watch.thread.join(10)
    assert watch.code == grpc.StatusCode.CANCELLED


def test_watch_of_an_unknown_service_answers_service_unknown(channel: grpc.Channel) -> None:
    watch = Watcher(channel, "no.such.Service")
    try:
        assert watch.next() == SERVICE_UNKNOWN
        assert watch.quiet_for(1.5)
    finally:
        watch.call.cancel()
        watch.thread.join(10)


def first_watch_answer(channel: grpc.Channel, key: str = "") -> int | grpc.StatusCode:
    """The first status a new Watch sends, or the code it ends with instead (the call is then cancelled);
    ``key``: sent as the call's key."""
    metadata = (("authorization", f"Bearer {key}"),) if key else None
    call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=10, metadata=metadata)
    try:
        return next(call).status
    except grpc.RpcError as e:
        return e.code()
    finally:
        call.cancel()


def test_keyless_calls_are_capped_per_connection(server: ServerProcess, channel: grpc.Channel) -> None:
    """KEYLESS_PER_CONNECTION Watch streams without the key fill their connection's keyless room: one more is
    RESOURCE_EXHAUSTED, while a Watch with the key (the keyed lane) and a Check over another connection answer."""
    watches = [Watcher(channel) for _ in range(KEYLESS_PER_CONNECTION)]
    try:
        assert [w.next() for w in watches] == [SERVING] * len(watches)
        assert first_watch_answer(channel) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert first_watch_answer(channel, key=KEY) == SERVING
        with grpc.insecure_channel(grpc_address(server), options=[("grpc.use_local_subchannel_pool", 1)]) as other:
            assert check(other) == SERVING
    finally:
        for w in watches:
            w.call.cancel()
            w.thread.join(10)
    deadline = time.monotonic() + 10  # the server counts a cancelled Watch as closed once its handler ends
    while (answer := first_watch_answer(channel)) != SERVING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert answer == SERVING


class Keyed(grpc.StreamStreamClientInterceptor):
    """Sends the key with every streaming call (grpcio's reflection client takes no metadata)."""

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {KEY}")]
        return continuation(details._replace(metadata=metadata), requests)


def test_reflection_needs_the_key_where_one_is_set(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        ProtoReflectionDescriptorDatabase(channel).get_services()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_reflection_lists_the_services_and_resolves_model_infer(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(grpc.intercept_channel(channel, Keyed()))
    assert {SERVICE, HEALTH} <= set(database.get_services())
    pool = descriptor_pool.DescriptorPool(database)
    infer = pool.FindServiceByName(SERVICE).methods_by_name["ModelInfer"]
    assert infer.input_type.full_name == "inference.ModelInferRequest"
    assert "raw_input_contents" in infer.input_type.fields_by_name
    assert pool.FindServiceByName(HEALTH).methods_by_name["Watch"].server_streaming
    # a method's name, as `grpcurl describe inference.GRPCInferenceService.ModelInfer` asks
    assert database.FindFileContainingSymbol(f"{SERVICE}.ModelInfer").name == "grpc_service.proto"
    with pytest.raises(KeyError):  # only the served protocol's files, not whatever else the process imported
        database.FindFileContainingSymbol("google.protobuf.FileDescriptorProto")


def test_watch_ends_with_not_serving_when_the_server_stops(server: ServerProcess, channel: grpc.Channel) -> None:
    """Last in this module: it stops the module's server."""
    watch = Watcher(channel)
    assert watch.next() == SERVING
    start = time.monotonic()
    server.proc.terminate()
    assert watch.next() == NOT_SERVING
    watch.thread.join(GRACE_S / 2)
    assert watch.code == grpc.StatusCode.OK  # the server ended the stream, well before the grace ran out
    assert time.monotonic() - start < GRACE_S / 2
    assert server.proc.wait(GRACE_S / 2) in (0, -15)


def test_every_front_end_follows_an_unload_and_load(tiny_artifact: Path) -> None:
    """``--frontends 2``: each front end answers health from its own view of the engine's models; a fresh
    channel per Check lets the kernel spread the calls over both."""
    proc = start_server(tiny_artifact, "--grpc-port", "0", "--frontends", "2", "--model-control", "explicit",
                        env=server_env(IRPE_API_KEY=KEY))
    try:
        address = grpc_address(proc)

        def statuses() -> set[int]:
            seen = set()
            for _ in range(6):
                with grpc.insecure_channel(address) as fresh:
                    seen.add(check(fresh))
            return seen

        assert statuses() == {SERVING}
        control(proc, "unload")  # answered once every front end routes accordingly
        assert statuses() == {NOT_SERVING}
        control(proc, "load")
        assert statuses() == {SERVING}
    finally:
        assert proc.stop() in (0, -15), proc.output()[-3000:]
        proc.log.unlink(missing_ok=True)


def test_health_and_server_ready_turn_not_serving_while_the_server_drains(tiny_artifact: Path) -> None:
    """``--drain-s``: from SIGTERM, Check answers NOT_SERVING and ServerReady false, as /readyz turns 503, while a
    keyed call on the open channel is still answered; the process then exits no sooner than the drain."""
    drain_s = 5.0  # the checks take well under a second on a quiet machine; the rest is margin for a loaded one
    proc = start_server(tiny_artifact, "--grpc-port", "0", "--drain-s", str(drain_s), env=server_env(IRPE_API_KEY=KEY))
    try:
        with grpc.insecure_channel(grpc_address(proc)) as chan:
            server_ready = chan.unary_unary(f"/{SERVICE}/ServerReady")  # raw bytes: ready=true is b"\x08\x01"
            keyed = (("authorization", f"Bearer {KEY}"),)
            assert check(chan) == SERVING and server_ready(b"", metadata=keyed, timeout=10) == b"\x08\x01"
            signalled = time.monotonic()
            proc.proc.terminate()
            while check(chan) == SERVING:
                assert time.monotonic() - signalled < drain_s, "Check still SERVING during the drain"
                time.sleep(0.05)
            assert server_ready(b"", metadata=keyed, timeout=10) == b""  # ready=false: the default, not written
            assert httpx.get(f"{proc.url}/readyz", timeout=5).status_code == 503
            assert time.monotonic() - signalled < drain_s, "the checks above took longer than the drain"
        assert proc.proc.wait(drain_s + 30) in (0, -15)
        assert time.monotonic() - signalled >= drain_s - 0.2  # the drain is waited out (0.2 s: timer rounding)
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)
