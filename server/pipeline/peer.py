"""Who is on the other end of a loopback TCP connection: the uid that owns the client's socket.

The client's socket is the one whose local address is the client's ``(host, port)`` as the server sees it and
whose remote address is the server's. The kernel answers over netlink (:mod:`.sock_diag`): where the server's
address is known (HTTP's accepted socket, a gRPC listener on one address), the one socket of that 4-tuple, a
hash lookup whatever the number of sockets; otherwise (a gRPC listener on a wildcard address) the sockets with
the client's port at one end, the server's side being the socket whose remote address is the client. Where
netlink is not available, the same sockets are read from ``/proc/net/tcp`` and ``/proc/net/tcp6``, which list
every TCP socket of the network namespace. Only ESTABLISHED sockets count (a socket in TIME_WAIT shows uid
0). Client shared memory (:mod:`.sysshm`) uses it to tie a region to the local user that registered it. A peer
that is not on loopback, or that no single uid's socket matches, has no uid here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from . import sock_diag

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"  # the st column of /proc/net/tcp
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Endpoint:
    """One end of a TCP connection, as the server's socket reports it."""

    host: str
    port: int


def _address(host: str) -> IPAddress | None:
    """``host`` as an address; an IPv4-mapped IPv6 address as the IPv4 one; None when not an address."""
    try:
        addr = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


def _hex_address(text: str) -> tuple[IPAddress, int]:
    """One ``ADDR:PORT`` of /proc/net/tcp(6): the address in 32-bit words of host byte order, the port in hex."""
    addr_hex, port_hex = text.split(":")
    raw = bytes.fromhex(addr_hex)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(words)
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr, int(port_hex, 16)


Address = tuple[IPAddress, int]


@dataclass(frozen=True)
class TcpSocket:
    """One ESTABLISHED socket of the kernel's table: its local and remote address and its owner's uid."""

    local: Address
    remote: Address
    uid: int


def established(text: str, port: int | None = None) -> list[TcpSocket]:
    """The ESTABLISHED sockets listed in the text of /proc/net/tcp or /proc/net/tcp6 (``port``: only those with
    that port at one end; the other lines are skipped before they are parsed)."""
    out = []
    tag = f":{port:04X} " if port is not None else ""
    for line in text.splitlines()[1:]:
        if tag not in line:
            continue
        fields = line.split()
        if len(fields) >= 8 and fields[3] == ESTABLISHED:
            out.append(TcpSocket(_hex_address(fields[1]), _hex_address(fields[2]), int(fields[7])))
    return out


def _read_tables(tables: Sequence[str], port: int) -> list[TcpSocket]:
    sockets: list[TcpSocket] = []
    for path in tables:
        try:
            with open(path, encoding="ascii") as f:
                sockets += established(f.read(), port)
        except OSError:
            continue
    return sockets


def loopback_uid(client: Endpoint, server: Endpoint | None = None,
                 tables: Sequence[str] | None = None) -> int | None:
    """The uid owning the client's socket of a loopback TCP connection.

    Args:
        client: the client's address and port, as the server's socket reports its peer.
        server: the server's address and port, as its socket reports them (:func:`listening_endpoint` for a
            listener); None where the front end does not know them (a gRPC listener on a wildcard address):
            then the server's side is the socket whose remote address is ``client``.
        tables: the kernel's TCP socket tables to read instead of asking over netlink (None: netlink, and
            ``/proc/net/tcp`` and ``tcp6`` where netlink does not answer).

    Returns:
        The uid, or None when the client is not on loopback, no socket matches, or sockets of several uids match.
    """
    client_addr = _address(client.host)
    if client_addr is None or not client_addr.is_loopback or not 0 < client.port < 65536:
        return None
    me = (client_addr, client.port)
    server_at = None
    if server is not None:
        server_addr = _address(server.host)
        if server_addr is None or not 0 < server.port < 65536:
            return None
        server_at = (server_addr, server.port)
    if tables is None:
        asked = _ask_kernel(me, server_at)
        if asked is not False:
            return asked
        tables = TCP_TABLES
    return _match(_read_tables(tables, client.port), me, server_at)


def _ask_kernel(me: Address, server_at: Address | None) -> int | None | bool:
    """The uid over netlink (:func:`loopback_uid`); False when netlink does not answer here."""
    if server_at is not None:
        found = sock_diag.connection(me, server_at)
        return found if found is False else (found.uid if found is not None else None)
    sockets = sock_diag.sockets_at(me[1])
    if sockets is None:
        return False
    return _match([TcpSocket(s.local, s.remote, s.uid) for s in sockets], me, None)


def _match(sockets: list[TcpSocket], me: Address, server_at: Address | None) -> int | None:
    """The one uid of the sockets from ``me`` to the server (``server_at``, or any socket whose remote is me)."""
    servers = {sock.local for sock in sockets if sock.remote == me} if server_at is None else {server_at}
    uids = {sock.uid for sock in sockets if sock.local == me and sock.remote in servers}
    return uids.pop() if len(uids) == 1 else None


def listening_endpoint(host: str, port: int) -> Endpoint | None:
    """The one local address of every connection a listener on ``host`` and ``port`` accepts, for
    :func:`loopback_uid`'s ``server``.

    Args:
        host: the address the listener was bound to (``--host``).
        port: its port.

    Returns:
        The endpoint, or None when connections may arrive on several addresses (a wildcard such as 0.0.0.0 or
        ::, or a host name).
    """
    addr = _address(host)
    if addr is None or addr.is_unspecified:
        return None
    return Endpoint(str(addr), port)


def grpc_peer(peer: str) -> Endpoint | None:
    """The client's endpoint from gRPC's ``context.peer()`` (``ipv4:127.0.0.1:5000``, ``ipv6:%5B::1%5D:5000``:
    a URI, percent-encoded); None for any other kind of peer (a Unix socket, an unparsable string)."""
    kind, _, rest = peer.partition(":")
    rest = unquote(rest)
    host, sep, port = rest.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not sep or not port.isdigit():
        return None
    return Endpoint(host.strip("[]"), int(port))
