"""Client shared memory against hostile callers, over a real ``irpe serve --allow-client-shm`` on 127.0.0.1.

- A batch over the model's limit named in a huge region is refused before a byte of it is read: the server's
  peak RSS does not grow by the region's size and ``/healthz`` answers while such requests run.
- A web page's cross-site ``text/plain`` POSTs (register another program's segment, infer into a region,
  unregister all) are refused and touch nothing.
- A local user of another uid cannot register a segment it does not own, and cannot see, use or unregister
  another uid's regions, over HTTP and gRPC, also when it sends ``X-Forwarded-For`` naming the other's socket.

The other user is ``nobody``: a child interpreter that drops to its uid after its imports (``child.as_user``; the
tests run as root).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import pwd
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from irpe.server.config import Settings
from irpe.server.pipeline.peer import Endpoint, established, grpc_peer, loopback_uid
from tests.reliability.procs import ServerProcess, serving
from tests.server.helpers import expected_logits
from tests.server.hostile_input.child import as_user, holding

triton = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
if importlib.util.find_spec("tritonclient.grpc") is None:  # found, not imported (see as_user)
    pytest.skip("tritonclient[grpc] is in the dev extra", allow_module_level=True)

MODEL = "tiny-mean"
INFER = f"/v2/models/{MODEL}/infer"
NOBODY = pwd.getpwnam("nobody")
HUGE = 512 << 20  # the sparse segment of the batch-size test
PAGE = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="a second uid needs root to switch to it")


def call(url: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> list[Any]:
    """One HTTP request with the standard library (no lazy imports: it runs as another uid in
    ``child.as_user``); [status, body]."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return [resp.status, json.loads(raw)]
    except ValueError:
        return [resp.status, raw.decode(errors="replace")]


@contextlib.contextmanager
def segment(size: int = 64 * 1024, uid: int = 0, mode: int = 0o600, fill: int = 7,
            prefix: str = "i41h_") -> Iterator[str]:
    """A /dev/shm segment of ``size`` bytes owned by ``uid`` with ``mode`` (the first 4 KB set to ``fill``,
    the rest sparse), as another program leaves one; its key; removed on exit."""
    key = f"/{prefix}{uuid.uuid4().hex[:12]}"
    path = Path("/dev/shm", key[1:])
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, bytes([fill]) * 4096, 0)
        os.fchown(fd, uid, -1)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    try:
        yield key
    finally:
        path.unlink(missing_ok=True)


def shm_bytes(key: str, size: int = 4096) -> bytes:
    return Path("/dev/shm", key[1:]).read_bytes()[:size]


def vm_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


@pytest.fixture(scope="module")
def server(tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, "--allow-client-shm", "--frontends", "0", "--grpc-port", "0",
                 "--max-shm-region-mb", "600", "--max-wait-ms", "2") as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.unregister_system_shared_memory()
    c.close()


def infer_body(region: str, shape: list[int], output: str | None = None) -> bytes:
    """A JSON infer request reading ``images`` of ``shape`` from ``region`` (and the logits into ``output``)."""
    size = int(np.prod(shape)) * 4
    req: dict[str, Any] = {"inputs": [{"name": "images", "shape": shape, "datatype": "FP32", "parameters": {
        "shared_memory_region": region, "shared_memory_byte_size": size}}]}
    if output:
        req["outputs"] = [{"name": "logits", "parameters": {"shared_memory_region": output,
                                                            "shared_memory_byte_size": shape[0] * 40,
                                                            "shared_memory_offset": 32768}}]
    return json.dumps(req).encode()


# -- the peer's uid --------------------------------------------------------------------------------------------


def _connect_and_hold(port: int, family: int, host: str) -> list[Any]:
    sock = socket.socket(family)
    sock.connect((host, port))
    local = sock.getsockname()
    sock.recv(1)  # held open until the parent closes its side
    return [local[0], local[1]]


@pytest.mark.parametrize("family,bind,host", [(socket.AF_INET, "127.0.0.1", "127.0.0.1"),
                                              (socket.AF_INET6, "::1", "::1"),
                                              (socket.AF_INET6, "::", "127.0.0.1")],
                         ids=["ipv4", "ipv6", "dual-stack"])
