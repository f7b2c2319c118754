"""Against a real ``irpe serve``: a request that holds a model version while that version is
unloaded, swapped or removed from the repository never answers with another model's logits.

A ``/v2`` request for ``beta`` is routed (and holds beta's version) as soon as its headers arrive; its body is
sent only after the unload has given up waiting for it (``--timeout-s`` 0.4 s), so it reaches inference on
a retired version. ``alpha`` (the default model) always puts class 1 on top, ``beta`` class 8 (9 after a
swap): a 200 for beta whose logits put class 1 on top is the bug."""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from tests.reliability.procs import ServerProcess, serving
from tests.server.helpers import CROP
from tests.server.hosting.test_local import constant_artifact

TRIALS = 6  # races per test, each checked
MAX_TRIALS = 18  # more, while no racing request was answered 200 or none was refused
BODY = json.dumps({"inputs": [{"name": "images", "shape": [1, 3, CROP, CROP], "datatype": "FP32",
                               "data": [0.0] * (3 * CROP * CROP)}]}).encode()
BETA_TOPS = {8, 9}  # beta, and beta after a swap


def _repo(root: Path) -> Path:
    constant_artifact(root / "alpha" / "1", 1, "alpha")
    constant_artifact(root / "beta" / "1", 8, "beta")
    return root


