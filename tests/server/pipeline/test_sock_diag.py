"""The netlink socket lookup (server/pipeline/sock_diag.py) against real loopback sockets of this process, and
against what /proc/net/tcp says of the same sockets (the fallback :func:`..peer.loopback_uid` reads)."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterator

import pytest

from irpe.server.pipeline import sock_diag
from irpe.server.pipeline.peer import TCP_TABLES, Endpoint, listening_endpoint, loopback_uid

LOOP4, LOOP6 = ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")
pytestmark = pytest.mark.skipif(sock_diag.sockets_at(1) is None, reason="no NETLINK_SOCK_DIAG here")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected loopback pair: (the client's socket, the server's accepted one)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            yield client, server


def _ends(sock: socket.socket) -> tuple[tuple[ipaddress.IPv4Address, int], tuple[ipaddress.IPv4Address, int]]:
    (host, port), (peer_host, peer_port) = sock.getsockname()[:2], sock.getpeername()[:2]
    return (ipaddress.ip_address(host), port), (ipaddress.ip_address(peer_host), peer_port)


def test_the_port_filter_is_ss_bytecode_that_the_kernel_accepts() -> None:
    code = sock_diag.port_filter(0x1234)
    assert len(code) == 36 and struct.unpack_from("=BBH", code, 4) == (0, 0, 0x1234)
    assert [code[i] for i in range(0, 36, 4) if i not in (4, 12, 24, 32)] == [2, 3, 1, 4, 5]  # >=, <=, jump, >=, <=
    assert sock_diag.sockets_at(1) == []  # a valid program (the kernel refuses a bad one: None here)


def test_the_dump_finds_both_ends_of_a_connection_and_their_uid(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    local, remote = _ends(client)
    found = {(s.local, s.remote, s.uid) for s in sock_diag.sockets_at(local[1]) or []}
    assert found == {(local, remote, os.getuid()), (remote, local, os.getuid())}
    assert all(s.state == sock_diag.TCP_ESTABLISHED for s in sock_diag.sockets_at(local[1]) or [])


def test_one_connection_by_its_4_tuple_and_cookie(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    local, remote = _ends(client)
    found = sock_diag.connection(local, remote)
    assert found and found.local == local and found.remote == remote and found.uid == os.getuid()
    assert sock_diag.connection(local, remote, found.cookie) == found
    assert sock_diag.connection(local, remote, b"\x01" * 8) is None  # another socket's cookie: ESTALE
    assert sock_diag.connection((LOOP4, local[1] ^ 1), remote) is None  # no such socket: ENOENT
    assert sock_diag.connection(local, (LOOP6, remote[1])) is None  # families differ
    client.close()
    server.close()
    assert sock_diag.connection(local, remote, found.cookie) is None  # closed: gone (or TIME_WAIT, not ESTABLISHED)


def test_ipv6_and_dual_stack_connections_are_found() -> None:
    for bind, host in (("::1", "::1"), ("::", "127.0.0.1")):
        with socket.create_server((bind, 0), family=socket.AF_INET6, dualstack_ipv6=bind == "::") as listener:
            port = listener.getsockname()[1]
            with socket.create_connection((host, port)) as client:
                conn, peer = listener.accept()
                with conn:
                    want = os.getuid()
                    assert loopback_uid(Endpoint(*peer[:2]), Endpoint(*conn.getsockname()[:2])) == want
                    assert loopback_uid(Endpoint(*peer[:2])) == want
                    assert loopback_uid(Endpoint(*peer[:2]), tables=TCP_TABLES) == want  # /proc agrees
                    local = (ipaddress.ip_address(client.getsockname()[0]), client.getsockname()[1])
                    assert sock_diag.connection(local, (ipaddress.ip_address(host), port)).uid == want


def test_listening_endpoint_is_known_only_for_one_address() -> None:
    assert listening_endpoint("127.0.0.1", 8001) == Endpoint("127.0.0.1", 8001)
    assert listening_endpoint("[::1]", 8001) == Endpoint("::1", 8001)
    assert listening_endpoint("::ffff:127.0.0.1", 8001) == Endpoint("127.0.0.1", 8001)
    assert listening_endpoint("0.0.0.0", 8001) is None and listening_endpoint("::", 8001) is None
    assert listening_endpoint("localhost", 8001) is None  # a name may be several addresses
