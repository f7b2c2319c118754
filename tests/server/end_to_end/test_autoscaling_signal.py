"""The autoscaling signal, ``irpe_ongoing_requests`` (docs/deploy/scale-out.md): inference requests received and
not yet answered, HTTP and gRPC alike; it rises under load and falls back to 0 after, in one process and summed
over ``--frontends`` front ends."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.reliability.procs import REPO, serving
from tests.server.helpers import encode, free_port, image, make_slow_artifact, wait_every_front_end_ready

CLIENTS = 6
FLAGS = ("--max-batch", "1", "--inference-threads", "1")  # one image per engine call: requests wait their turn


def ongoing(url: str) -> float:
    """The one ``irpe_ongoing_requests`` sample of /metrics."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("irpe_ongoing_requests ")))


@pytest.mark.parametrize("frontends", ["0", "2"])
def test_ongoing_requests_rise_under_load_and_fall_after(tmp_path: Path, frontends: str) -> None:
    """Six clients at once on a slow engine that takes one image per call: the gauge reaches at least 4 while
    they wait (two may already be answered by the time it is read) and is 0 once every answer is back."""
    slow = make_slow_artifact(tmp_path / "slow", matmuls=30)
    with serving(slow, *FLAGS, "--frontends", frontends) as server:
        wait_every_front_end_ready(server.url)
        assert ongoing(server.url) == 0
        statuses: list[int] = []
        post = {"content": encode(image()), "headers": {"content-type": "image/png"}, "timeout": 60}
        clients = [threading.Thread(target=lambda: statuses.append(httpx.post(server.url + "/classify",
                                                                              **post).status_code))
                   for _ in range(CLIENTS)]
        for client in clients:
            client.start()
        peak, deadline = 0.0, time.monotonic() + 30
        while any(c.is_alive() for c in clients) and time.monotonic() < deadline:
            peak = max(peak, ongoing(server.url))
            time.sleep(0.02)
        for client in clients:
            client.join(60)
        after = ongoing(server.url)
    assert statuses == [200] * CLIENTS
    assert peak >= 4, f"irpe_ongoing_requests peaked at {peak} with {CLIENTS} requests waiting"
    assert after == 0


def test_grpc_model_infer_counts_as_ongoing(tmp_path: Path) -> None:
    """Six ModelInfer calls at once (tritonclient.grpc.aio, in a child process: tests/server/grpc_client.py's
    burst) on the same slow engine: the gauge reaches at least 4 and is 0 once they are answered."""
    slow = make_slow_artifact(tmp_path / "slow", matmuls=30)
    port = free_port()
    with serving(slow, *FLAGS, "--grpc-port", str(port)) as server:
        burst = subprocess.Popen([sys.executable, "-m", "tests.server.grpc_client", "burst", f"127.0.0.1:{port}", "",
                                  str(CLIENTS)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        peak, deadline = 0.0, time.monotonic() + 60
        while burst.poll() is None and time.monotonic() < deadline:
            peak = max(peak, ongoing(server.url))
            time.sleep(0.02)
        out, _ = burst.communicate(timeout=60)
        after = ongoing(server.url)
    assert json.loads(out)["statuses"] == ["OK"] * CLIENTS
    assert peak >= 4, f"irpe_ongoing_requests peaked at {peak} with {CLIENTS} calls waiting"
    assert after == 0
