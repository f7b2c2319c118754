"""The real NVIDIA tritonserver 2.51 (bench/tritonserver.py) and ``irpe serve`` on the same artifact, side by side on
127.0.0.1, get the same HTTP requests: metadata, config, statistics, readiness, repository, inference (plain,
classification, shared memory), errors, the extensions' routes and the metrics. Every answer must match, but for the
differences listed in ``DELIBERATE`` (also in docs/serving.md, "Differences from Triton") and ``HARNESS`` (Triton
runs the model through its Python backend: the wheel carries no ONNX Runtime backend). Each listed difference is
asserted too, so the list cannot go stale.

``test_grpc`` sends the same RPCs to both over gRPC (in a child process: tests/server/grpc_parity_client.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from irpe.bench.tritonserver import TritonServer, TritonUnavailable
from tests.reliability.procs import ServerProcess, serving
from tests.server.helpers import client_shm_region, make_artifact

shm = pytest.importorskip("tritonclient.utils.shared_memory", reason="tritonclient is in the dev extra")
MODEL = "tiny-mean"
MAX_BATCH = 8
DELIBERATE = {
    "identity": "GET /v2 names irpe-deploy and its version",
    "no sequence": "the extension list lacks 'sequence' (no sequence batching)",
    "health body": "health and readiness answers carry a JSON body ({ready: ...}); Triton's 200 is empty",
    "malformed JSON": "malformed request JSON is 400 (Triton: 500, against the protocol's 400)",
    "data count": "'data' with the wrong number of values is 400 (Triton: 500)",
    "NaN": "NaN/Inf inputs are refused with 400 (Triton runs them)",
    "model list": "GET /v2/models lists the models (KServe's list; Triton: 404)",
    "metadata parameters": "model metadata adds 'parameters' (backend, precision)",
    "request id": "an answer always carries 'id' (the request id, also X-Request-Id); Triton only echoes one sent",
    "shm client errors": "a region past its file, of 0 bytes, with a bad key, or an output region too small is 400 "
                         "(Triton: 500)",
    "preferred batch": "preferred_batch_size lists the engine's batch sizes, the only ones the batcher runs",
    "split batches": "a request whose image count is not one of those sizes runs as several executions (3 = 2 + 1; "
                     "Triton: one)",
    "fill wait": "config parameters carry busy_fill_wait_us (how long a part batch waits while another runs)",
}
HARNESS = {"platform", "backend", "default_model_filename", "parameters"}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("parity"))


@pytest.fixture(scope="module")
def triton(artifact: Path) -> Iterator[TritonServer]:
    try:
        server = TritonServer(artifact, model_name=MODEL, max_batch=MAX_BATCH, instances=1, threads=1).start()
    except TritonUnavailable as e:
        pytest.skip(f"tritonserver unavailable: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def irpe(artifact: Path) -> Iterator[ServerProcess]:
    with serving(artifact, "--max-images", str(MAX_BATCH), "--inference-threads", "1", "--threads", "1",
                 "--allow-client-shm", "--max-wait-ms", "2", "--frontends", "0", "--log-level", "info",
                 "--grpc-port", "0") as proc:
        yield proc


@pytest.fixture(scope="module")
def both(triton: TritonServer, irpe: ServerProcess) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    with httpx.Client(base_url=f"http://{triton.http_url}", timeout=30) as t, \
            httpx.Client(base_url=irpe.url, timeout=30) as i:
        yield t, i


def _ask(c: httpx.Client, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    r = c.request(method, path, **kw)
    try:
        return r.status_code, r.json() if r.content else None
    except ValueError:
        return r.status_code, r.content


def _same_status(both: tuple[httpx.Client, httpx.Client], method: str, path: str, **kw: Any) -> tuple[Any, Any]:
    (ts, tb), (irs, ib) = (_ask(c, method, path, **kw) for c in both)
    assert ts == irs, f"{method} {path}: Triton {ts} {tb} vs irpe {irs} {ib}"
    if ts >= 400:
        assert set(tb) == set(ib) == {"error"}, (tb, ib)
    return tb, ib


def _images(n: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32), dtype=np.float32)


def _infer_body(x: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "images", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}],
            **extra}


def test_server_metadata_and_health(both: tuple[httpx.Client, httpx.Client]) -> None:
    t, i = _same_status(both, "GET", "/v2")
    assert (t["name"], i["name"]) == ("triton", "irpe-deploy")  # identity
    assert i["extensions"] == [e for e in t["extensions"] if e != "sequence"] and "sequence" in t["extensions"]
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready",
                 f"/v2/models/{MODEL}/versions/1/ready"):
        t, i = _same_status(both, "GET", path)
        assert t is None and list(i.values())[-1] is True  # health body
    for path in ("/v2/models/nope/ready", f"/v2/models/{MODEL}/versions/2/ready"):
        _same_status(both, "GET", path)  # 400 both


def test_model_metadata(both: tuple[httpx.Client, httpx.Client]) -> None:
    for path in (f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/versions/1"):
        t, i = _same_status(both, "GET", path)
        assert set(i) - set(t) == {"parameters"}  # metadata parameters
        assert {k: v for k, v in i.items() if k not in {"parameters", "platform"}} == \
            {k: v for k, v in t.items() if k != "platform"}
    for path in ("/v2/models/nope", f"/v2/models/{MODEL}/versions/2", "/v2/models/nope/config"):
        _same_status(both, "GET", path)  # 404 both
    (ts, _), (irs, ib) = (_ask(c, "GET", "/v2/models") for c in both)
    assert (ts, irs, ib) == (404, 200, {"models": [MODEL]})  # model list


def test_model_config(both: tuple[httpx.Client, httpx.Client]) -> None:
    t, i = _same_status(both, "GET", f"/v2/models/{MODEL}/config")
    assert set(t) == set(i), set(t) ^ set(i)
    differ = {k for k in t if t[k] != i[k]}
    assert differ == HARNESS | {"dynamic_batching"}, differ
    assert i["parameters"] == {"busy_fill_wait_us": {"string_value": "2000"}}  # fill wait
    td, idb = t["dynamic_batching"], i["dynamic_batching"]
    assert {k: v for k, v in td.items() if k != "preferred_batch_size"} == \
        {k: v for k, v in idb.items() if k != "preferred_batch_size"}
    assert (td["preferred_batch_size"], idb["preferred_batch_size"]) == ([MAX_BATCH], [1, 2, 4])  # preferred batch


def _stats(c: httpx.Client) -> dict[str, Any]:
    return c.get(f"/v2/models/{MODEL}/stats").json()["model_stats"][0]


def _counts(s: dict[str, Any]) -> dict[str, int]:
    out = {"inference_count": s["inference_count"], "execution_count": s["execution_count"]}
    out.update({k: v["count"] for k, v in s["inference_stats"].items()})
    out.update({f"batch{b['batch_size']}": b["compute_infer"]["count"] for b in s["batch_stats"]})
    return out


def test_inference_and_statistics(both: tuple[httpx.Client, httpx.Client]) -> None:
    before = [_counts(_stats(c)) for c in both]
    x = _images(2)
    t, i = _same_status(both, "POST", f"/v2/models/{MODEL}/infer", json=_infer_body(x))
    assert set(i) - set(t) == {"id"}  # request id
    assert [o["shape"] for o in t["outputs"]] == [o["shape"] for o in i["outputs"]] == [[2, 10]]
    np.testing.assert_allclose(i["outputs"][0]["data"], t["outputs"][0]["data"], rtol=1e-5, atol=1e-5)
    t, i = _same_status(both, "POST", f"/v2/models/{MODEL}/infer",
                        json=_infer_body(x[:1], id="r7", outputs=[{"name": "logits",
                                                                    "parameters": {"classification": 3}}]))
    assert set(t) == set(i) and t["id"] == i["id"] == "r7"
    (tc, ts_), (ic, is_) = _classes(t), _classes(i)
    assert tc == ic and np.allclose(ts_, is_, atol=1e-4), (t, i)
    delta = [_settled(c, b, 2) for c, b in zip(both, before, strict=True)]
    assert delta[0] == delta[1], f"Triton {delta[0]} vs irpe {delta[1]}"
    assert delta[1]["inference_count"] == 3 and delta[1]["queue"] == delta[1]["success"] == 2
    ts, irs = (_stats(c) for c in both)
    assert set(ts) == set(irs) and set(ts["inference_stats"]) == set(irs["inference_stats"])
    assert ts["response_stats"] == irs["response_stats"] == {}


def _settled(c: httpx.Client, before: dict[str, int], requests: int) -> dict[str, int]:
    """The statistics' change once ``requests`` more have counted (Triton counts just after answering)."""
    deadline = time.monotonic() + 10
    while True:
        after = _counts(_stats(c))
        delta = {k: v - before.get(k, 0) for k, v in after.items()}
        if delta["success"] >= requests or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)


