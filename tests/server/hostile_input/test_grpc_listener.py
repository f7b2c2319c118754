"""The gRPC listener under hostile clients, over real ``irpe serve --grpc-port`` processes on 127.0.0.1: the key
checked before a message is read, message deadlines, the stream cap, idle and handshake timeouts, the connection
cap, the open-file limit, the bounded ModelStreamInfer, undecodable messages, and Triton's ModelReady answer.
While an attack runs, a keyed gRPC client and HTTP /healthz keep answering (:class:`~.grpc_hostile.Probe`).

The clients here send hand-written protobuf bytes (:mod:`tests.server.grpc_hostile`); checks that need
tritonclient's messages run in a child process (this process imports kserve, whose messages clash)."""

from __future__ import annotations

import concurrent.futures
import re
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.reliability.procs import REPO, ServerProcess, server_env, serving, start_server
from tests.server import grpc_hostile as h2
from tests.server.grpc.test_servicer import grpc_address
from tests.server.grpc_hostile import SERVICE, Probe, call, h2_connect, read_frames, status_of

KEY = "hostile-key"
WORST_MS = 300  # the goal is 100 ms; the margin is for this shared 2-core machine (today's code: seconds)
LIMITS = ("--grpc-port", "0", "--frontends", "0", "--max-connections", "40", "--header-timeout-s", "1",
          "--body-timeout-s", "1")
GRPC_LIMITS = ("--grpc-max-streams", "8", "--grpc-idle-timeout-s", "1")


def _serve(artifact: Path, key: str) -> Iterator[ServerProcess]:
    with serving(artifact, *LIMITS, *GRPC_LIMITS, env=server_env(IRPE_API_KEY=key) if key else None) as proc:
        yield proc


@pytest.fixture(scope="module")
def keyed(tiny_artifact: Path) -> Iterator[ServerProcess]:
    yield from _serve(tiny_artifact, KEY)


@pytest.fixture(scope="module")
def keyless(tiny_artifact: Path) -> Iterator[ServerProcess]:
    yield from _serve(tiny_artifact, "")


def _port(server: ServerProcess) -> int:
    return int(grpc_address(server).rsplit(":", 1)[1])


def _held_calls(channel: grpc.Channel, n: int, release: threading.Event) -> list[grpc.Future]:
    """``n`` ModelInfer calls that send their headers and never their message (until ``release``)."""
    def never() -> Iterator[bytes]:
        release.wait(30)
        return
        yield b""

    stub = channel.stream_unary(SERVICE + "ModelInfer")
    return [stub.future(never(), timeout=30) for _ in range(n)]


def test_a_keyless_16mb_message_is_refused_before_it_is_parsed(keyed: ServerProcess) -> None:
    """16 MB of tiny fields without a key: UNAUTHENTICATED at once, and nobody else waits for it."""
    big = h2.tiny_fields(16 << 20)
    with Probe(grpc_address(keyed), keyed.url, KEY) as probe, grpc.insecure_channel(grpc_address(keyed)) as attacker:
        probe.warm()
        for _ in range(3):
            start = time.perf_counter()
            code, details = status_of(lambda: call(attacker, "ModelInfer", big, timeout=30))
            assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in details, (code, details)
            assert time.perf_counter() - start < 2.0
        time.sleep(0.3)
    print(f"probe worst {probe.worst_ms():.0f} ms over {len(probe.grpc_ms)} gRPC / {len(probe.http_ms)} HTTP")
    assert not probe.failures and probe.worst_ms() < WORST_MS, (probe.failures, probe.worst_ms())


def test_a_keyed_message_of_many_fields_is_refused_unparsed(keyed: ServerProcess) -> None:
    """With the key: the split walks at most FIELD_BUDGET fields and refuses the rest unparsed (protobuf's
    parser would hold the GIL for 0.5 s)."""
    big = h2.tiny_fields(16 << 20)
    with Probe(grpc_address(keyed), keyed.url, KEY) as probe, grpc.insecure_channel(grpc_address(keyed)) as client:
        probe.warm()
        code, details = status_of(lambda: call(client, "ModelInfer", big, key=KEY, timeout=30))
        time.sleep(0.3)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "more than 256 top-level fields" in details, (code, details)
    print(f"probe worst {probe.worst_ms():.0f} ms over {len(probe.grpc_ms)} gRPC / {len(probe.http_ms)} HTTP")
    assert not probe.failures and probe.worst_ms() < WORST_MS, (probe.failures, probe.worst_ms())


