"""``irpe.ray:app`` on a real local Ray cluster (a head and two worker nodes, all on 127.0.0.1): answers byte
for byte those of ``irpe serve`` on the same artifact, the API key on every route through Ray's HTTP proxy,
which limits hold behind the proxy, and a load that rides out autoscaling, a killed replica and a removed node
when the client retries. One cluster for the module (its start and first deployment take about 20 s here)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.reliability.procs import server_env, serving
from tests.server.helpers import encode, free_port, image
from tests.server.hosting.ray_cluster import RayServe, ray_serve, replica_pids, wait_for

pytest.importorskip("ray.serve", reason="the ray extra (pip install '.[ray]') is part of the suite's venv")

REPO = Path(__file__).resolve().parents[3]
KEY = "ray-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
MODEL = "deit_micro_patch4_32_ctx_product_shared_k"
# the fields that differ on every answer by design (scripts/record_answers.py masks the same); the rest of each
# body is compared byte for byte
VOLATILE = re.compile(rb'"(timing_ms|batch_size)":\s*([0-9.e+-]+|\{[^}]*\})')
FIGURES: dict[str, float] = {}  # measured here, printed at the end of the module (docs/deploy/ray.md)


@pytest.fixture(scope="module")
def rs() -> Iterator[RayServe]:
    with ray_serve(free_port()) as cluster:
        start = time.monotonic()
        cluster.deploy(model="digits", api_key=KEY, num_replicas="2", max_body_mb="1", header_timeout_s="1")
        FIGURES["deploy_2_replicas_s"] = round(time.monotonic() - start, 1)
        yield cluster
    print("\nRay Serve figures:", json.dumps(FIGURES))


def _requests() -> list[tuple[str, str, dict[str, str], bytes]]:
    """(method, path, headers, body) of the answers compared: /classify, /v2 inference (JSON and binary
    tensor), metadata, health, and errors a client meets."""
    png = encode(image(seed=3))
    tensor = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    infer = {"id": "r1", "inputs": [{"name": "images", "datatype": "FP32", "shape": [2, 3, 32, 32],
                                     "data": tensor.ravel().tolist()}]}
    header = json.dumps({"id": "r2", "inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 32, 32],
                                                 "parameters": {"binary_data_size": 12288}}],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": False}}]}).encode()
    binary = header + tensor[:1].tobytes()
    ct = {"content-type": "application/json"}
    return [("POST", "/classify", {"content-type": "image/png"}, png),
            ("POST", "/classify?top_k=3", {"content-type": "image/png"}, png),
            ("POST", f"/v2/models/{MODEL}/infer", ct, json.dumps(infer).encode()),
            ("POST", f"/v2/models/{MODEL}/infer", {"inference-header-content-length": str(len(header)),
                                                   "content-type": "application/octet-stream"}, binary),
            ("GET", f"/v2/models/{MODEL}", {}, b""), ("GET", f"/v2/models/{MODEL}/config", {}, b""),
            ("GET", "/v2", {}, b""), ("GET", "/v2/health/ready", {}, b""), ("GET", "/readyz", {}, b""),
            ("GET", "/healthz", {}, b""), ("GET", "/v2/models/nope", {}, b""),
            ("POST", "/classify", {"content-type": "image/png"}, b"not an image"),
            ("POST", "/classify", {"content-type": "image/png"}, png * (2 * 1024 * 1024 // len(png)))]


def _answers(url: str) -> list[tuple[int, bytes]]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return [(r.status_code, VOLATILE.sub(rb'"\1":_', r.content)) for method, path, headers, body in _requests()
                for r in [client.request(method, path, headers={**AUTH, **headers}, content=body)]]


def test_answers_are_byte_identical_to_irpe_serve(rs: RayServe):
    """Every answer (status and body bytes, but the timings and the batch a request shared) through Ray's proxy
    is the one ``irpe serve`` gives on the same artifact and settings; /metrics has irpe's series (one
    replica's)."""
    with serving("digits", "--frontends", "0", "--max-body-mb", "1",  # type: ignore[arg-type]
                 env=server_env(IRPE_API_KEY=KEY)) as direct:
        expected = _answers(direct.url)
    got = _answers(rs.url)
    assert [s for s, _ in got][:10] == [200] * 10 and all(s >= 400 for s, _ in got[10:])
    for (method, path, _, _), want, have in zip(_requests(), expected, got, strict=True):
        assert have == want, f"{method} {path}: Ray answered {have[0]} {have[1][:200]!r}, irpe serve {want[0]} " \
                             f"{want[1][:200]!r}"
    metrics = httpx.get(rs.url + "/metrics", headers=AUTH, timeout=10)
    assert metrics.status_code == 200 and "irpe_requests_total" in metrics.text