def _classes(answer: dict[str, Any]) -> tuple[list[str], list[float]]:
    """(index:label, score) of a classification answer."""
    parts = [s.split(":", 2) for s in answer["outputs"][0]["data"]]
    return [f"{p[1]}:{p[2]}" for p in parts], [float(p[0]) for p in parts]


def test_errors(both: tuple[httpx.Client, httpx.Client]) -> None:
    x = _images(1)
    ok = _infer_body(x)
    cases = [
        _infer_body(_images(MAX_BATCH + 1)),  # batch-size over max_batch_size
        {**ok, "inputs": [{**ok["inputs"][0], "datatype": "FP64"}]},
        {**ok, "inputs": [{**ok["inputs"][0], "name": "pixels"}]},
        {**ok, "outputs": [{"name": "probs"}]},
        {"inputs": []},
    ]
    for body in cases:
        t, i = _same_status(both, "POST", f"/v2/models/{MODEL}/infer", json=body)
        assert _ask(both[1], "POST", f"/v2/models/{MODEL}/infer", json=body)[0] == 400
    tb, ib = _same_status(both, "POST", f"/v2/models/{MODEL}/infer", json=cases[0])
    assert "batch-size must be <= 8" in tb["error"] and "batch-size must be <= 8" in ib["error"]
    for path in ("/v2/models/nope/infer", f"/v2/models/{MODEL}/versions/3/infer"):
        _same_status(both, "POST", path, json=ok)  # 404 both
    _same_status(both, "GET", "/v2/models/nope/stats")  # 400 both
    for body, deliberate in ((b"{bad", "malformed JSON"), (b'{"inputs": [{"name": "images", "datatype": "FP32", '
                             b'"shape": [1, 3, 32, 32], "data": [0]}]}', "data count")):
        (ts, _), (irs, _) = (_ask(c, "POST", f"/v2/models/{MODEL}/infer", content=body) for c in both)
        assert (ts, irs) == (500, 400), deliberate
    nan = _infer_body(x)
    nan["inputs"][0]["data"][0] = "NaN"
    raw = re.sub(rb'"NaN"', b"NaN", httpx.Request("POST", "/", json=nan).content)
    (ts, _), (irs, _) = (_ask(c, "POST", f"/v2/models/{MODEL}/infer", content=raw) for c in both)
    assert (ts, irs) == (200, 400)  # NaN