def test_calls_that_never_send_their_message_take_no_slots_without_a_key(keyed: ServerProcess) -> None:
    """60 keyless calls that never send their message (over --max-connections 40 concurrent RPCs): refused
    at call start, so the keyed client is never RESOURCE_EXHAUSTED."""
    release = threading.Event()
    with grpc.insecure_channel(grpc_address(keyed)) as attacker:
        held = _held_calls(attacker, 60, release)
        try:
            time.sleep(0.5)
            with Probe(grpc_address(keyed), keyed.url, KEY) as probe:
                probe.warm()
                time.sleep(1.0)
        finally:
            release.set()
        ends = [(f.exception().code(), f.exception().details()) if f.exception() else ("OK", "") for f in held]
    print(f"probe worst {probe.worst_ms():.0f} ms over {len(probe.grpc_ms)} gRPC / {len(probe.http_ms)} HTTP")
    # streams the client opens past the cap (8) before it has the server's SETTINGS are reset: UNAVAILABLE
    unauthenticated = [d for code, d in ends if code == grpc.StatusCode.UNAUTHENTICATED]
    reset = [d for code, d in ends if code == grpc.StatusCode.UNAVAILABLE and "RST_STREAM" in d]
    assert len(unauthenticated) + len(reset) == len(ends) and len(unauthenticated) >= 8, ends
    assert not probe.failures and probe.worst_ms() < WORST_MS, (probe.failures, probe.worst_ms())


def test_a_message_that_does_not_come_is_deadline_exceeded(keyless: ServerProcess) -> None:
    """Where no key is needed, the message is due within --body-timeout-s (1 s here)."""
    release = threading.Event()
    with grpc.insecure_channel(grpc_address(keyless)) as client:
        start = time.perf_counter()
        held = _held_calls(client, 4, release)
        errors = [f.exception(timeout=20) for f in held]
        elapsed = time.perf_counter() - start
        release.set()
        assert status_of(lambda: call(client, "ServerLive"))[0] == grpc.StatusCode.OK
    assert all(e is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED for e in errors), errors
    assert all("--body-timeout-s" in e.details() for e in errors), [e.details() for e in errors]
    assert elapsed < 6, elapsed


def test_a_stream_that_goes_quiet_ends_after_its_answers(keyless: ServerProcess) -> None:
    """A ModelStreamInfer stream's next message is due within --grpc-idle-timeout-s (1 s here): the answer in
    flight is sent, then the stream ends DEADLINE_EXCEEDED naming the flag."""
    release = threading.Event()

    def one_then_quiet() -> Iterator[bytes]:
        yield h2.infer_request(request_id="q")
        release.wait(15)

    with grpc.insecure_channel(grpc_address(keyless)) as client:
        start = time.perf_counter()
        stream = client.stream_stream(SERVICE + "ModelStreamInfer")(one_then_quiet(), timeout=20)
        got: list[bytes] = []
        code, details = status_of(lambda: got.extend(stream))
        elapsed = time.perf_counter() - start
        release.set()
    assert len(got) == 1 and b"q" in got[0], got
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "--grpc-idle-timeout-s" in details, (code, details)
    assert elapsed < 8, elapsed


def test_streams_per_connection_are_capped(keyless: ServerProcess) -> None:
    """--grpc-max-streams 8: the server's SETTINGS say so, and streams past it are reset (RST_STREAM
    REFUSED_STREAM or ENHANCE_YOUR_CALM, gRPC core's choice for a peer that ignores the setting)."""
    sock = h2_connect(_port(keyless))
    try:
        frames, _ = read_frames(sock, 0.5)
        assert h2.settings_of(frames).get(h2.MAX_CONCURRENT_STREAMS) == 8, h2.settings_of(frames)
        sock.sendall(b"".join(h2.headers_frame(2 * i + 1, SERVICE + "ModelInfer") for i in range(12)))
        frames, _ = read_frames(sock, 1.0)
    finally:
        sock.close()
    refused = [stream for kind, stream, payload in frames if kind == h2.RST_STREAM and payload[-1] in (0x7, 0xB)]
    assert refused == [17, 19, 21, 23], frames


