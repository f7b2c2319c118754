"""System shared memory over HTTP against a real ``irpe serve --allow-client-shm`` (one process and --frontends 1),
driven by tritonclient and its ``tritonclient.utils.shared_memory`` regions: the same logits as a plain request,
clear 4xx for unknown regions, out-of-range offsets and oversize regions, nothing written outside a region; and
off by default (403 naming the flag)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.reliability.procs import ServerProcess, serving
from tests.server.helpers import client_shm_region

triton = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODEL = "tiny-mean"


@pytest.fixture(scope="module", params=["0", "1"], ids=["one-process", "frontends-1"])
def server(request: pytest.FixtureRequest, tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, "--allow-client-shm", "--max-shm-regions", "3", "--max-shm-region-mb", "1",
                 "--frontends", request.param) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def region() -> Iterator[tuple[str, object]]:
    with client_shm_region("i30t") as made:
        yield made


def _images(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 3, 32, 32), dtype=np.float32)


def _status(call: object) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as e:
        call()  # type: ignore[operator]
    return e.value.status(), str(e.value)


def test_shared_memory_inference_matches_a_plain_one(client: triton.InferenceServerClient,
                                                     region: tuple[str, object]) -> None:
    key, handle = region
    x = _images(3)
    shm.set_shared_memory_region(handle, [x], offset=1024)
    client.register_system_shared_memory("io", key, 64 * 1024)
    assert client.get_system_shared_memory_status() == [{"name": "io", "key": key, "offset": 0,
                                                          "byte_size": 64 * 1024}]
    inp = triton.InferInput("images", list(x.shape), "FP32")
    inp.set_shared_memory("io", x.nbytes, offset=1024)
    out = triton.InferRequestedOutput("logits")
    out.set_shared_memory("io", 3 * 10 * 4, offset=48 * 1024)
    r = client.infer(MODEL, [inp], outputs=[out])
    assert r.get_response()["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [3, 10]}]
    got = shm.get_contents_as_numpy(handle, np.float32, [3, 10], offset=48 * 1024)
    plain = triton.InferInput("images", list(x.shape), "FP32")
    plain.set_data_from_numpy(x)
    want = client.infer(MODEL, [plain]).as_numpy("logits")
    np.testing.assert_array_equal(got, want)
    after = shm.get_contents_as_numpy(handle, np.uint8, [64], offset=48 * 1024 + 120)
    assert not after.any()  # nothing written past the 120 bytes of logits


def test_bad_regions_are_clear_4xx(client: triton.InferenceServerClient, region: tuple[str, object]) -> None:
    key, handle = region
    x = _images(1)
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory("small", key, x.nbytes)
    assert _status(lambda: client.register_system_shared_memory("small", key, 16))[0] == "400"  # already in manager
    code, text = _status(lambda: client.register_system_shared_memory("big", key, 2 << 20))
    assert code == "400" and "1048576" in text  # over --max-shm-region-mb 1
    code, text = _status(lambda: client.register_system_shared_memory("past", key, 1024, offset=64 * 1024 - 8))
    assert code == "400" and "exceeds" in text
    assert _status(lambda: client.register_system_shared_memory("esc", "/../etc/passwd", 8))[0] == "400"
    assert _status(lambda: client.get_system_shared_memory_status("nope"))[0] == "404"
    for name, size, offset, want in (("nope", x.nbytes, 0, "404"), ("small", x.nbytes, 4, "400"),
                                     ("small", x.nbytes - 4, 0, "400")):
        inp = triton.InferInput("images", [1, 3, 32, 32], "FP32")
        inp.set_shared_memory(name, size, offset=offset)
        code, text = _status(lambda i=inp: client.infer(MODEL, [i]))
        assert code == want, text
    out = triton.InferRequestedOutput("logits")
    out.set_shared_memory("small", 8)  # too small for 40 bytes of logits
    plain = triton.InferInput("images", [1, 3, 32, 32], "FP32")
    plain.set_data_from_numpy(x)
    code, text = _status(lambda: client.infer(MODEL, [plain], outputs=[out]))
    assert code == "400" and "at least 40 bytes" in text
    client.register_system_shared_memory("b", key, 8)
    client.register_system_shared_memory("c", key, 8)
    code, text = _status(lambda: client.register_system_shared_memory("d", key, 8))
    assert code == "400" and "already 3" in text
    client.unregister_system_shared_memory("nope")  # no error, as in Triton
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_off_by_default(tiny_artifact: Path, region: tuple[str, object]) -> None:
    with serving(tiny_artifact) as server:
        r = httpx.post(f"{server.url}/v2/systemsharedmemory/region/r/register",
                       json={"key": region[0], "offset": 0, "byte_size": 8})
        assert r.status_code == 403 and "--allow-client-shm" in r.json()["error"]
        assert httpx.get(f"{server.url}/v2/systemsharedmemory/status").json() == []
        assert "system_shared_memory" in httpx.get(f"{server.url}/v2").json()["extensions"]


def test_triton_metrics_in_both_layouts(server: ServerProcess, client: triton.InferenceServerClient) -> None:
    """nv_inference_* comes from the batcher's statistics, also when it lives in the engine process."""
    x = _images(2)
    plain = triton.InferInput("images", list(x.shape), "FP32")
    plain.set_data_from_numpy(x)
    client.infer(MODEL, [plain])
    stats = client.get_inference_statistics(MODEL)["model_stats"][0]
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    labels = f'{{model="{MODEL}",version="1"}}'
    values = {ln.split("{")[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
              if ln.startswith("nv_inference_") and ln.split("{", 1)[1].startswith(labels[1:])}
    assert values["nv_inference_count"] == stats["inference_count"] >= 2
    assert values["nv_inference_exec_count"] == stats["execution_count"] >= 1
    assert values["nv_inference_request_success"] == stats["inference_stats"]["success"]["count"] >= 1
    assert 'nv_inference_request_failure{reason="REJECTED",' in text