def _routes(rs: RayServe) -> list[tuple[str, str]]:
    """Every route of the app (from its OpenAPI document, read with the key) with a sample path."""
    spec = httpx.get(rs.url + "/openapi.json", headers=AUTH, timeout=10).json()
    out = []
    for path, methods in spec["paths"].items():
        sample = path.replace("{model_name}", MODEL).replace("{name}", MODEL).replace("{version}", "1")
        sample = sample.replace("{region_name}", "r").replace("{model_version}", "1")
        out += [(m.upper(), sample) for m in methods]
    return out + [("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/static/index.js"), ("GET", "/")]


def test_api_key_holds_on_every_route_through_ray(rs: RayServe):
    """401 without the key (and with a wrong one) on every route but the health checks, as ``irpe serve``."""
    routes = _routes(rs)
    assert len(routes) > 20
    health = {"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"}
    with httpx.Client(base_url=rs.url, timeout=10) as client:
        for method, path in routes:
            for headers in ({}, {"authorization": "Bearer wrong"}):
                r = client.request(method, path, headers=headers, content=b"{}" if method == "POST" else None)
                if path in health:
                    assert r.status_code == 200, (method, path)
                else:
                    assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
                    assert r.headers.get("www-authenticate") == "Bearer"


def _raw(url: str, data: bytes, wait: float = 0.0) -> bytes:
    """Send raw bytes to the proxy, optionally stall ``wait`` seconds, and read what comes back."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        time.sleep(wait)
        s.settimeout(max(1.0, wait))
        try:
            return s.recv(4096)
        except TimeoutError:
            return b""


def test_which_limits_hold_behind_ray_proxy(rs: RayServe):
    """irpe's limits in the app hold through Ray (body size 413, and an unauthenticated large body is refused
    401 before its end is read); the connection-level ones are Ray's proxy's: a head over irpe's 64 KB is
    refused by Ray's uvicorn (431) only past its own limit, and an incomplete head is not timed out at irpe's
    ``header_timeout_s`` (1 s here: irpe serve answers 408 then; measured and printed, docs/deploy/ray.md)."""
    big = b"x" * (2 * 1024 * 1024)
    r = httpx.post(rs.url + "/classify", headers={**AUTH, "content-type": "image/png"}, content=big, timeout=30)
    assert r.status_code == 413
    start = time.monotonic()
    r = httpx.post(rs.url + "/classify", headers={"content-type": "image/png"}, content=big, timeout=30)
    assert r.status_code == 401
    FIGURES["unauthenticated_2mb_body_401_s"] = round(time.monotonic() - start, 2)
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (80 * 1024) + b"\r\n\r\n"
    status = _raw(rs.url, head).split(b"\r\n", 1)[0]
    FIGURES["head_80kb_status"] = float(status.split()[1]) if len(status.split()) > 1 else 0.0
    assert status.startswith(b"HTTP/1.1 "), status  # Ray's proxy answers (irpe serve: 431 past --max-header-kb)
    stalled = _raw(rs.url, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", wait=3.0)
    FIGURES["incomplete_head_answered_within_3s"] = float(bool(stalled))
    assert not stalled.startswith(b"HTTP/1.1 408"), "Ray's proxy now times a head out: update docs/deploy/ray.md"


class Load:
    """``threads`` clients posting /classify in a loop, each request retried up to ``retries`` times."""

    def __init__(self, url: str, threads: int, retries: int = 6):
        self.url, self.retries = url, retries
        self.sent = self.first_failures = self.lost = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.png = encode(image(seed=5))
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _once(self, client: httpx.Client) -> bool:
        try:
            r = client.post("/classify", content=self.png, headers={**AUTH, "content-type": "image/png"})
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                ok = self._once(client)
                tries = 1
                with self.lock:
                    self.sent += 1
                    self.first_failures += not ok
                while not ok and tries < self.retries:
                    time.sleep(0.25 * tries)
                    ok, tries = self._once(client), tries + 1
                if not ok:
                    with self.lock:
                        self.lost += 1

    def snapshot(self) -> tuple[int, int, int]:
        with self.lock:
            return self.sent, self.first_failures, self.lost


def test_autoscaling_replica_loss_and_node_removal_lose_nothing_on_retry(rs: RayServe):
    """Autoscaling on ongoing requests (target 2 a replica here): load takes the deployment from 1 to 3
    replicas; a replica killed with SIGKILL and a worker node removed cost a few failed requests, each answered
    on the client's retry, and Ray brings the count back; idle, it scales back to 1. Times have a wide margin
    (60 s against the few seconds measured): the 2 cores are shared with the rest of the suite."""
    rs.deploy(model="digits", api_key=KEY, min_replicas="1", max_replicas="3", target_ongoing_requests="2",
              upscale_delay_s="1", downscale_delay_s="4", look_back_period_s="2",
              health_check_period_s="1", max_batch="4")
    wait_for(lambda: rs.running() == 1, 60, "one replica before the load")
    with Load(rs.url, threads=12) as load:
        FIGURES["autoscale_1_to_3_s"] = round(wait_for(lambda: rs.running() == 3, 90, "3 replicas under load"), 1)
        FIGURES.update(_kill_one_replica(rs, load))
        FIGURES.update(_remove_a_node(rs, load))
        sent, first_failures, lost = load.snapshot()
    FIGURES.update(requests=sent, failed_first_try=first_failures, lost_after_retry=lost)
    assert sent > 50 and lost == 0, FIGURES
    FIGURES["autoscale_down_to_1_s"] = round(wait_for(lambda: rs.running() == 1, 90, "back to 1 replica"), 1)


def _kill_one_replica(rs: RayServe, load: Load) -> dict[str, float]:
    """SIGKILL one replica process under load; seconds until 3 run again, and the first-try failures it cost."""
    pids = replica_pids()
    assert len(pids) == 3, pids
    before = load.snapshot()[1]
    start = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    wait_for(lambda: pids[0] not in replica_pids(), 30, "the killed replica gone")
    wait_for(lambda: rs.running() == 3 and len(replica_pids()) == 3, 60, "a replacement replica")
    replaced = time.monotonic() - start
    time.sleep(2)  # requests routed to the dead replica have failed by now
    return {"replica_replaced_s": round(replaced, 1),
            "failed_first_try_replica_kill": load.snapshot()[1] - before}


def _remove_a_node(rs: RayServe, load: Load) -> dict[str, float]:
    """Remove a worker node (its replica with it) under load, then add one; replicas back to 3."""
    before = load.snapshot()[1]
    start = time.monotonic()
    rs.remove_worker()
    wait_for(lambda: len(replica_pids()) < 3 or rs.running() < 3, 30, "the node's replica gone")
    time.sleep(2)
    failed = load.snapshot()[1] - before
    rs.add_worker()
    added = time.monotonic()
    wait_for(lambda: rs.running() == 3, 90, "3 replicas after a node came back")
    return {"failed_first_try_node_removal": failed, "node_removed_to_3_replicas_s": round(time.monotonic() - start, 1),
            "node_added_to_3_replicas_s": round(time.monotonic() - added, 1)}


def test_serve_config_is_valid_and_its_defaults_suit_one_replica_per_gpu():
    """deploy/ray/serve.yaml passes Ray Serve's config schema; its arguments build the application; on cuda a
    replica takes one GPU, targets two batches in flight and admits four (no cluster needed). Checked in a child
    process: building the application imports tritonclient.grpc's messages, which the kserve SDK's tests in the
    same pytest process cannot share."""
    check = "from tests.server.hosting.test_ray_serve import check_serve_config; check_serve_config()"
    out = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


def check_serve_config() -> None:
    """The assertions of the test above (run in a child process)."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from irpe.server.config import Settings
    from irpe.server.hosting.ray_serve import SERVICER_FUNCTIONS, build_app, deployment_options, split_args

    config = yaml.safe_load((REPO / "deploy" / "ray" / "serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    assert schema.http_options.host == "127.0.0.1" and schema.grpc_options.grpc_servicer_functions == \
        SERVICER_FUNCTIONS
    args = {**schema.applications[0].args, "model": "digits"}
    assert build_app(args) is not None
    env, ray_args = split_args(args)
    options = deployment_options(Settings.from_env(env), ray_args)
    assert options["ray_actor_options"]["num_gpus"] == 1 and options["max_ongoing_requests"] == 128
    assert options["autoscaling_config"]["target_ongoing_requests"] == 64
    cpu = deployment_options(Settings.from_env({}), {})
    assert cpu["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0} and cpu["max_ongoing_requests"] == 16
    assert cpu["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8.0,
                                         "upscale_delay_s": 10.0, "downscale_delay_s": 300.0}


@pytest.mark.parametrize(("args", "words"), [
    ({"port": "8000"}, "leave port out"), ({"frontends": "2"}, "leave frontends out"),
    ({"nope": "1"}, "not an irpe setting"), ({"max_batch": "x"}, "IRPE_MAX_BATCH='x'"),
    ({"model_control": "explicit"}, "reaches one replica"), ({"allow_client_shm": "1"}, "leave it off")])
def test_arguments_that_cannot_hold_under_ray_are_one_line_naming_the_fix(args, words):
    from irpe.server.hosting.ray_serve import build_app

    with pytest.raises(ValueError, match=re.escape(words)) as e:
        build_app({"model": "digits", **args})
    assert "\n" not in str(e.value)


def test_a_replica_behind_an_exposed_proxy_needs_the_key(monkeypatch: pytest.MonkeyPatch):
    """As ``irpe serve`` on a non-loopback address: no key, no replica (the gRPC proxy's ``::`` counts as
    exposed); the key from the builder or from the node's environment."""
    from irpe.server.hosting.ray_serve import replica_settings

    monkeypatch.delenv("IRPE_API_KEY", raising=False)
    monkeypatch.delenv("IRPE_INSECURE", raising=False)
    with pytest.raises(ValueError, match="refusing to listen on ::"):
        replica_settings({}, "::")
    assert replica_settings({"IRPE_API_KEY": "k"}, "::").api_key == "k"
    assert replica_settings({}, "127.0.0.1").host == "127.0.0.1"
