"""``--drain-s``: on SIGTERM /readyz turns 503 first while requests are still accepted and served, then the
server stops as before (what a load balancer's health check needs to take a host out without losing a request:
docs/deploy/load-balancer.md)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.reliability.procs import start_server
from tests.server.helpers import encode, image, wait_every_front_end_ready, wait_for_readyz

DRAIN_S = 5.0  # the checks below take under 1 s on a quiet machine; the rest is margin for a loaded one


def _samples(url: str, name: str) -> list[float]:
    """Every sample of a metric family (--frontends: one series per process for irpe_ready; --workers: the
    answering worker's)."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return [float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + " ", name + "{"))]


def _says_draining(answer: httpx.Response) -> None:
    assert answer.json().get("detail") == "draining", answer.text


@pytest.mark.parametrize("layout", [("--frontends", "0"), ("--frontends", "2"), ("--workers", "2")],
                         ids=["one-process", "frontends-2", "workers-2"])
def test_sigterm_turns_readiness_503_first_and_keeps_serving_for_drain_s(tiny_artifact: Path,
                                                                          layout: tuple[str, str]):
    """During the drain: /readyz 503 "draining", /v2/health/ready 503, irpe_ready 0, and a new connection's
    /classify still 200; /healthz stays 200. Then the process exits 0 (one process: uvicorn re-raises the
    signal) no sooner than --drain-s after the signal."""
    server = start_server(tiny_artifact, "--drain-s", str(DRAIN_S), *layout)
    try:
        wait_every_front_end_ready(server.url)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        # each front end turns on its own signal; every new connection is still answered
        wait_for_readyz(server.url, 503, timeout=5, check=_says_draining, retry_errors=False)
        assert httpx.get(server.url + "/v2/health/ready", timeout=5).status_code == 503
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
        assert 0 in _samples(server.url, "irpe_ready")  # the draining process's series
        with httpx.Client(timeout=10) as fresh:  # a new connection is still accepted and answered
            answer = fresh.post(server.url + "/classify", content=encode(image()),
                                headers={"content-type": "image/png"})
        assert answer.status_code == 200, answer.text
        assert time.monotonic() - signalled < DRAIN_S, "the checks above took longer than the drain"
        code = server.proc.wait(DRAIN_S + 30)
        assert time.monotonic() - signalled >= DRAIN_S - 0.2  # the drain is waited out (0.2 s: timer rounding)
    finally:
        server.stop()
        server.log.unlink(missing_ok=True)
    assert code in (0, -signal.SIGTERM), server.output()