class HeldRequest:
    """``POST /v2/models/{model}/infer`` whose headers and half of the body are sent now, the rest later."""

    def __init__(self, url: str, model: str):
        u = urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=30)
        head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n").encode()
        self.sock.sendall(head + BODY[:len(BODY) // 2])

    def finish(self) -> tuple[int, dict]:
        """Send the rest; (status, JSON body)."""
        self.sock.sendall(BODY[len(BODY) // 2:])
        chunks, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline and (chunk := self.sock.recv(65536)):
            chunks.append(chunk)
        self.sock.close()
        raw = b"".join(chunks)
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body) if body else {}


def _check(status: int, body: dict, outcomes: list[tuple[int, int]]) -> None:
    """No 200 that names beta carries another model's logits."""
    if status != 200:
        assert status in (503, 404, 504), (status, body)
        outcomes.append((status, -1))
        return
    logits = np.asarray(body["outputs"][0]["data"], np.float32)
    outcomes.append((status, int(logits.argmax())))
    assert body["model_name"] == "beta" and int(logits.argmax()) in BETA_TOPS, body


def _wait_routing(url: str, model: str, routed: bool, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (httpx.get(f"{url}/v2/models/{model}/ready", timeout=5).status_code == 200) == routed:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{model} still {'not ' if routed else ''}routed after {seconds}s")


def _race(url: str, retire: Callable[[], None], restore: Callable[[], None], outcomes: list[tuple[int, int]]) -> None:
    """One trial: beta held mid-body, ``retire`` (returns once the retire stopped waiting), plain requests
    for beta racing it, then the held body; then ``restore``."""
    held = HeldRequest(url, "beta")
    time.sleep(0.05)  # routed: the server has the headers
    racing: list[tuple[int, dict]] = []
    racer_ready = threading.Event()

    def race() -> None:
        with httpx.Client(timeout=30) as client:  # one client: requests follow each other closely
            racer_ready.set()
            for _ in range(10):
                r = client.post(f"{url}/v2/models/beta/infer", content=BODY)
                racing.append((r.status_code, r.json()))

    racer = threading.Thread(target=race)
    racer.start()
    racer_ready.wait(10)
    retire()
    _check(*held.finish(), outcomes)
    racer.join(60)
    for status, body in racing:
        _check(status, body, outcomes)
    restore()


def _races(url: str, retire: Callable[[], None], restore: Callable[[], None]) -> list[tuple[int, int]]:
    """``TRIALS`` races, and more (``MAX_TRIALS`` in all) until the race happened: a request for beta was
    answered 200 and one was refused. Returns every (status, top class)."""
    outcomes: list[tuple[int, int]] = []
    for trial in range(MAX_TRIALS):
        if trial >= TRIALS and _raced(outcomes):
            break
        _race(url, retire, restore, outcomes)
    assert _raced(outcomes), f"the race never happened in {MAX_TRIALS} trials (status, top class): {outcomes}"
    return outcomes


def _raced(outcomes: list[tuple[int, int]]) -> bool:
    """Whether a request for beta was answered 200 and another was refused."""
    statuses = {status for status, _ in outcomes}
    return 200 in statuses and bool(statuses - {200})


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = _repo(tmp_path_factory.mktemp("f2"))
    with serving(root, "--model-control", "explicit", "--load-model", "*", "--default-model", "alpha",
                 "--timeout-s", "0.4", "--max-wait-ms", "1") as s:
        yield s, root


def _control(url: str, model: str, what: str) -> None:
    r = httpx.post(f"{url}/v2/repository/models/{model}/{what}", json={}, timeout=30)
    assert r.status_code == 200, r.text


def test_unload_never_answers_with_another_models_logits(explicit: tuple[ServerProcess, Path]) -> None:
    server, _ = explicit
    _races(server.url, lambda: _control(server.url, "beta", "unload"), lambda: _control(server.url, "beta", "load"))


def test_swap_never_answers_with_another_models_logits(explicit: tuple[ServerProcess, Path]) -> None:
    server, root = explicit
    tops = itertools.cycle([9, 8])

    def swap() -> None:
        constant_artifact(root / "beta" / "1", next(tops), "beta")  # rewritten in place
        _control(server.url, "beta", "load")

    outcomes = _races(server.url, swap, lambda: None)
    assert {top for status, top in outcomes if status == 200} == BETA_TOPS, outcomes  # both versions answered


def test_poll_removal_never_answers_with_another_models_logits(tmp_path: Path) -> None:
    root = _repo(tmp_path / "repo")
    with serving(root, "--model-control", "poll", "--poll-interval-s", "0.1", "--default-model", "alpha",
                 "--timeout-s", "0.4", "--max-wait-ms", "1") as server:
        def remove() -> None:
            shutil.rmtree(root / "beta")
            _wait_routing(server.url, "beta", routed=False)
            time.sleep(0.6)  # the retire has stopped waiting for the held request

        def restore() -> None:
            constant_artifact(root / "beta" / "1", 8, "beta")
            _wait_routing(server.url, "beta", routed=True)

        _races(server.url, remove, restore)


def test_a_failed_rewrite_in_place_shows_in_the_index(explicit: tuple[ServerProcess, Path]) -> None:
    """beta version 1 rewritten in place with a model.onnx its model.json does not vouch for: the load is a
    400, the old version keeps serving, and the index shows it READY with the failed reload's reason."""
    server, root = explicit

    def beta_row() -> dict:
        rows = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
        return next(r for r in rows if r["name"] == "beta")

    (root / "beta" / "1" / "model.onnx").write_bytes(b"not the model model.json names")
    r = httpx.post(f"{server.url}/v2/repository/models/beta/load", json={}, timeout=30)
    assert r.status_code == 400 and "sha256" in r.text, r.text
    row = beta_row()
    assert row["state"] == "READY" and "failed to load" in row["reason"] and "keeps serving" in row["reason"], row
    answer = httpx.post(f"{server.url}/v2/models/beta/infer", content=BODY, timeout=30)
    assert answer.status_code == 200 and np.argmax(answer.json()["outputs"][0]["data"]) in BETA_TOPS
    constant_artifact(root / "beta" / "1", 8, "beta")
    _control(server.url, "beta", "load")
    assert beta_row() == {"name": "beta", "version": "1", "state": "READY"}  # no reason: Triton omits an empty one


def test_unload_with_front_ends_never_answers_with_another_models_logits(tmp_path: Path) -> None:
    """The same race with ``--frontends 1``: the front end holds its copy of beta's version, the engine
    process retires it."""
    root = _repo(tmp_path / "repo")
    with serving(root, "--model-control", "explicit", "--load-model", "*", "--default-model", "alpha",
                 "--timeout-s", "0.4", "--max-wait-ms", "1", "--frontends", "1") as server:
        _races(server.url, lambda: _control(server.url, "beta", "unload"),
               lambda: _control(server.url, "beta", "load"))