def test_repository(both: tuple[httpx.Client, httpx.Client]) -> None:
    t, i = _same_status(both, "POST", "/v2/repository/index")
    assert t == i == [{"name": MODEL, "version": "1", "state": "READY"}]
    for path in (f"/v2/repository/models/{MODEL}/load", f"/v2/repository/models/{MODEL}/unload",
                 "/v2/repository/models/nope/unload", "/v2/repository/models/nope/load"):
        t, i = _same_status(both, "POST", path)  # 503 both: not --model-control explicit
        assert "explicit model load / unload is not allowed" in t["error"] and t["error"] in i["error"]


def test_trace_logging_and_cuda_shm(both: tuple[httpx.Client, httpx.Client]) -> None:
    for path in ("/v2/trace/setting", f"/v2/models/{MODEL}/trace/setting", "/v2/logging",
                 "/v2/cudasharedmemory/status", "/v2/systemsharedmemory/status"):
        t, i = _same_status(both, "GET", path)
        assert t == i, path


@pytest.fixture
def region() -> Iterator[tuple[str, Any]]:
    with client_shm_region("i30p") as made:
        yield made


def test_system_shared_memory(both: tuple[httpx.Client, httpx.Client], region: tuple[str, Any]) -> None:
    key, handle = region
    x = _images(2, seed=9)
    shm.set_shared_memory_region(handle, [x])
    base = "/v2/systemsharedmemory"
    try:
        _same_status(both, "POST", f"{base}/region/io/register", json={"key": key, "offset": 0, "byte_size": 65536})
        _same_status(both, "POST", f"{base}/region/io/register", json={"key": key, "offset": 0, "byte_size": 8})
        t, i = _same_status(both, "GET", f"{base}/status")
        assert t == i == [{"name": "io", "key": key, "offset": 0, "byte_size": 65536}]
        _same_status(both, "GET", f"{base}/region/nope/status")  # 404 both
        for params in ({"shared_memory_region": "nope", "shared_memory_byte_size": x.nbytes},
                       {"shared_memory_region": "io", "shared_memory_byte_size": x.nbytes,
                        "shared_memory_offset": 65536 - 8},
                       {"shared_memory_region": "io", "shared_memory_byte_size": x.nbytes - 4}):
            body = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [2, 3, 32, 32], "parameters": params}]}
            _same_status(both, "POST", f"/v2/models/{MODEL}/infer", json=body)
        results = []
        for n, c in enumerate(both):
            out = {"name": "logits", "parameters": {"shared_memory_region": "io", "shared_memory_byte_size": 80,
                                                    "shared_memory_offset": 32768 + 128 * n}}
            body = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [2, 3, 32, 32],
                                "parameters": {"shared_memory_region": "io", "shared_memory_byte_size": x.nbytes}}],
                    "outputs": [out]}
            status, answer = _ask(c, "POST", f"/v2/models/{MODEL}/infer", json=body)
            assert status == 200 and answer["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [2, 10]}]
            results.append(shm.get_contents_as_numpy(handle, np.float32, [2, 10], offset=32768 + 128 * n))
        np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-5)
        for body in ({"key": key, "offset": 0, "byte_size": 1 << 20}, {"key": key, "offset": 0, "byte_size": 0},
                     {"key": "/../etc/passwd", "offset": 0, "byte_size": 8}):
            (ts, _), (irs, _) = (_ask(c, "POST", f"{base}/region/bad/register", json=body) for c in both)
            assert (ts, irs) == (500, 400), body  # shm client errors
    finally:
        for c in both:
            c.post(f"{base}/unregister")
    _same_status(both, "POST", f"{base}/region/never/unregister")
    t, i = _same_status(both, "GET", f"{base}/status")
    assert t == i == []


