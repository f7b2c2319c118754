"""deploy/haproxy/haproxy.cfg, run as it is (Debian's HAProxy) in front of three real ``irpe serve`` hosts, each in
a network namespace of its own (tests/deploy/netns.py: made here, removed at the end). HAProxy and the clients run
in the balancer namespace; the clients (tests/deploy/lb_client.py) reach HAProxy on that namespace's 127.0.0.1,
HAProxy reaches the hosts on 10.213.0.0/24, which exists only inside these namespaces.

* the key and the pre-auth limits hold through the balancer (SECURITY.md's row);
* a rolling restart (SIGTERM one host at a time, wait for it to exit, start it again, wait until HAProxy has
  it up) under continuous HTTP /classify and gRPC ModelInfer load fails no request, not even a first attempt;
* a host killed with SIGKILL costs at most 5 first attempts and nothing after the client's retries; the time
  HAProxy takes to mark it down is measured.

The figures go to the test's output (``-s``) and docs/deploy/scale-out.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy import netns
from tests.reliability.procs import dies_with_this_thread

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
KEY = "lb-test-key"
HTTP_PORT, GRPC_PORT = 8000, 8001
LB_HTTP, LB_GRPC = "127.0.0.1:8080", "127.0.0.1:8081"  # inside the balancer namespace
DRAIN_S = 2.0  # > HAProxy's time to mark a host down (fall 2: 0.5 s + 0.25 s) with margin for a loaded CPU

pytestmark = pytest.mark.balancer


def _why_not() -> str:
    if shutil.which("haproxy") is None:
        return "no haproxy (scripts/install-haproxy.sh installs Debian's haproxy)"
    return netns.unavailable()


@dataclass
class Cluster:
    """The namespaces, HAProxy and one ``irpe serve`` per host namespace."""

    lab: netns.Lab
    tmp: Path
    haproxy: subprocess.Popen | None = None
    hosts: list[subprocess.Popen | None] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.tmp / "haproxy.sock"

    def start_host(self, i: int) -> None:
        """``irpe serve digits`` on host ``i``'s address (HTTP 8000, gRPC 8001, the key, --drain-s)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("IRPE_")}
        env["IRPE_API_KEY"] = KEY
        command = [sys.executable, "-m", "irpe", "serve", "digits", "--host", self.lab.addresses[i], "--port",
                   str(HTTP_PORT), "--grpc-port", str(GRPC_PORT), "--drain-s", str(DRAIN_S), "--log-level", "warning"]
        log = open(self.tmp / f"host{i + 1}.log", "ab")  # noqa: SIM115 (the child holds it)
        # dies with the test process, as HAProxy does (the launcher and ip netns exec both exec: one pid)
        self.hosts[i] = subprocess.Popen(dies_with_this_thread(self.lab.exec(self.lab.hosts[i], command)), cwd=REPO,
                                         env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def start_haproxy(self, config: Path = CONFIG) -> None:
        """HAProxy on ``config`` in the balancer namespace (stopping the one running first)."""
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.kill()
            self.haproxy.wait(10)
        env = dict(os.environ, IRPE_LB_HTTP=LB_HTTP, IRPE_LB_GRPC=LB_GRPC, HAPROXY_STATS_SOCKET=str(self.socket),
                   **{f"IRPE_HOST_{i + 1}": a for i, a in enumerate(self.lab.addresses)})
        log = open(self.tmp / "haproxy.log", "ab")  # noqa: SIM115
        command = self.lab.exec(self.lab.balancer, ["haproxy", "-db", "-f", str(config)])
        self.haproxy = subprocess.Popen(dies_with_this_thread(command), env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def states(self) -> dict[str, str]:
        """HAProxy's view of the HTTP backend's servers: {"irpe1": "UP", ...} (the runtime API's ``show stat``).
        "UP" only once a check has passed: HAProxy shows a server "UP 1/2" until its first check ends, as it
        does an UP server whose last check failed ("GOING DOWN 1/2" here), and one shown "UP" before a check
        passed is "UNCHECKED"."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.socket))
            s.sendall(b"show stat\n")
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
        lines = raw.decode().splitlines()
        names = lines[0].removeprefix("# ").split(",")
        rows = [dict(zip(names, line.split(","), strict=False)) for line in lines[1:] if line]
        http = [r for r in rows if r["pxname"] == "irpe_http" and r["svname"].startswith("irpe")]
        return {r["svname"]: _state(r["status"], r["check_status"].removeprefix("* ")) for r in http}  # "* ": running

    def wait_state(self, server: str, state: str, timeout: float) -> float:
        """Seconds until HAProxy reports ``server`` in ``state`` (polled every 20 ms)."""
        start = time.monotonic()
        while True:
            with contextlib.suppress(OSError):
                if self.states().get(server, "").startswith(state):
                    return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{server} not {state} after {timeout}s: {self.view()}\n{self.logs()}")
            time.sleep(0.02)

    def view(self) -> str:
        """:meth:`states` for a failure message, or why HAProxy did not say (it died, its socket is gone)."""
        try:
            return str(self.states())
        except OSError as e:
            return f"HAProxy's runtime API did not answer ({e!r})"

    def changes(self) -> str:
        """HAProxy's log lines of servers going up or down, in order."""
        lines = (self.tmp / "haproxy.log").read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if line.startswith("[WARNING]") and " is " in line)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.tmp.glob("*.log")))

    def client(self, *args: str) -> list[str]:
        return self.lab.exec(self.lab.balancer, [sys.executable, "-m", "tests.deploy.lb_client", *args])

    def stop(self) -> None:
        for proc in [*self.hosts, self.haproxy]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _state(status: str, check: str) -> str:
    """A server's state from ``show stat``'s status and its last check's status (see ``Cluster.states``)."""
    if status.startswith("UP "):
        return "GOING DOWN " + status.removeprefix("UP ")
    return "UNCHECKED" if status == "UP" and check != "L7OK" else status


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = _why_not()
    if why:
        pytest.skip(f"the balancer test cannot run here: {why}")
    with netns.lab(3) as lab:
        made = Cluster(lab, tmp_path_factory.mktemp("haproxy"), hosts=[None] * 3)
        try:
            for i in range(3):
                made.start_host(i)
            made.start_haproxy()
            for i in range(3):
                made.wait_state(f"irpe{i + 1}", "UP", timeout=120)
            yield made
        finally:
            made.stop()