def test_loopback_uid_is_the_client_sockets_owner(family: int, bind: str, host: str) -> None:
    listener = socket.create_server((bind, 0), family=family, dualstack_ipv6=bind == "::")
    with listener:
        port = listener.getsockname()[1]
        with socket.socket(socket.AF_INET if host == "127.0.0.1" else socket.AF_INET6) as mine:
            mine.connect((host, port))
            conn, peer = listener.accept()
            with conn:
                assert loopback_uid(Endpoint(*peer[:2]), Endpoint(*conn.getsockname()[:2])) == os.getuid()
                assert loopback_uid(Endpoint(*peer[:2])) == os.getuid()  # the server's side found from the peer
                assert loopback_uid(Endpoint(peer[0], peer[1] + 1 or 1), Endpoint(*conn.getsockname()[:2])) is None
                assert loopback_uid(Endpoint(*peer[:2]), Endpoint(conn.getsockname()[0], port + 1)) is None


# A child that drops to uid argv[1], group argv[2] and holds a connection to 127.0.0.1:argv[3] until killed.
CONNECT_AS = """
import encodings.idna, os, signal, socket, sys
os.setgroups([])
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[1]))
sock = socket.create_connection(("127.0.0.1", int(sys.argv[3])))
print("connected", flush=True)
signal.pause()
"""


@needs_root
def test_loopback_uid_tells_another_users_socket_apart() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        port = listener.getsockname()[1]
        with holding(CONNECT_AS, str(NOBODY.pw_uid), str(NOBODY.pw_gid), str(port)) as connected:
            assert connected == "connected\n", connected
            conn, peer = listener.accept()
            with conn:
                assert loopback_uid(Endpoint(*peer), Endpoint(*conn.getsockname())) == NOBODY.pw_uid


def test_loopback_uid_refuses_what_is_not_one_local_socket(tmp_path: Path) -> None:
    assert loopback_uid(Endpoint("10.1.2.3", 5000)) is None  # not loopback: no uid can be known
    assert loopback_uid(Endpoint("127.0.0.1", 0)) is None  # X-Forwarded-For without a port
    assert loopback_uid(Endpoint("localhost", 5000)) is None  # a name, not the socket's address
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = "   {n}: 0100007F:{lp} 0100007F:1F90 {st} 00000000:00000000 00:00000000 00000000  {uid}  0 {n} 1\n"
    table = tmp_path / "tcp"
    table.write_text(head + row.format(n=1, lp="C350", st="06", uid=0)  # TIME_WAIT shows uid 0: ignored
                     + row.format(n=2, lp="C350", st="01", uid=1000))
    client, server = Endpoint("127.0.0.1", 0xC350), Endpoint("127.0.0.1", 8080)
    assert loopback_uid(client, server, [str(table)]) == 1000
    assert [(s.local[1], s.uid) for s in established(table.read_text())] == [(0xC350, 1000)]
    twice = tmp_path / "tcp6"
    twice.write_text(head + "   3: 0000000000000000FFFF00000100007F:C350 0000000000000000FFFF00000100007F:1F90 01 "
                     "00000000:00000000 00:00000000 00000000  1001  0 3 1\n")
    assert loopback_uid(client, server, [str(table), str(twice)]) is None  # two uids claim it: none
    assert loopback_uid(client, server, [str(twice)]) == 1001  # an IPv4-mapped address is the IPv4 one
    assert grpc_peer("ipv4:127.0.0.1:5000") == Endpoint("127.0.0.1", 5000)
    assert grpc_peer("ipv6:[::1]:5000") == grpc_peer("ipv6:%5B::1%5D:5000") == Endpoint("::1", 5000)  # grpcio's
    assert grpc_peer("unix:/tmp/socket") is None and grpc_peer("ipv4:127.0.0.1") is None


# -- S1: the size checks come before any read -------------------------------------------------------------------


