"""Health probes against a crowded keyless lane, on a real ``irpe serve --grpc-port`` with a key on 127.0.0.1: grpcio
clients without the key hold every slot of the keyless lane (health Watch streams, and health Check calls whose
message never comes); a keyless health Check, as Kubernetes' gRPC probe sends it, still answers SERVING from the
probe reserve, while another keyless call is refused RESOURCE_EXHAUSTED, the reserve is itself bounded in count and
time, and keyed calls run as before."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from irpe.server.grpc.limits import KEYLESS_CALLS, KEYLESS_PER_CONNECTION, PROBE_MESSAGE_S, PROBE_RESERVE
from tests.reliability.procs import ServerProcess, server_env, serving
from tests.server import grpc_h2 as h2
from tests.server.grpc.test_servicer import grpc_address
from tests.server.grpc_hostile import infer_request, status_of

KEY = "probe-reserve-key"
KEYED = (("authorization", f"Bearer {KEY}"),)
# Held calls last --grpc-idle-timeout-s (a Watch) or --header-timeout-s (a missing message) at most: long enough
# for the checks below on this shared 2-core machine, short enough that nothing outlives the test by much.
FLAGS = ("--grpc-port", "0", "--frontends", "0", "--header-timeout-s", "20", "--body-timeout-s", "20",
         "--grpc-idle-timeout-s", "20")
PROBE_GOAL_S = 2.0  # a probe's answer within this (Kubernetes' default probe timeout is 1 s; margin for the load)
CHECK = h2.HEALTH + "Check"
WATCH = h2.HEALTH + "Watch"


@pytest.fixture(scope="module")
def keyed(tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, *FLAGS, env=server_env(IRPE_API_KEY=KEY)) as proc:
        yield proc


def _channel(server: ServerProcess) -> grpc.Channel:
    """A channel of its own connection (no subchannel shared with the test's other channels)."""
    return grpc.insecure_channel(grpc_address(server), options=[("grpc.use_local_subchannel_pool", 1)])


def _check(channel: grpc.Channel, metadata: tuple = ()) -> tuple[grpc.StatusCode, str, float]:
    """A health Check of the server (service ""): its status code, details or serving status, and seconds."""
    check = channel.unary_unary(CHECK, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                response_deserializer=health_pb2.HealthCheckResponse.FromString)
    start = time.monotonic()
    try:
        answer = check(health_pb2.HealthCheckRequest(), metadata=metadata, timeout=10)
    except grpc.RpcError as e:
        return e.code(), e.details() or "", time.monotonic() - start
    return grpc.StatusCode.OK, health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status), \
        time.monotonic() - start


class Crowd:
    """``connections`` connections, each holding ``per_connection`` keyless calls: health Watch streams and health
    Check calls whose request message waits on :attr:`release` (sent, with the key absent, once it is set)."""

    def __init__(self, server: ServerProcess, connections: int, per_connection: int, watches: int):
        self.release = threading.Event()
        self.channels = [_channel(server) for _ in range(connections)]
        self.calls: list[grpc.Future] = []
        self.stalled: list[Future] = []
        self.pool = ThreadPoolExecutor(connections * per_connection)
        for channel in self.channels:  # the Watch streams first, each running once it has its first answer
            watch = channel.unary_stream(WATCH, request_serializer=health_pb2.HealthCheckRequest.SerializeToString)
            for _ in range(watches):
                call = watch(health_pb2.HealthCheckRequest(), timeout=30)
                self.calls.append(call)
                next(call)
                self.stalled.append(self.pool.submit(lambda c=call: status_of(lambda: list(c))))
        for channel in self.channels:
            stalled = channel.stream_unary(CHECK, request_serializer=health_pb2.HealthCheckRequest.SerializeToString)
            for _ in range(per_connection - watches):
                self.stalled.append(self.pool.submit(status_of, lambda s=stalled: s(self._late(), timeout=30)))
        time.sleep(0.5)  # the silent calls' headers reach the server (nothing tells a client they did)

    def _late(self) -> Iterator[health_pb2.HealthCheckRequest]:
        self.release.wait(30)
        yield health_pb2.HealthCheckRequest()

    def close(self) -> list[tuple[grpc.StatusCode, str]]:
        """End every held call; their outcomes."""
        self.release.set()
        for call in self.calls:
            call.cancel()
        outcomes = [f.result(30) for f in self.stalled]
        self.pool.shutdown()
        for channel in self.channels:
            channel.close()
        return outcomes


