"""A small network of Linux network namespaces made and removed by a test (root only): one balancer namespace
holding a bridge, and N host namespaces each joined to it by a veth pair. Addresses are in 10.213.0.0/24 and
exist only inside these namespaces; nothing is added to the root namespace, so nothing here is reachable from
outside and nothing outside is reached. Names carry the test process's pid; a run killed before its clean-up
leaves namespaces that the next run removes (:func:`sweep_stale`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

PREFIX = "irpelb"
SUBNET = "10.213.0"


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def unavailable() -> str:
    """Why network namespaces cannot be made here ("" when they can): not root, no ``ip``, or a kernel or
    container that refuses them."""
    if shutil.which("ip") is None:
        return "no 'ip' command (Debian: apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as e:
        return f"ip netns add failed: {e}"
    with contextlib.suppress(RuntimeError):
        _ip("netns", "del", probe)
    return ""


def _kill_inside(namespace: str) -> None:
    """SIGKILL what still runs in one of this test's namespaces (only processes the test started live there)."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=10)
    for pid in out.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def sweep_stale() -> list[str]:
    """Remove the namespaces of earlier runs whose test process is gone; the names removed."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    removed = []
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name[len(PREFIX):].split("-")[0]
        if not name.startswith(PREFIX) or not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
            continue
        _kill_inside(name)
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", name)
            removed.append(name)
    return removed


@dataclass
class Lab:
    """The namespaces: ``balancer`` and ``hosts`` (names), ``addresses`` (the hosts', in order)."""

    balancer: str
    hosts: list[str]
    addresses: list[str] = field(default_factory=list)

    def exec(self, namespace: str, command: list[str]) -> list[str]:
        """``command`` run inside ``namespace`` (``ip netns exec`` execs it: the process keeps the pid)."""
        return ["ip", "netns", "exec", namespace, *command]

    def remove(self) -> None:
        """Kill what runs inside, then delete every namespace (its links and addresses go with it)."""
        for namespace in [*self.hosts, self.balancer]:
            _kill_inside(namespace)
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", namespace)


def _build(lab: Lab) -> None:
    _ip("netns", "add", lab.balancer)
    _ip("-n", lab.balancer, "link", "set", "lo", "up")
    _ip("-n", lab.balancer, "link", "add", "br0", "type", "bridge")
    _ip("-n", lab.balancer, "link", "set", "br0", "up")
    _ip("-n", lab.balancer, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
    for i, host in enumerate(lab.hosts, start=1):
        address = f"{SUBNET}.{10 + i}"
        _ip("netns", "add", host)
        _ip("-n", host, "link", "set", "lo", "up")
        _ip("link", "add", "eth0", "netns", host, "type", "veth", "peer", "name", f"h{i}", "netns", lab.balancer)
        _ip("-n", host, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", host, "link", "set", "eth0", "up")
        _ip("-n", lab.balancer, "link", "set", f"h{i}", "master", "br0")
        _ip("-n", lab.balancer, "link", "set", f"h{i}", "up")
        lab.addresses.append(address)


@contextlib.contextmanager
def lab(hosts: int) -> Iterator[Lab]:
    """A balancer namespace and ``hosts`` host namespaces on one bridge; everything is removed at the end,
    also when building or the test fails."""
    sweep_stale()
    tag = f"{PREFIX}{os.getpid()}"
    made = Lab(f"{tag}-lb", [f"{tag}-h{i}" for i in range(1, hosts + 1)])
    try:
        _build(made)
        yield made
    finally:
        made.remove()