def test_a_batch_over_the_limit_is_refused_before_the_region_is_read(server: ServerProcess,
                                                                     client: triton.InferenceServerClient) -> None:
    with segment(HUGE, os.getuid()) as key:  # sparse: costs no memory until read
        client.register_system_shared_memory("huge", key, HUGE)
        body = infer_body("huge", [43690, 3, 32, 32])  # 511 MB of FP32, over --max-images 32
        headers = {"Inference-Header-Content-Length": str(len(body))}  # small and binary-framed: the inline path
        peak = vm_kb(server.pid, "VmHWM")
        with httpx.Client(base_url=server.url, timeout=60) as posts, httpx.Client(base_url=server.url) as probe, \
                ThreadPoolExecutor(4) as pool:
            probe.get("/healthz")  # connected before the clock starts
            sent = [pool.submit(posts.post, INFER, content=body, headers=headers) for _ in range(4)]
            waits = []
            while len(waits) < 5 or not all(f.done() for f in sent):
                start = time.perf_counter()
                assert probe.get("/healthz", timeout=30).status_code == 200
                waits.append(time.perf_counter() - start)
            answers = [f.result() for f in sent]
        assert all(r.status_code == 400 and "batch-size must be <= 32" in r.text for r in answers), answers[0].text
        grown_mb = (vm_kb(server.pid, "VmHWM") - peak) / 1024
        assert grown_mb < 64, f"peak RSS grew {grown_mb:.0f} MB: the region was read"
        assert max(waits) < 0.5, f"/healthz waited {max(waits):.2f} s: the event loop was held"
        wrong = json.loads(infer_body("huge", [1, 3, 32, 32]))
        wrong["inputs"][0]["parameters"]["shared_memory_byte_size"] = HUGE
        r = httpx.post(server.url + INFER, json=wrong, timeout=30)
        assert r.status_code == 400 and "expected 12288 bytes" in r.text


# -- S2: a web page's requests ----------------------------------------------------------------------------------