def _wait_full(server: ServerProcess, deadline_s: float = 10.0) -> str:
    """Wait until a keyless Watch is refused (the lane full); its refusal's details."""
    with _channel(server) as channel:
        watch = channel.unary_stream(WATCH, request_serializer=health_pb2.HealthCheckRequest.SerializeToString)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            call = watch(health_pb2.HealthCheckRequest(), timeout=10)
            code, details = status_of(lambda c=call: next(c))
            call.cancel()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return details
            time.sleep(0.1)
    raise AssertionError(f"the keyless lane was not full after {deadline_s} s: the last Watch got {code} {details}")


def test_a_probe_answers_while_anonymous_calls_fill_the_keyless_lane(keyed: ServerProcess) -> None:
    """KEYLESS_CALLS held keyless calls (2 Watch streams and 2 silent Checks on each of 8 connections): another
    keyless Watch is RESOURCE_EXHAUSTED naming the cap, a keyless health Check answers SERVING within
    PROBE_GOAL_S (but not on a connection that holds its share of the lane), keyed ModelInfer and keyed Check
    answer OK, and the held calls end when released."""
    crowd = Crowd(keyed, KEYLESS_CALLS // KEYLESS_PER_CONNECTION, KEYLESS_PER_CONNECTION, watches=2)
    try:
        refused = _wait_full(keyed)
        assert f"{KEYLESS_CALLS} calls without the key are running" in refused and "Bearer" in refused, refused
        probes = []
        for _ in range(3):  # one after the other, each on a connection of its own, as Kubernetes probes
            with _channel(keyed) as channel:
                probes.append(_check(channel))
        crowding = _check(crowd.channels[0])  # a connection that holds its share of the lane: no reserve for it
        with _channel(keyed) as channel:
            keyed_check = _check(channel, KEYED)
            infer = channel.unary_unary(h2.INFERENCE + "ModelInfer")
            keyed_infer = status_of(lambda: infer(infer_request(), metadata=KEYED, timeout=10))
    finally:
        outcomes = crowd.close()
    print(f"probes {[(c.name, s, round(t, 3)) for c, s, t in probes]}; keyed Check {keyed_check[:2]}")
    assert all(code == grpc.StatusCode.OK and status == "SERVING" for code, status, _ in probes), probes
    assert max(t for *_, t in probes) < PROBE_GOAL_S, probes
    assert crowding[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and "on this connection" in crowding[1], crowding
    assert keyed_check[:2] == (grpc.StatusCode.OK, "SERVING") and keyed_infer[0] == grpc.StatusCode.OK, keyed_infer
    held = [code for code, _ in outcomes]
    assert len(held) == KEYLESS_CALLS and set(held) <= {grpc.StatusCode.OK, grpc.StatusCode.CANCELLED}, outcomes


def test_the_probe_reserve_is_bounded_in_count_and_time(keyed: ServerProcess) -> None:
    """With the keyless lane full, PROBE_RESERVE + 2 silent keyless Checks on connections of their own: at most
    PROBE_RESERVE run, the others are RESOURCE_EXHAUSTED naming the caps, and the ones that ran end
    DEADLINE_EXCEEDED after PROBE_MESSAGE_S (not --header-timeout-s)."""
    crowd = Crowd(keyed, KEYLESS_CALLS // KEYLESS_PER_CONNECTION, KEYLESS_PER_CONNECTION, watches=2)
    try:
        _wait_full(keyed)
        start = time.monotonic()
        silent = Crowd(keyed, PROBE_RESERVE + 2, 1, watches=0)
        outcomes = [(f.result(30), time.monotonic() - start) for f in silent.stalled]
        silent.close()
        with _channel(keyed) as channel:
            after = _check(channel)  # the reserve is free again
    finally:
        crowd.close()
    print(f"silent probes in the reserve: {[(c.name, round(t, 2)) for (c, _), t in outcomes]}")
    refused = [(d, t) for (c, d), t in outcomes if c == grpc.StatusCode.RESOURCE_EXHAUSTED]
    late = [(d, t) for (c, d), t in outcomes if c == grpc.StatusCode.DEADLINE_EXCEEDED]
    assert len(refused) >= 2 and len(refused) + len(late) == len(outcomes), outcomes
    assert all(f"{PROBE_RESERVE} probes beyond them" in d and "Bearer" in d for d, _ in refused), refused
    # the deadline sweep runs every 0.25 s; 3 s more for this shared machine's load
    assert all("probe without the key" in d and PROBE_MESSAGE_S - 0.1 < t < PROBE_MESSAGE_S + 3 for d, t in late), late
    assert after[:2] == (grpc.StatusCode.OK, "SERVING"), after
