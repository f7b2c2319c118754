"""The KServe v2 gRPC service through Ray Serve's gRPC proxy: the same unmodified tritonclient.grpc calls to
``irpe serve --grpc-port`` and to ``irpe.ray:app`` get the same answers, byte for byte, and the API key holds.

Ray's gRPC proxy listens on every address (``[::]``; Ray offers no option to narrow it), so the scenario
(tests/server/hosting/ray_grpc_scenario.py: both servers, a one-worker Ray cluster and the clients) runs in a
network namespace of its own with only a loopback interface (``unshare -n``, as root)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.helpers import free_port
from tests.server.hosting.ray_cluster import ray_pids

pytest.importorskip("ray.serve", reason="the ray extra (pip install '.[ray]') is part of the suite's venv")
SCENARIO = Path(__file__).with_name("ray_grpc_scenario.py")
REPO = Path(__file__).resolve().parents[3]
CALLS = ("live", "ready", "model_ready", "server_metadata", "model_metadata", "model_config", "infer",
         "unknown_model", "statistics", "stream")
KEYLESS = ("live", "ready")  # as over HTTP's health routes: no key needed


@pytest.fixture(scope="module")
def answers() -> dict:
    assert shutil.which("unshare"), "util-linux's unshare is needed (Debian: apt-get install util-linux)"
    ports = [str(free_port()) for _ in range(3)]
    cmd = ["unshare", "-n", sys.executable, str(SCENARIO), *ports]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert out.returncode == 0 and line, f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert not ray_pids(), "Ray processes survived the scenario"
    return json.loads(line.removeprefix("RESULT "))


def test_tritonclient_grpc_calls_answer_as_irpe_serve(answers: dict):
    """Each call's answer (the serialized response message, or status and message) is the same through Ray's
    gRPC proxy as from ``irpe serve --grpc-port``: inference, metadata, config, an unknown model's error,
    and two requests on one ModelStreamInfer stream."""
    direct, ray = answers["direct"]["key"], answers["ray"]["key"]
    assert direct["infer"] and not isinstance(direct["infer"], list), direct["infer"]
    assert direct["unknown_model"][0] == "StatusCode.NOT_FOUND"
    for call in CALLS:
        assert ray[call] == direct[call], f"{call}: Ray {ray[call]!r} != irpe serve {direct[call]!r}"


def test_api_key_holds_through_ray_grpc_proxy(answers: dict):
    """Without the key every call but ServerLive / ServerReady ends UNAUTHENTICATED through Ray, as it does
    from ``irpe serve``."""
    direct, ray = answers["direct"]["nokey"], answers["ray"]["nokey"]
    for call in CALLS:
        if call in KEYLESS:
            assert ray[call] is True and direct[call] is True
        elif call == "stream":
            assert all("UNAUTHENTICATED" in a or "Unauthenticated" in a for a in ray[call]), ray[call]
        else:
            assert ray[call][0] == "StatusCode.UNAUTHENTICATED" == direct[call][0], (call, ray[call], direct[call])
