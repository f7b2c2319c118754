"""TCP sockets and their owner uid, asked of the kernel over netlink (``NETLINK_SOCK_DIAG``): what :mod:`.peer`
needs to find who is on the other end of a loopback connection.

- :func:`connection`: the one socket of a 4-tuple (``inet_diag_req_v2`` without a dump: a hash lookup in the
  kernel, whatever the size of the table), optionally only while it is the same socket (its cookie, unique
  per socket since boot: a port reused by a new connection is another socket).
- :func:`sockets_at`: the ESTABLISHED sockets with one port at either end, a dump filtered in the kernel
  (``INET_DIAG_REQ_BYTECODE``), for when only one end is known. The kernel still walks its whole hash table
  (milliseconds on a large machine), so callers remember what it found.

The bytecode uses the port comparisons every kernel with ``inet_diag`` has (``>=`` and ``<=``, not the newer
``==``). Both answer None where netlink is not available (a sandbox without ``sock_diag``): the caller then
reads ``/proc/net/tcp``.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_REQ_BYTECODE = 1
TCP_ESTABLISHED = 1
BC_JMP, BC_S_GE, BC_S_LE, BC_D_GE, BC_D_LE = 1, 2, 3, 4, 5  # linux/inet_diag.h
NOCOOKIE = struct.pack("=II", 0xFFFFFFFF, 0xFFFFFFFF)
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_REQUEST = struct.Struct("=BBBBI2s2s16s16sI8s")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
_MESSAGE = struct.Struct("=BBBB2s2s16s16sI8sIIIII")  # inet_diag_msg: family, state, .., sockid, .., uid, inode
_ATTR = struct.Struct("=HH")  # rtattr
RECV_BYTES = 1 << 16
MAX_REPLIES = 64  # reads of one answer (a port is at one end of a handful of sockets): a bound on the loop
TIMEOUT_S = 2.0
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Address = tuple[IPAddress, int]


@dataclass(frozen=True)
class DiagSocket:
    """One socket as the kernel reports it: its local and remote address, owner uid, state and cookie."""

    local: Address
    remote: Address
    uid: int
    state: int
    cookie: bytes


def _op(code: int, yes: int, no: int) -> bytes:
    return struct.pack("=BBH", code, yes, no)


def port_filter(port: int) -> bytes:
    """The bytecode of ``sport == port or dport == port`` (as ``ss`` compiles ``sport = :P or dport = :P``).

    Args:
        port: the port.

    Returns:
        The ``INET_DIAG_REQ_BYTECODE`` program: each op jumps ``yes`` bytes on a match, ``no`` bytes otherwise;
        the program accepts when it ends exactly at its end (36 bytes), refuses past it.
    """
    arg = _op(0, 0, port)
    return (_op(BC_S_GE, 8, 20) + arg + _op(BC_S_LE, 8, 12) + arg  # source port: on to the jump, else to dport
            + _op(BC_JMP, 4, 20)  # both matched: jump to the end (accept)
            + _op(BC_D_GE, 8, 20) + arg + _op(BC_D_LE, 8, 12) + arg)  # else the destination port, past the end


def _raw(addr: IPAddress) -> bytes:
    return addr.packed.ljust(16, b"\0")


def _request(family: int, flags: int, states: int, sockid: tuple[bytes, bytes, bytes, bytes, bytes],
             attr: bytes = b"") -> bytes:
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, states, *sockid[:4], 0, sockid[4]) + attr
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | flags, 1, 0) + body


def _address(family: int, raw: bytes) -> IPAddress:
    addr = ipaddress.ip_address(raw[:4] if family == socket.AF_INET else raw)
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


def _parse(data: bytes, out: list[DiagSocket]) -> bool:
    """Append the sockets of one read's messages to ``out``; True once the answer is complete.

    Raises:
        OSError: the kernel answered an error (ENOENT: no such socket; ESTALE: another socket now).
    """
    pos = 0
    while pos + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, pos)
        if length < _HEADER.size:
            raise OSError(errno.EBADMSG, "sock_diag: a malformed netlink message")
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, pos + _HEADER.size)[0]
            raise OSError(code, f"sock_diag: {os.strerror(code)}")
        if kind == SOCK_DIAG_BY_FAMILY and length >= _HEADER.size + _MESSAGE.size:
            m = _MESSAGE.unpack_from(data, pos + _HEADER.size)
            out.append(DiagSocket((_address(m[0], m[6]), int.from_bytes(m[4], "big")),
                                  (_address(m[0], m[7]), int.from_bytes(m[5], "big")), m[13], m[1], m[9]))
        pos += (length + 3) & ~3
    return False


def _ask(request: bytes, dump: bool) -> list[DiagSocket]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.send(request)
        out: list[DiagSocket] = []
        for _ in range(MAX_REPLIES):
            if _parse(sock.recv(RECV_BYTES), out) or not dump:
                return out
    raise OSError(errno.EMSGSIZE, f"sock_diag: more than {MAX_REPLIES} reads in one answer")


def connection(local: Address, remote: Address, cookie: bytes = NOCOOKIE) -> DiagSocket | None | bool:
    """The ESTABLISHED socket whose local and remote address are these (one hash lookup in the kernel).

    Args:
        local: its local address and port.
        remote: its remote address and port (same family as ``local``; IPv4-mapped addresses as IPv4).
        cookie: the socket's cookie from an earlier answer: the answer is then that socket or none.

    Returns:
        The socket; None when there is none (or no longer that one, or not ESTABLISHED); False when the kernel
        does not answer this query here.
    """
    family = socket.AF_INET if local[0].version == 4 else socket.AF_INET6
    if remote[0].version != local[0].version:
        return None
    sockid = (local[1].to_bytes(2, "big"), remote[1].to_bytes(2, "big"), _raw(local[0]), _raw(remote[0]), cookie)
    try:
        found = _ask(_request(family, 0, 0xFFFFFFFF, sockid), dump=False)
    except OSError as e:
        return None if e.errno in (errno.ENOENT, errno.ESTALE) else False
    sock = found[0] if found else None
    return sock if sock is not None and sock.state == TCP_ESTABLISHED else None


def sockets_at(port: int) -> list[DiagSocket] | None:
    """The ESTABLISHED TCP sockets (IPv4 and IPv6) with ``port`` at either end.

    Args:
        port: the port, 1-65535.

    Returns:
        The sockets (IPv4-mapped addresses as IPv4), or None when the kernel does not answer this query here.
    """
    code = port_filter(port)
    attr = _ATTR.pack(_ATTR.size + len(code), INET_DIAG_REQ_BYTECODE) + code
    sockid = (b"\0\0", b"\0\0", bytes(16), bytes(16), NOCOOKIE)
    out: list[DiagSocket] = []
    try:
        for family in (socket.AF_INET, socket.AF_INET6):
            out += _ask(_request(family, NLM_F_DUMP, 1 << TCP_ESTABLISHED, sockid, attr), dump=True)
    except OSError:
        return None
    return out
