"""``irpe serve --frontends 2``: two HTTP processes + one engine process, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import numpy as np
import pytest

from irpe.bench.frontend import tree_pids
from tests.server.helpers import (
    CROP,
    announced_url,
    connections_spread,
    encode,
    expected_logits,
    image,
    listeners,
    make_slow_artifact,
    running_server,
    wait_ready,
)

REPO = Path(__file__).resolve().parents[3]


def _serve(artifact: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """The supervisor on --port 0, and the URL it announces (the port the kernel picked)."""
    proc = subprocess.Popen([sys.executable, "-m", "irpe.cli", "serve", str(artifact), "--port", "0",
                             "--log-level", "warning", "--frontends", "2", *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, announced_url(proc)


def _children(proc: subprocess.Popen) -> dict[str, int]:
    """Process name (``irpe-engine``, ``irpe-frontend0``, ...) -> pid, under the supervisor."""
    out = {}
    for pid in tree_pids(proc.pid)[1:]:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("irpe-"):  # not multiprocessing's resource tracker
            out[name] = pid
    return out


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            for pid in reversed(tree_pids(proc.pid)):
                os.kill(pid, signal.SIGKILL)
            proc.wait()
    return proc.stdout.read() if proc.stdout else ""


@pytest.fixture(scope="module")
def frontends(tiny_artifact: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    proc, url = _serve(tiny_artifact, "--max-queue", "4")
    try:
        wait_ready(url, timeout=60)
        yield url, proc
    finally:
        _stop(proc)


def _classify(url: str, data: bytes, timeout: float = 30) -> httpx.Response:
    return httpx.post(url + "/classify?top_k=5", files={"file": ("i.png", data, "image/png")}, timeout=timeout)


def test_same_answers_as_one_process(tiny_artifact: Path, frontends: tuple[str, subprocess.Popen]) -> None:
    url, proc = frontends
    deadline = time.monotonic() + 60  # ready once one front end answers; the second may still be starting
    while sorted(_children(proc)) != ["irpe-engine", "irpe-frontend0", "irpe-frontend1"]:
        assert time.monotonic() < deadline, _children(proc)
        time.sleep(0.05)
    blobs = [encode(image((80 + 7 * i, 60 + 5 * i), seed=i)) for i in range(4)]
    two = [[_classify(url, b) for b in blobs] for _ in range(3)]  # several connections: both front ends
    with running_server(tiny_artifact) as single:
        one = [_classify(single, b) for b in blobs]
    for answers in two:
        for a, b in zip(answers, one, strict=True):
            assert a.status_code == b.status_code == 200
            pa, pb = a.json()["predictions"][0], b.json()["predictions"][0]
            assert [p["index"] for p in pa] == [p["index"] for p in pb]
            np.testing.assert_allclose([p["probability"] for p in pa], [p["probability"] for p in pb], rtol=1e-5)
    many = httpx.post(url + "/classify?top_k=2", files=[("file", ("a.png", blobs[0], "image/png")),
                                                        ("file", ("b.png", blobs[1], "image/png"))], timeout=30)
    assert [p[0]["index"] for p in many.json()["predictions"]] == \
        [one[0].json()["predictions"][0][0]["index"], one[1].json()["predictions"][0][0]["index"]]


def test_connections_spread_over_the_front_ends(frontends: tuple[str, subprocess.Popen]) -> None:
    """Each front end listens on its own socket of the port (SO_REUSEPORT): connections opened at once spread
    over them; on one shared socket the first front end to wake accepted all of them."""
    url, proc = frontends
    fronts = [pid for name, pid in _children(proc).items() if name.startswith("irpe-frontend")]
    port = int(url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30  # the supervisor announces once the first front end listens
    while listeners(port) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(fronts) == 2 and listeners(port) == 2  # the front ends' sockets; the supervisor's does not listen
    held = connections_spread(fronts, port, 16)
    assert sum(held.values()) == 16 and min(held.values()) >= 1, held


def test_v2_infer_through_the_engine_process(frontends: tuple[str, subprocess.Popen]) -> None:
    url, _ = frontends
    x = np.random.default_rng(0).standard_normal((2, 3, CROP, CROP)).astype(np.float32)
    body = {"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = httpx.post(url + "/v2/models/tiny-mean/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["outputs"][0]["data"]).reshape(2, -1), expected_logits(x),
                               rtol=1e-4, atol=1e-4)


def test_metrics_add_up_every_process(frontends: tuple[str, subprocess.Popen]) -> None:
    url, _ = frontends
    before = _count(httpx.get(url + "/metrics").text, "irpe_images_total")
    with ThreadPoolExecutor(6) as ex:
        codes = list(ex.map(lambda i: _classify(url, encode(image(seed=i))).status_code, range(12)))
    text = httpx.get(url + "/metrics").text
    assert _count(text, "irpe_images_total") - before == codes.count(200) > 0
    assert _count(text, "irpe_batch_size_count") >= 1  # written by the engine process
    assert text.count("irpe_ready{") == 3  # one per process


def test_v2_stats_count_every_front_end(frontends: tuple[str, subprocess.Popen]) -> None:
    """/v2 statistics come from the engine's batcher: every front end's requests and the batches (a front
    end alone runs no batch, so batch_stats would be empty)."""
    url, _ = frontends

    def stats() -> dict:
        with httpx.Client(timeout=10) as c:  # a new connection: any front end may answer
            return c.get(url + "/v2/models/tiny-mean/stats").json()["model_stats"][0]

    before = stats()
    with ThreadPoolExecutor(6) as ex:
        codes = list(ex.map(lambda i: _classify(url, encode(image(seed=i))).status_code, range(12)))
    after = stats()
    ok = codes.count(200)
    assert after["name"] == "tiny-mean" and after["version"] == "1"
    assert after["inference_count"] - before["inference_count"] == ok > 0
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == ok
    assert after["execution_count"] > before["execution_count"] and after["batch_stats"]


def _count(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_overload_gives_only_200_and_503(tmp_path: Path) -> None:
    """A slow engine (>= 1 s per call) and --max-queue 4: 24 clients get only 200s and 503s, some of each."""
    proc, url = _serve(make_slow_artifact(tmp_path / "slow"), "--max-queue", "4")
    try:
        wait_ready(url, timeout=60)
        with ThreadPoolExecutor(24) as ex:
            answers = list(ex.map(lambda i: _classify(url, encode(image(seed=i)), timeout=120), range(24)))
    finally:
        _stop(proc)
    codes = {r.status_code for r in answers}
    assert codes <= {200, 503} and 200 in codes and 503 in codes, codes
    busy = [r for r in answers if r.status_code == 503]
    assert all(int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "queue_full" for r in busy)


def test_a_killed_front_end_is_restarted(frontends: tuple[str, subprocess.Popen]) -> None:
    url, proc = frontends
    old = _children(proc)
    os.kill(old["irpe-frontend0"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = _children(proc)
        if now.get("irpe-frontend0") not in (None, old["irpe-frontend0"]):
            break
        time.sleep(0.1)
    assert now["irpe-frontend0"] != old["irpe-frontend0"] and now["irpe-engine"] == old["irpe-engine"]
    wait_ready(url, timeout=30)
    codes: list[int] = []  # until 10 answers in a row are 200: only 503 (the new one warming up) before
    while codes[-10:] != [200] * 10 and time.monotonic() < deadline + 30:
        codes.append(_classify(url, encode(image(seed=len(codes)))).status_code)
    assert codes[-10:] == [200] * 10 and set(codes) <= {200, 503} and proc.poll() is None


def test_sigterm_loses_nothing(tiny_artifact: Path) -> None:
    proc, url = _serve(tiny_artifact)
    try:
        wait_ready(url, timeout=60)
        big = encode(image((1600, 1200), seed=5), "JPEG", quality=95)
        clients = [httpx.Client(base_url=url, timeout=30) for _ in range(16)]
        for c in clients:  # connections accepted before SIGTERM (later ones are refused, as by one process)
            assert c.get("/healthz").status_code == 200
        def post(c: httpx.Client) -> tuple[httpx.Response, float]:
            return c.post("/classify", files={"file": ("i.jpg", big, "image/jpeg")}), time.monotonic()

        with ThreadPoolExecutor(16) as ex:
            futures = [ex.submit(post, c) for c in clients]
            wait(futures, return_when=FIRST_COMPLETED)  # the others are being decoded (one thread per process)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            answers, finished = zip(*(f.result() for f in futures), strict=True)
        code = proc.wait(60)
    finally:
        output = _stop(proc)
    assert [r.status_code for r in answers] == [200] * 16, output
    # many were still in flight when the signal came (7 of 16 on a quiet 2-core VM, more under load)
    assert sum(t > signalled for t in finished) >= 4
    assert code == 0, output


def test_a_dead_engine_fails_readyz_and_the_server_exits_non_zero(tiny_artifact: Path) -> None:
    proc, url = _serve(tiny_artifact)
    try:
        wait_ready(url, timeout=60)
        os.kill(_children(proc)["irpe-engine"], signal.SIGKILL)
        time.sleep(0.2)
        try:
            ready = httpx.get(url + "/readyz", timeout=5).status_code
        except httpx.HTTPError:
            ready = 0  # already gone: refused
        code = proc.wait(40)
    finally:
        output = _stop(proc)
    assert ready in (0, 503)
    assert code == 1 and "the engine process exited" in output, output
    assert proc.poll() is not None and not _alive_children(proc)


def _alive_children(proc: subprocess.Popen) -> list[int]:
    return [pid for pid in tree_pids(proc.pid)[1:] if Path(f"/proc/{pid}").exists()]


def test_a_model_that_cannot_load_is_one_line_and_nothing_announced(tiny_artifact: Path) -> None:
    """The engine's load error is the only line (no "listening" line for a server that never serves), with
    the engine's exit code 3 and no process left behind."""
    proc = subprocess.Popen([sys.executable, "-m", "irpe.cli", "serve", str(tiny_artifact), "--port", "0",
                             "--grpc-port", "0", "--frontends", "2", "--device", "cuda"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 3, out
    assert len(lines) == 1 and "cannot load the model" in lines[0] and "--device cuda" in lines[0], lines
    assert not _alive_children(proc)


def test_stats_from_a_stalled_engine_do_not_stall_the_front_end(tiny_artifact: Path) -> None:
    """/v2 statistics ask the engine process (up to 2 s when it does not answer). Asked in a thread, the front
    end's other requests go on meanwhile; before, its event loop waited the 2 s (a liveness probe too)."""
    proc, url = _serve(tiny_artifact, "--frontends", "1")
    try:
        wait_ready(url, timeout=60)
        engine = _children(proc)["irpe-engine"]
        os.kill(engine, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(2) as ex:
                stats = ex.submit(lambda: httpx.get(url + "/v2/models/stats", timeout=30))
                metrics = ex.submit(lambda: httpx.get(url + "/metrics", timeout=30))
                time.sleep(0.3)  # both calls are waiting on the engine now
                start = time.monotonic()
                live = httpx.get(url + "/v2/health/live", timeout=30)
                waited = time.monotonic() - start
                answer, scrape = stats.result(timeout=30), metrics.result(timeout=30)
        finally:
            os.kill(engine, signal.SIGCONT)
        assert live.status_code == 200 and waited < 1.0, waited
        # this front end's own counters, not a 500 (before: the link's timeout error escaped)
        assert answer.status_code == 200 and answer.json()["model_stats"], answer.text
        assert scrape.status_code == 200 and "nv_inference_count" in scrape.text
    finally:
        _stop(proc)


def test_the_deadline_and_each_versions_queue_depth_through_the_engine_process(tmp_path: Path) -> None:
    """--timeout-s answers 504 for /v2 infer when the engine process is slower, and a version's queue depth
    counts only its own images (before: every version showed all the images this front end had in flight)."""
    for name in ("a", "b"):
        make_slow_artifact(tmp_path / "repo" / name / "1", matmuls=120)  # about 1.2 s a batch
    # --threads 2: no all-core solo session, whose warm-up would time 16 more runs of each engine
    proc, url = _serve(tmp_path / "repo", "--frontends", "1", "--timeout-s", "0.5", "--threads", "2",
                       "--default-model", "a")
    try:
        wait_ready(url, timeout=90)
        x = np.zeros((1, 3, CROP, CROP), np.float32)
        body = {"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        start = time.monotonic()
        r = httpx.post(url + "/v2/models/a/infer", json=body, timeout=30)
        assert r.status_code == 504 and "--timeout-s" in r.json()["error"], r.text
        assert time.monotonic() - start < 1.1
        with ThreadPoolExecutor(2) as ex:
            busy = [ex.submit(lambda: httpx.post(url + "/v2/models/a/infer", json=body, timeout=30))
                    for _ in range(2)]
            time.sleep(0.2)
            text = httpx.get(url + "/metrics", timeout=30).text
            assert [r.result(timeout=30).status_code for r in busy] == [504, 504]
        depth = {line.split('model="')[1].split('"')[0]: float(line.split()[-1])
                 for line in text.splitlines() if line.startswith("irpe_model_queue_depth{")}
        assert depth == {"a": 2.0, "b": 0.0}, depth
    finally:
        _stop(proc)