_NV = re.compile(r'^(nv_inference_[a-z_]+)\{(.*)\} ([0-9.e+]+)$', re.M)


def _nv(text: str) -> dict[tuple[str, str], float]:
    """{(family, sorted labels): value} of the nv_inference_* samples of MODEL."""
    out = {}
    for family, labels, value in _NV.findall(text):
        pairs = sorted(re.findall(r'(\w+)="([^"]*)"', labels))
        if ("model", MODEL) in pairs:
            out[(family, ",".join(f"{k}={v}" for k, v in pairs))] = float(value)
    return out


def test_metrics(both: tuple[httpx.Client, httpx.Client], triton: TritonServer) -> None:
    """The same families and labels; the same counts for the same requests (durations: each server's own)."""
    def scrape() -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        return (_nv(httpx.get(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=30).text),
                _nv(both[1].get("/metrics").text))

    def traffic(*sizes: int) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        before = scrape()
        for n in sizes:
            _same_status(both, "POST", f"/v2/models/{MODEL}/infer", json=_infer_body(_images(n)))
        success, deadline = ("nv_inference_request_success", f"model={MODEL},version=1"), time.monotonic() + 10
        while True:  # Triton counts just after answering
            after = scrape()
            t, i = ({k: a[k] - b.get(k, 0) for k in a} for a, b in zip(after, before, strict=True))
            if min(t[success], i[success]) >= len(sizes) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert set(t) == set(i), set(t) ^ set(i)
        return t, i

    t, i = traffic(1, 2)
    counts = {k: v for k, v in t.items() if not k[0].endswith("_us")}
    assert counts == {k: i[k] for k in counts}, (counts, i)
    assert t[("nv_inference_count", f"model={MODEL},version=1")] == 3
    t, i = traffic(3)  # split batches: 3 images are not one of the engine's sizes [1, 2, 4]
    key = ("nv_inference_exec_count", f"model={MODEL},version=1")
    assert (t[key], i[key]) == (1, 2)