@contextlib.contextmanager
def load(cluster: Cluster, name: str) -> Iterator[list[dict]]:
    """Continuous load while the block runs; then the list holds one record per request (lb_client's lines)."""
    out, stop = cluster.tmp / f"{name}.jsonl", cluster.tmp / f"{name}.stop"
    records: list[dict] = []
    proc = subprocess.Popen(cluster.client("load", LB_HTTP, LB_GRPC, KEY, str(out), str(stop)), cwd=REPO)
    try:
        deadline = time.monotonic() + 60  # imports tritonclient first: seconds, more on a loaded machine
        while not (out.exists() and out.read_text().count('"protocol": "grpc"') >= 2):  # every worker answered
            assert proc.poll() is None and time.monotonic() < deadline, "the load client did not start"
            time.sleep(0.1)
        yield records
    finally:
        stop.touch()
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
    records.extend(json.loads(line) for line in out.read_text().splitlines())


def _failures(records: list[dict], since: float, which: str) -> list[dict]:
    return [r for r in records if r["t"] >= since and r[which] != "ok"]


def test_the_balancer_keeps_the_api_key_and_the_pre_auth_limits(cluster: Cluster) -> None:
    """HAProxy passes the Authorization header through untouched and adds no key of its own: without the key
    (or with a wrong one) the host answers 401 / UNAUTHENTICATED through the balancer; a request head over
    HAProxy's buffer (tune.bufsize 64 KiB) is refused by HAProxy itself (400), before any host reads it."""
    out = subprocess.run(cluster.client("check", LB_HTTP, LB_GRPC, KEY), cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout)
    assert seen == {"ready": 200, "http_no_key": 401, "http_wrong_key": 401, "http_key": 200,
                    "http_oversized_head": 400, "grpc_no_key": "StatusCode.UNAUTHENTICATED", "grpc_key": "OK"}, \
        f"{seen}\nHAProxy's view now: {cluster.view()}\n{cluster.changes()}\n{cluster.logs()}"