def test_cross_site_requests_are_refused_and_touch_nothing(server: ServerProcess,
                                                           client: triton.InferenceServerClient) -> None:
    with segment(uid=os.getuid()) as victim, segment(uid=os.getuid(), fill=0) as own:
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32), dtype=np.float32)
        Path("/dev/shm", own[1:]).write_bytes(x.tobytes() + bytes(64 * 1024 - x.nbytes))
        client.register_system_shared_memory("io", own, 64 * 1024)
        before = {victim: shm_bytes(victim), own: Path("/dev/shm", own[1:]).read_bytes()}
        register = json.dumps({"key": victim, "offset": 0, "byte_size": 4096}).encode()
        for headers in (PAGE, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"}):
            status, body = call(server.url, "POST", "/v2/systemsharedmemory/region/stolen/register", register,
                                headers)
            assert status == 403 and "refused" in body["error"], body
            status, body = call(server.url, "POST", INFER, infer_body("io", [1, 3, 32, 32], "io"), headers)
            assert status == 403, body
            status, body = call(server.url, "POST", "/v2/systemsharedmemory/unregister", b"", headers)
            assert status == 403, body
        status, body = call(server.url, "POST", "/v2/systemsharedmemory/region/stolen/register", register,
                            {"Content-Type": "text/plain"})  # a form or text body, even without Origin
        assert status == 415, body
        assert client.get_system_shared_memory_status() == [{"name": "io", "key": own, "offset": 0,
                                                              "byte_size": 64 * 1024}]
        assert shm_bytes(victim) == before[victim]
        assert Path("/dev/shm", own[1:]).read_bytes() == before[own]  # no logits written
        status, _ = call(server.url, "POST", INFER, infer_body("io", [1, 3, 32, 32], "io"))  # a script: served
        assert status == 200
        got = np.frombuffer(Path("/dev/shm", own[1:]).read_bytes()[32768:32808], "<f4")
        np.testing.assert_allclose(got, expected_logits(x)[0], atol=1e-4)


# -- S3: another local user -------------------------------------------------------------------------------------


def _register(url: str, name: str, key: str, headers: dict[str, str] | None = None) -> list[Any]:
    return call(url, "POST", f"/v2/systemsharedmemory/region/{name}/register",
                json.dumps({"key": key, "byte_size": 4096}).encode(), headers)


@needs_root
def test_a_segment_the_caller_does_not_own_is_refused(server: ServerProcess) -> None:
    with segment(uid=0, mode=0o600) as roots, segment(uid=NOBODY.pw_uid) as nobodys:
        status, body = as_user(NOBODY.pw_uid, _register, server.url, "stolen", roots)
        assert status == 403 and "owned by uid 0" in body["error"], body
        status, body = _register(server.url, "stolen", nobodys)  # root, too, registers only its own
        assert status == 403 and f"owned by uid {NOBODY.pw_uid}" in body["error"], body
        assert call(server.url, "GET", "/v2/systemsharedmemory/status") == [200, []]
        status, body = as_user(NOBODY.pw_uid, _register, server.url, "mine", nobodys)
        assert status == 200, body
        as_user(NOBODY.pw_uid, call, server.url, "POST", "/v2/systemsharedmemory/unregister")


def _stranger(url: str, name: str, key: str, spoof_port: int) -> dict[str, Any]:
    """What a second user sees and does, over HTTP: every answer."""
    spoof = {"X-Forwarded-For": f"127.0.0.1:{spoof_port}"}  # names root's open connection
    return {"status": call(url, "GET", "/v2/systemsharedmemory/status"),
            "spoofed": call(url, "GET", "/v2/systemsharedmemory/status", headers=spoof),
            "named": call(url, "GET", f"/v2/systemsharedmemory/region/{name}/status"),
            "infer": call(url, "POST", INFER, infer_body(name, [1, 3, 32, 32])),
            "unregister": call(url, "POST", f"/v2/systemsharedmemory/region/{name}/unregister", headers=spoof),
            "unregister_all": call(url, "POST", "/v2/systemsharedmemory/unregister"),
            "own": _register(url, name, key),  # the same name, its own segment: its own region
            "own_status": call(url, "GET", "/v2/systemsharedmemory/status"),
            "cleanup": call(url, "POST", "/v2/systemsharedmemory/unregister")}


@needs_root
def test_another_users_regions_are_invisible_and_stay_over_http(server: ServerProcess,
                                                                client: triton.InferenceServerClient) -> None:
    with segment(uid=0) as roots, segment(uid=NOBODY.pw_uid) as nobodys:
        client.register_system_shared_memory("io", roots, 64 * 1024)
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as held:  # root's connection, open meanwhile
            held.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            held.recv(65536)
            seen = as_user(NOBODY.pw_uid, _stranger, server.url, "io", nobodys, held.getsockname()[1])
        assert seen["status"] == [200, []] and seen["spoofed"] == [200, []]
        assert seen["named"][0] == 404 and seen["infer"][0] == 404, seen
        assert seen["unregister"][0] == seen["unregister_all"][0] == 200
        assert seen["own"][0] == 200
        assert seen["own_status"] == [200, [{"name": "io", "key": nobodys, "offset": 0, "byte_size": 4096}]]
        assert client.get_system_shared_memory_status() == [{"name": "io", "key": roots, "offset": 0,
                                                              "byte_size": 64 * 1024}]
        assert call(server.url, "POST", INFER, infer_body("io", [1, 3, 32, 32]))[0] == 200


def grpc_address(server: ServerProcess) -> str:
    for line in server.output().splitlines():
        if "gRPC listening on" in line:
            return line.rsplit(" ", 1)[1]
    raise AssertionError(server.output())


def _grpc_stranger(address: str, roots: str) -> dict[str, Any]:
    """What a second user sees and does over gRPC (tritonclient.grpc): every status code."""
    import tritonclient.grpc as tgrpc

    c = tgrpc.InferenceServerClient(address)

    def code(fn: Callable[[], Any]) -> str:
        try:
            fn()
            return "OK"
        except tgrpc.InferenceServerException as e:
            return str(e.status())

    inp = tgrpc.InferInput("images", [1, 3, 32, 32], "FP32")
    inp.set_shared_memory("io", 12288)
    out = {"status": json.loads(json.dumps(c.get_system_shared_memory_status(as_json=True))),
           "named": code(lambda: c.get_system_shared_memory_status("io")),
           "infer": code(lambda: c.infer(MODEL, [inp])),
           "register_roots": code(lambda: c.register_system_shared_memory("stolen", roots, 4096)),
           "unregister": code(lambda: c.unregister_system_shared_memory("io")),
           "unregister_all": code(lambda: c.unregister_system_shared_memory())}
    c.close()
    return out


def _grpc_stream(address: str, region: str, size: int) -> list[str]:
    """One ModelStreamInfer request reading ``images`` [1,3,32,32] from ``region`` (of ``size`` bytes); the
    stream's answers: "ok" or the error message."""
    import queue

    import tritonclient.grpc as tgrpc

    c = tgrpc.InferenceServerClient(address)
    answers: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put(error))
    inp = tgrpc.InferInput("images", [1, 3, 32, 32], "FP32")
    inp.set_shared_memory(region, size)
    c.async_stream_infer(MODEL, [inp])
    error = answers.get(timeout=30)
    c.stop_stream()
    c.close()
    return ["ok" if error is None else str(error)]


