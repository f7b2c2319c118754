"""Calls without the key, compressed messages and oversized headers against real ``irpe serve --grpc-port``
processes on 127.0.0.1, written as raw HTTP/2 frames (:mod:`tests.server.grpc_h2`): keyless calls held open take
none of the keyed calls' room and end at their deadlines, a gzip bomb is refused before it is inflated, and headers
over ``--max-header-kb`` are refused whether or not the client acknowledged the server's SETTINGS. Meanwhile a
keyed ModelInfer and HTTP /healthz keep answering (:class:`InferProbe`)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from irpe.server.grpc.limits import KEYLESS_CALLS, KEYLESS_PER_CONNECTION, PROBE_RESERVE
from tests.reliability.procs import ServerProcess, server_env, serving
from tests.server import grpc_h2 as h2
from tests.server.grpc.test_servicer import grpc_address
from tests.server.grpc_hostile import frame, infer_request, status_of

KEY = "keyless-test-key"
# The goals are 100 ms (a keyed call) and 50 ms (/healthz); the medians are held to them, the worst answer to 300
# ms: this 2-core machine is shared with other test runs, and one scheduling hiccup costs more than the goal.
MEDIAN_MS, WORST_MS = 100, 300
IDLE_S, HEADER_S = 2, 1  # --grpc-idle-timeout-s (a keyless call's lifetime), --header-timeout-s (its message)
FLAGS = ("--grpc-port", "0", "--frontends", "0", "--max-connections", "40", "--grpc-max-streams", "64",
         "--header-timeout-s", str(HEADER_S), "--body-timeout-s", "5", "--grpc-idle-timeout-s", str(IDLE_S))


@pytest.fixture(scope="module")
def keyed(tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, *FLAGS, env=server_env(IRPE_API_KEY=KEY)) as proc:
        yield proc


@pytest.fixture(scope="module")
def open_server(tiny_artifact: Path) -> Iterator[ServerProcess]:
    """No key: reflection runs in the keyless lane, ModelInfer in the keyed one."""
    with serving(tiny_artifact, *FLAGS) as proc:
        yield proc


def _port(server: ServerProcess) -> int:
    return int(grpc_address(server).rsplit(":", 1)[1])


class InferProbe:
    """A keyed ModelInfer and HTTP /healthz, timed one after the other from a thread until the block ends."""

    def __init__(self, server: ServerProcess, key: str = KEY):
        self.server, self.key = server, key
        self.infer_ms: list[float] = []
        self.http_ms: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> InferProbe:
        self._thread.start()
        deadline = time.monotonic() + 10
        while len(self.http_ms) < 3 and time.monotonic() < deadline:  # connected and warm before the attack
            time.sleep(0.02)
        self.infer_ms.clear()
        self.http_ms.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        metadata = (("authorization", f"Bearer {self.key}"),) if self.key else None
        request = infer_request()
        with grpc.insecure_channel(grpc_address(self.server), options=[("grpc.use_local_subchannel_pool", 1)]) as ch, \
                httpx.Client(timeout=10) as http:
            infer = ch.unary_unary(h2.INFERENCE + "ModelInfer")
            while not self._stop.is_set():
                start = time.perf_counter()
                code, details = status_of(lambda: infer(request, metadata=metadata, timeout=10))
                self.infer_ms.append((time.perf_counter() - start) * 1000)
                if code != grpc.StatusCode.OK:
                    self.failures.append(f"ModelInfer {code.name} {details}")
                start = time.perf_counter()
                status = http.get(self.server.url + "/healthz").status_code
                self.http_ms.append((time.perf_counter() - start) * 1000)
                if status != 200:
                    self.failures.append(f"/healthz {status}")
                time.sleep(0.02)

    def check(self) -> None:
        """Every answer OK, the medians within their goals, the worst within :data:`WORST_MS`."""
        summary = (f"ModelInfer median {statistics.median(self.infer_ms):.1f} ms, worst {max(self.infer_ms):.0f} ms "
                   f"({len(self.infer_ms)}); /healthz median {statistics.median(self.http_ms):.1f} ms, worst "
                   f"{max(self.http_ms):.0f} ms")
        print(summary)
        assert not self.failures, self.failures[:5]
        assert statistics.median(self.infer_ms) < MEDIAN_MS and statistics.median(self.http_ms) < MEDIAN_MS / 2, \
            summary
        assert max(self.infer_ms + self.http_ms) < WORST_MS, summary


class Held:
    """``connections`` x ``streams`` calls opened over raw connections (``opening(stream)``: the frames that open
    one), each connection read on a thread: when each stream ended (trailers or RST_STREAM) and whether it was
    answered (a response message)."""

    def __init__(self, port: int, opening: Callable[[int], bytes], connections: int = 8, streams: int = 32):
        self.socks = [h2.connect(port) for _ in range(connections)]
        self.streams = streams
        self.start = time.monotonic()
        self.ended: list[dict[int, float]] = [{} for _ in self.socks]
        self.answered: list[set[int]] = [set() for _ in self.socks]
        self.threads = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(connections)]
        for sock in self.socks:
            sock.sendall(b"".join(opening(2 * i + 1) for i in range(streams)))
        for thread in self.threads:
            thread.start()

    def send(self, frames: Callable[[int], bytes]) -> None:
        """``frames(stream)`` on every stream of every connection (a connection the server closed is skipped)."""
        for sock in self.socks:
            try:
                sock.sendall(b"".join(frames(2 * i + 1) for i in range(self.streams)))
            except OSError:
                pass

    def _read(self, i: int) -> None:
        end = time.monotonic() + 3 * IDLE_S + 4
        while time.monotonic() < end and len(self.ended[i]) < self.streams:
            frames, closed = h2.drain(self.socks[i], 0.05)
            now = time.monotonic() - self.start
            for kind, flags, stream, payload in frames:
                if kind == h2.DATA and payload:
                    self.answered[i].add(stream)
                if kind == h2.RST_STREAM or (kind == h2.HEADERS and flags & h2.END_STREAM):
                    self.ended[i].setdefault(stream, now)
            if closed:
                return

    def join(self) -> list[float]:
        """Wait for every stream's end (or the readers' time limit); returns the end times."""
        for thread in self.threads:
            thread.join(3 * IDLE_S + 10)
        for sock in self.socks:
            sock.close()
        return [t for per in self.ended for t in per.values()]


def _call(path: str | Callable[[int], str], message: bytes | None, end_stream: bool = True) -> Callable[[int], bytes]:
    """The frames that open a stream to ``path`` (or ``path(stream)``): with ``message`` (and the client's end
    unless told otherwise), or without any (the message never comes)."""
    def opening(stream: int) -> bytes:
        frames = h2.open_stream(stream, h2.call_headers(path(stream) if callable(path) else path))
        return frames if message is None else frames + h2.data(stream, h2.message(message), end_stream)
    return opening


@pytest.mark.parametrize("kind", ["watch", "messageless"])
def test_held_keyless_calls_leave_keyed_calls_their_room(keyed: ServerProcess, kind: str) -> None:
    """256 health Watch streams, or 256 ServerLive / health Check calls whose message never comes, over 8
    connections (more than --max-connections 40): a keyed ModelInfer answers OK throughout; at most
    KEYLESS_CALLS of them run (KEYLESS_PER_CONNECTION per connection; silent probes PROBE_RESERVE more, in the
    probe reserve), the rest are refused at once, and every one has ended by its deadline (Watch:
    --grpc-idle-timeout-s; a missing message: --header-timeout-s)."""
    if kind == "watch":
        opening, deadline = _call(h2.HEALTH + "Watch", b""), IDLE_S
    else:
        opening, deadline = _call(lambda i: h2.INFERENCE + "ServerLive" if i % 4 == 1 else h2.HEALTH + "Check",
                                  None), HEADER_S
    with InferProbe(keyed) as probe:
        held = Held(_port(keyed), opening)
        ends = held.join()
    probe.check()
    answered = [len(a) for a in held.answered]
    print(f"{len(ends)} of 256 ended, the last after {max(ends):.2f} s; answered per connection {answered}")
    assert len(ends) == 256, held.ended
    assert max(ends) < deadline + 1.5, sorted(ends)[-5:]  # the deadline sweep runs every 0.25 s; the rest: load
    ran = KEYLESS_CALLS if kind == "watch" else KEYLESS_CALLS + PROBE_RESERVE
    assert sum(t > deadline - 0.5 for t in ends) <= ran  # the others were refused at once
    if kind == "watch":
        assert sum(answered) <= KEYLESS_CALLS and max(answered) <= KEYLESS_PER_CONNECTION, answered


def test_keyless_reflection_streams_leave_keyed_calls_their_room(open_server: ServerProcess) -> None:
    """On a server without a key: 256 reflection streams that keep asking ListServices every 0.3 s take at most
    KEYLESS_CALLS of the keyless lane and end after --grpc-idle-timeout-s, while ModelInfer answers OK."""
    with InferProbe(open_server, key="") as probe:
        held = Held(_port(open_server), _call(h2.REFLECTION, h2.LIST_SERVICES, end_stream=False))
        for _ in range(int(IDLE_S / 0.3) + 2):
            time.sleep(0.3)
            held.send(lambda stream: h2.data(stream, h2.message(h2.LIST_SERVICES)))
        ends = held.join()
    probe.check()
    answered = [len(a) for a in held.answered]
    print(f"{len(ends)} of 256 ended, the last after {max(ends):.2f} s; answered per connection {answered}")
    assert len(ends) == 256 and max(ends) < IDLE_S + 1.5, sorted(ends)[-5:]
    assert sum(answered) <= KEYLESS_CALLS and max(answered) <= KEYLESS_PER_CONNECTION, answered


def test_reflection_needs_the_key_where_one_is_set(keyed: ServerProcess) -> None:
    with grpc.insecure_channel(grpc_address(keyed)) as channel:
        stream = channel.stream_stream(h2.REFLECTION)
        code, _ = status_of(lambda: list(stream(iter([h2.LIST_SERVICES]), timeout=10)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        answers = list(stream(iter([h2.LIST_SERVICES]), metadata=(("authorization", f"Bearer {KEY}"),), timeout=10))
    assert len(answers) == 1 and b"inference.GRPCInferenceService" in answers[0]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_gzip_bomb_is_refused_before_it_is_inflated(keyed: ServerProcess) -> None:
    """ServerLive messages of 19 KB that gzip-inflate to 19 MiB, keyless, at 108 KB/s for 3 s: none is answered
    (compression is off: gRPC core refuses them unread), the server spends well under a second of CPU on them,
    and ModelInfer and /healthz keep their times. A gzip message from grpcio's client is UNIMPLEMENTED naming
    the algorithm; the same call uncompressed answers."""
    bomb = h2.gzip_bomb(19 << 20)
    port, sent, answered = _port(keyed), 0, 0
    with InferProbe(keyed) as probe:
        cpu, start = _cpu_s(keyed.pid), time.monotonic()
        sock = h2.connect(port)
        while time.monotonic() - start < 3:
            stream = 2 * sent + 1
            headers = h2.call_headers(h2.INFERENCE + "ServerLive", (("grpc-encoding", "gzip"),))
            sock.sendall(h2.open_stream(stream, headers) + h2.data(stream, h2.message(bomb, True), True))
            sent += 1
            frames, _ = h2.drain(sock, max(0.001, start + sent * len(bomb) / 108e3 - time.monotonic()))
            answered += sum(h2.answered(frames, 2 * i + 1) for i in range(sent))
        frames, _ = h2.drain(sock, 0.5)
        answered += sum(h2.answered(frames, 2 * i + 1) for i in range(sent))
        cpu = _cpu_s(keyed.pid) - cpu
        sock.close()
    print(f"{sent} bombs of {len(bomb)} bytes, {answered} answered; server CPU {cpu:.2f} s")
    probe.check()
    assert sent >= 12 and answered == 0, (sent, answered)
    assert cpu < 1.5, cpu  # before: 8.8 s of CPU in 10 s of such messages (inflated and parsed)
    with grpc.insecure_channel(grpc_address(keyed)) as channel:
        live = channel.unary_unary(h2.INFERENCE + "ServerLive")
        code, details = status_of(lambda: live(b"", compression=grpc.Compression.Gzip, timeout=10))
        assert code == grpc.StatusCode.UNIMPLEMENTED and "gzip" in details, (code, details)
        assert live(b"", timeout=10) == b"\x08\x01"


@pytest.mark.parametrize("ack", [False, True], ids=["settings-not-acknowledged", "settings-acknowledged"])
def test_headers_over_the_limit_are_refused(keyed: ServerProcess, ack: bool) -> None:
    """A ServerLive call with a 1 MB or 4 MB header field is refused (no answer) whether or not the client
    acknowledged the server's SETTINGS (gRPC core's own limit holds only after); one of 32 KB is answered."""
    port = _port(keyed)
    for size, expected in ((32 << 10, True), (1 << 20, False), (4 << 20, False)):
        sock = h2.connect(port, ack=ack)
        try:
            sock.sendall(h2.open_stream(1, h2.call_headers(h2.INFERENCE + "ServerLive", (("x-big", "y" * size),)))
                         + h2.data(1, h2.message(b""), True))
            frames, _ = h2.drain(sock, 1.0)
        finally:
            sock.close()
        assert h2.answered(frames, 1) is expected, (size, ack, frames[-3:])
    with grpc.insecure_channel(grpc_address(keyed)) as channel:
        code, details = status_of(lambda: channel.unary_unary(h2.INFERENCE + "ServerLive")(
            b"", metadata=(("x-big", "y" * (70 << 10)),), timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)


def test_refused_headers_hold_no_memory_and_a_silent_client_is_closed(keyed: ServerProcess) -> None:
    """12 connections that never acknowledge SETTINGS, one after the other, each opening 53 health Watch calls
    with a 1 MB header (636 MB in all): every call refused, and the server's memory stops growing (grpcio keeps
    each call's metadata until a cyclic collection, which the gate asks for). A connection that never
    acknowledges is closed after --header-timeout-s."""
    port, answered, rss = _port(keyed), 0, []
    block = h2.call_headers(h2.HEALTH + "Watch", (("x-big", "y" * (1 << 20)),))
    for _ in range(12):
        sock = h2.connect(port, ack=False)
        try:
            sock.sendall(b"".join(h2.open_stream(2 * i + 1, block) + h2.data(2 * i + 1, h2.message(b""), True)
                                  for i in range(53)))
            frames, _ = h2.drain(sock, 0.3)
            answered += sum(h2.answered(frames, 2 * i + 1) for i in range(53))
        finally:
            sock.close()
        rss.append(keyed.rss_mb())
    silent = h2.connect(port, ack=False)
    start = time.monotonic()
    _, closed = h2.drain(silent, HEADER_S + 3)
    silent.close()
    print(f"rss after each connection (MB): {[round(r) for r in rss]}; unacknowledged connection closed after "
          f"{time.monotonic() - start:.1f} s")
    assert answered == 0
    # with the collection: measured +170 to +215 MB after the first connection, flat by the 8th; without it, +53 MB
    # per connection until Python's own collection comes (+650 MB by the 11th)
    assert max(rss) - rss[0] < 350, rss
    assert closed and time.monotonic() - start < HEADER_S + 2


def test_an_endless_header_block_is_closed_at_the_idle_timeout(keyed: ServerProcess) -> None:
    """A HEADERS frame followed by CONTINUATION frames that never end the block: gRPC core reads and discards
    them (memory stays flat), and since no call has started, the connection is idle: GOAWAY and closed after
    --grpc-idle-timeout-s (gRPC core adds up to 10% jitter)."""
    sock = h2.connect(_port(keyed))
    sock.sendall(frame(h2.HEADERS, h2.call_headers(h2.INFERENCE + "ServerLive"), 0, 1))
    chunk = frame(h2.CONTINUATION, h2.literal("x-more", "y" * 16000), 0, 1) * 16
    before, start, sent, closed = keyed.rss_mb(), time.monotonic(), 0, False
    try:
        while not closed and time.monotonic() - start < IDLE_S + 6:
            sock.sendall(chunk)
            sent += len(chunk)
            _, closed = h2.drain(sock, 0.01)
    except OSError:
        closed = True
    finally:
        sock.close()
    took, grown = time.monotonic() - start, keyed.rss_mb() - before
    print(f"closed after {took:.1f} s and {sent >> 20} MB of header block; rss +{grown:.0f} MB")
    assert closed and took < IDLE_S * 1.1 + 3, took
    assert grown < 50, grown