def test_idle_and_silent_connections_are_closed_and_capped(keyed: ServerProcess) -> None:
    """60 connections that send the preface and SETTINGS, then nothing, over a cap of 40: the excess closed
    at once, the rest after --grpc-idle-timeout-s (1 s); one that sends nothing after --header-timeout-s (1 s);
    the keyed client and /healthz answer meanwhile."""
    with Probe(grpc_address(keyed), keyed.url, KEY) as probe:
        probe.warm()
        silent = h2_connect(_port(keyed), preface=False)
        idle = [h2_connect(_port(keyed)) for _ in range(60)]
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            closed = list(pool.map(lambda s: _closed_after(s, 8.0), [silent, *idle]))
        for sock in (silent, *idle):
            sock.close()
    print(f"probe worst {probe.worst_ms():.0f} ms; closed after {sorted(round(c, 1) for c in closed)} s")
    assert all(c < 5.0 for c in closed), closed
    assert 0.5 < closed[0] < 3.0, closed[0]  # the silent one: by --header-timeout-s, not the cap
    assert sum(c < 0.5 for c in closed[1:]) >= 15, closed  # over the cap: at once (the probe holds one)
    assert time.perf_counter() - start < 8
    assert not probe.failures and probe.worst_ms() < WORST_MS, (probe.failures, probe.worst_ms())


def _closed_after(sock: object, limit: float) -> float:
    start = time.perf_counter()
    _, closed = read_frames(sock, limit)  # type: ignore[arg-type]
    return time.perf_counter() - start if closed else float("inf")


def test_a_connection_is_asked_to_go_away_at_its_age(tiny_artifact: Path) -> None:
    """--grpc-max-age-s: a connection gets GOAWAY after its age (gRPC core adds up to 10% jitter)."""
    proc = start_server(tiny_artifact, "--grpc-port", "0", "--frontends", "0", "--grpc-max-age-s", "1")
    try:
        sock = h2_connect(_port(proc))
        frames, _ = read_frames(sock, 4.0)
        sock.close()
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)
    assert any(kind == h2.GOAWAY for kind, _, _ in frames), frames


def test_the_soft_open_file_limit_is_raised_to_the_hard_limit(tiny_artifact: Path) -> None:
    """Started with a soft RLIMIT_NOFILE of 1,024, the server runs with the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 1024:
        pytest.skip(f"the hard open-file limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        proc = start_server(tiny_artifact, "--grpc-port", "0", "--frontends", "0")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        line = next(ln for ln in Path(f"/proc/{proc.pid}/limits").read_text().splitlines()
                    if ln.startswith("Max open files"))
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)
    assert line.split()[3] == str(hard), line


def test_a_stream_of_huge_failing_ids_holds_no_memory(keyless: ServerProcess) -> None:
    """Two rounds of 120 failing requests with a 4 MB id, answers not read: each refused naming the id cap,
    nothing echoed; the server takes less memory than a round sends (480 MB), and the second round adds little
    to what the first took (the allocator keeps freed 4 MB buffers for reuse, by an amount that varies from run
    to run: +70 to +360 MB in the first round, -200 to +60 MB in the second on a 2-core VM)."""
    first = _unread_stream_of_huge_ids(keyless)
    second = _unread_stream_of_huge_ids(keyless)
    print(f"rss +{first:.0f} MB in the first round, {second:+.0f} MB in the second")
    assert first < 480 and second < 150, (first, second)


def _unread_stream_of_huge_ids(server: ServerProcess) -> float:
    """Send 120 stream requests with a 4 MB id, let the server answer them all before reading one, then read and
    check the answers. Returns the server's RSS growth in MB while the answers were unread."""
    before, refused = server.rss_mb(), _stream_errors(server)
    request = h2.infer_request(model="nope", request_id="i" * (4 << 20))
    with grpc.insecure_channel(grpc_address(server), options=[("grpc.max_send_message_length", 8 << 20),
                                                               ("grpc.max_receive_message_length", 8 << 20)]) as c:
        answers = c.stream_stream(SERVICE + "ModelStreamInfer")(iter([request] * 120), timeout=60)
        deadline = time.monotonic() + 30
        while _stream_errors(server) < refused + 120 and time.monotonic() < deadline:
            time.sleep(0.2)  # every request answered, no answer read yet
        grown = server.rss_mb() - before
        got = [answer for answer, _ in zip(answers, range(120), strict=False)]
    assert len(got) == 120 and all(b"at most 1024" in a and len(a) < 4096 for a in got), [a[:200] for a in got[:2]]
    return grown