def _grpc_huge(address: str) -> str:
    """ModelInfer naming the 43,690 images of region "huge": its status and message."""
    import tritonclient.grpc as tgrpc

    c = tgrpc.InferenceServerClient(address)
    inp = tgrpc.InferInput("images", [43690, 3, 32, 32], "FP32")
    inp.set_shared_memory("huge", 43690 * 12288)
    try:
        c.infer(MODEL, [inp])
        return "OK"
    except tgrpc.InferenceServerException as e:
        return f"{e.status()} {e.message()}"
    finally:
        c.close()


@needs_root
def test_another_users_regions_are_invisible_and_stay_over_grpc(server: ServerProcess,
                                                                client: triton.InferenceServerClient) -> None:
    with segment(uid=0) as roots:
        client.register_system_shared_memory("io", roots, 64 * 1024)
        seen = as_user(NOBODY.pw_uid, _grpc_stranger, grpc_address(server), roots)
        assert seen["status"] in ({}, {"regions": {}}), seen
        assert seen["named"] == "StatusCode.NOT_FOUND" and seen["infer"] == "StatusCode.NOT_FOUND", seen
        assert seen["register_roots"] == "StatusCode.PERMISSION_DENIED", seen
        assert seen["unregister"] == seen["unregister_all"] == "OK"
        assert [r["name"] for r in client.get_system_shared_memory_status()] == ["io"]
        assert as_user(None, _grpc_stream, grpc_address(server), "io", 12288) == ["ok"]  # the owner streams
        stranger = as_user(NOBODY.pw_uid, _grpc_stream, grpc_address(server), "io", 12288)
        assert "Unable to find system shared memory region: 'io'" in stranger[0], stranger


def test_a_batch_over_the_limit_is_refused_before_the_region_is_read_over_grpc(
        server: ServerProcess, client: triton.InferenceServerClient) -> None:
    with segment(HUGE, os.getuid()) as key:
        client.register_system_shared_memory("huge", key, HUGE)
        peak = vm_kb(server.pid, "VmHWM")
        got = as_user(None, _grpc_huge, grpc_address(server))  # a child: grpc stays out of the test process
        assert got.startswith("StatusCode.INVALID_ARGUMENT") and "batch-size must be <= 32" in got, got
        assert (vm_kb(server.pid, "VmHWM") - peak) / 1024 < 64


@needs_root
def test_the_operators_name_prefix_lets_any_local_uid_register(tiny_artifact: Path) -> None:
    with serving(tiny_artifact, "--allow-client-shm", "--frontends", "0", "--shm-name-prefix", "i41shared_") as other, \
            segment(uid=0, prefix="i41shared_") as shared, segment(uid=0) as private:
        status, body = as_user(NOBODY.pw_uid, _register, other.url, "shared", shared)
        assert status == 200, body
        status, body = as_user(NOBODY.pw_uid, _register, other.url, "private", private)
        assert status == 403 and "--shm-name-prefix" in body["error"], body
        assert call(other.url, "GET", "/v2/systemsharedmemory/status") == [200, []]  # still nobody's own region
        assert as_user(NOBODY.pw_uid, call, other.url, "GET", "/v2/systemsharedmemory/status")[1][0]["key"] == shared
        linked = "/i41shared_link" + uuid.uuid4().hex[:8]  # a prefix name for root's 0600 segment: what a user
        os.link(Path("/dev/shm", private[1:]), Path("/dev/shm", linked[1:]))  # makes where protected_hardlinks=0
        try:
            status, body = as_user(NOBODY.pw_uid, _register, other.url, "linked", linked)
        finally:
            Path("/dev/shm", linked[1:]).unlink()
        assert status == 403 and "has 2 links" in body["error"], body


@pytest.mark.parametrize("prefix", ["/abc", "ab", ".hidden", "a" * 65, "tea m", "é_team"])
def test_a_bad_name_prefix_is_refused_at_startup(prefix: str) -> None:
    with pytest.raises(ValueError, match="shm_name_prefix"):
        Settings(allow_client_shm=True, shm_name_prefix=prefix).validate()
    Settings(allow_client_shm=True, shm_name_prefix="team_a.").validate()