GRPC_LINE = re.compile(r"gRPC listening on (\S+:\d+)")
DELIBERATE_GRPC = {
    "unimplemented": "CudaSharedMemoryStatus, LogSettings and TraceSetting are UNIMPLEMENTED over gRPC",
}


def _grpc_answers(address: str) -> dict[str, list[Any]]:
    key = f"/i30p_{uuid.uuid4().hex[:12]}"
    out = subprocess.run([sys.executable, "-m", "tests.server.grpc_parity_client", address, MODEL, key],
                         cwd=Path(__file__).parents[3], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_grpc(triton: TritonServer, irpe: ServerProcess) -> None:
    """The same RPCs through the raw gRPC stub (tests/server/grpc_parity_client.py): the same status codes and
    answers but for the deliberate differences (as over HTTP, and DELIBERATE_GRPC)."""
    m = GRPC_LINE.search(irpe.output())
    assert m, irpe.output()[-2000:]
    t, i = _grpc_answers(triton.grpc_url), _grpc_answers(m.group(1))
    unimplemented = {"cuda_shm_status", "log_settings", "trace_setting"}
    for probe in t:
        want = ("OK", "UNIMPLEMENTED") if probe in unimplemented else (t[probe][0], t[probe][0])
        assert (t[probe][0], i[probe][0]) == want, f"{probe}: Triton {t[probe]} vs irpe {i[probe]}"
    same = {p for p in t if t[p][0] == "OK" and p not in unimplemented} - {
        "server_metadata", "model_metadata", "config", "infer", "shm_infer", "shm_status"}
    for probe in same:
        assert t[probe][1] == i[probe][1], probe
    ts, irs = t["server_metadata"][1], i["server_metadata"][1]
    assert irs["extensions"] == [e for e in ts["extensions"] if e != "sequence"]  # identity, no sequence
    assert {**t["model_metadata"][1], "platform": ""} == {**i["model_metadata"][1], "platform": ""}  # harness
    tc, ic = t["config"][1]["config"], i["config"][1]["config"]
    differ = {k for k in set(tc) | set(ic) if tc.get(k) != ic.get(k)}  # proto JSON leaves defaults out
    assert differ <= HARNESS | {"dynamic_batching"}, differ
    assert tc["dynamic_batching"]["preferred_batch_size"] != ic["dynamic_batching"]["preferred_batch_size"]
    for probe in ("infer", "shm_infer"):
        ta, ia = t[probe][1], i[probe][1]
        assert set(ia) - set(ta) == {"id"}  # request id
        assert ta["outputs"] == ia["outputs"]
        np.testing.assert_allclose(ia["raw_output_contents"], ta["raw_output_contents"], rtol=1e-5, atol=1e-5)
    assert t["shm_status"][1]["regions"].keys() == i["shm_status"][1]["regions"].keys() == {"io"}
    assert {k: v for k, v in t["shm_status"][1]["regions"]["io"].items() if k != "key"} == \
        {k: v for k, v in i["shm_status"][1]["regions"]["io"].items() if k != "key"}