def _stream_errors(server: ServerProcess) -> float:
    """ModelStreamInfer requests answered INVALID_ARGUMENT so far (the server's metrics)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    m = re.search(r'^irpe_requests_total\{method="GRPC",route="/inference.GRPCInferenceService/ModelStreamInfer",'
                  r'status="INVALID_ARGUMENT"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_undecodable_messages_are_invalid_argument_without_a_traceback(keyless: ServerProcess) -> None:
    """Garbage to unary RPCs, an unimplemented RPC, and a stream [valid, valid, garbage]: INVALID_ARGUMENT
    (UNIMPLEMENTED), no traceback; the stream sends both answers, then ends INVALID_ARGUMENT."""
    garbage = b"\x0a\xff\xff\xff\xff\x0f"
    with grpc.insecure_channel(grpc_address(keyless)) as client:
        for rpc in ("ModelInfer", "ModelMetadata", "ServerLive", "ModelStreamInfer"):
            if rpc == "ModelStreamInfer":
                stream = client.stream_stream(SERVICE + rpc)(iter([garbage]), timeout=10)
                code, details = status_of(lambda s=stream: list(s))
            else:
                code, details = status_of(lambda r=rpc: call(client, r, garbage))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "refused" in details, (rpc, code, details)
        code, _ = status_of(lambda: call(client, "CudaSharedMemoryStatus"))
        assert code == grpc.StatusCode.UNIMPLEMENTED
        stream = client.stream_stream(SERVICE + "ModelStreamInfer")(
            iter([h2.infer_request(request_id="a"), h2.infer_request(request_id="b"), garbage]), timeout=20)
        got: list[bytes] = []
        code, details = status_of(lambda: got.extend(stream))
    assert len(got) == 2 and code == grpc.StatusCode.INVALID_ARGUMENT, (len(got), code, details)
    time.sleep(0.3)
    log = keyless.output()
    assert "Traceback" not in log and "Unexpected" not in log, log[-3000:]


def test_model_ready_of_an_unknown_model_is_false(keyed: ServerProcess) -> None:
    """Triton answers ready=false (not NOT_FOUND) for a model it does not hold; tritonclient's is_model_ready
    returns False against it, and against this server."""
    with grpc.insecure_channel(grpc_address(keyed)) as client:
        assert call(client, "ModelReady", b"\x0a\x04nope", key=KEY) == b""  # ready=false: the empty message
        assert call(client, "ModelReady", b"\x0a\x09tiny-mean", key=KEY) == b"\x08\x01"
    code = (f"import tritonclient.grpc as g; c = g.InferenceServerClient({grpc_address(keyed)!r}); "
            f"print(c.is_model_ready('nope', headers={{'authorization': 'Bearer {KEY}'}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_the_request_split_agrees_with_protobuf_on_fuzzed_bytes() -> None:
    """parse_infer (the raw_input split) against protobuf's own parse of the same bytes (hypothesis, in a child
    process: it needs tritonclient's messages)."""
    code = "from tests.server.grpc_split_fuzz import run; run(); print('passed')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip().endswith("passed"), (out.stdout[-2000:], out.stderr[-3000:])