def test_rolling_restart_under_load_fails_no_request(cluster: Cluster) -> None:
    """Each host in turn: SIGTERM (its /readyz turns 503 for --drain-s while it still serves; HAProxy marks it
    down), wait until it exits, start it again, wait until HAProxy has it up. Not one request fails, not even
    on its first attempt (the client's retries are not needed)."""
    with load(cluster, "rolling") as records:
        start = time.monotonic()
        for i, server in enumerate(["irpe1", "irpe2", "irpe3"]):
            proc = cluster.hosts[i]
            assert proc is not None
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            down = cluster.wait_state(server, "DOWN", timeout=DRAIN_S + 5)
            assert proc.wait(60) in (0, -signal.SIGTERM), cluster.logs()
            print(f"\n{server}: marked down {down:.2f} s after SIGTERM, exited after "
                  f"{time.monotonic() - signalled:.2f} s")
            cluster.start_host(i)
            cluster.wait_state(server, "UP", timeout=120)
        took = time.monotonic() - start
    first, final = _failures(records, start, "first"), _failures(records, start, "final")
    counts = {p: sum(r["protocol"] == p for r in records if r["t"] >= start) for p in ("http", "grpc")}
    print(f"rolling restart of 3 hosts in {took:.1f} s: {counts} requests, {len(first)} failed first attempts, "
          f"{len(final)} failed after retries")
    assert counts["http"] >= 50 and counts["grpc"] >= 20, counts  # the load really ran through the restart
    assert first == [], first[:5]


def _with_retry_on(cluster: Cluster, retry_on: str) -> Path:
    """HAProxy running on the shipped configuration with another ``retry-on`` line (every host up)."""
    shipped = "retry-on conn-failure empty-response 503"
    text = CONFIG.read_text()
    assert text.count(shipped) == 1, "the shipped retry-on line changed: update this test"
    config = cluster.tmp / f"haproxy-{retry_on.replace(' ', '-')}.cfg"
    config.write_text(text.replace(shipped, f"retry-on {retry_on}"))
    cluster.start_haproxy(config)
    for i in range(3):
        cluster.wait_state(f"irpe{i + 1}", "UP", timeout=120)
    time.sleep(1.5)  # HAProxy starts a server one failed check from DOWN; 3 more checks fill its health count
    return config


@pytest.mark.parametrize("retry_on", ["conn-failure empty-response 503", "conn-failure"],
                         ids=["shipped", "haproxy-default"])
def test_killed_host_costs_at_most_5_first_attempts_and_none_after_retries(cluster: Cluster, retry_on: str) -> None:
    """SIGKILL one host under load: its in-flight requests and connections break at once. With the shipped
    configuration HAProxy replays what never got an answer on another host (retry-on ... empty-response); with
    HAProxy's default (conn-failure only) the requests in flight on the killed host fail. Either way at most 5
    first attempts fail and none after the client's retries. HAProxy's detection time (kill to DOWN) is
    measured."""
    if cluster.hosts[1] is None or cluster.hosts[1].poll() is not None:  # killed by the previous case
        cluster.start_host(1)
    _with_retry_on(cluster, retry_on)
    victim = cluster.hosts[1]
    assert victim is not None
    with load(cluster, "kill-" + retry_on.replace(" ", "-")) as records:
        time.sleep(1.0)
        cluster.wait_state("irpe2", "UP", timeout=10)
        start = time.monotonic()
        victim.kill()
        detect = cluster.wait_state("irpe2", "DOWN", timeout=10)
        time.sleep(1.5)  # load on the two hosts left
    victim.wait(10)
    first, final = _failures(records, start - 0.5, "first"), _failures(records, start - 0.5, "final")
    after = sum(r["t"] >= start for r in records)
    print(f"\nretry-on {retry_on}: SIGKILL of irpe2: HAProxy marked it down after {detect:.2f} s; {after} "
          f"requests after the kill, {len(first)} failed first attempts ({[r['first'][:60] for r in first]}), "
          f"{len(final)} after retries")
    assert detect < 3.0, "HAProxy took 3 s or more to mark a killed host down (checks every 0.5 s, fall 2)"
    assert after >= 20, after
    assert len(first) <= 5, first
    assert final == [], final


def test_a_server_is_up_only_after_a_passed_check() -> None:
    """What ``Cluster.states`` makes of ``show stat``: HAProxy 2.6 shows "UP 1/2" (check "* INI") until a server's
    first check ends, which the fixture must not take for UP."""
    assert _state("UP 1/2", "INI") == "GOING DOWN 1/2"
    assert _state("UP", "INI") == "UNCHECKED"
    assert _state("UP", "L7OK") == "UP"
    assert _state("DOWN 1/2", "L7OK") == "DOWN 1/2"
